"""A required test uses required features only (docs/spec-readings.md R-REFUSAL).

1. The suites: every valid call (oracle answer OK) of every *required* test, run against
   the bundled reference with a recording plugin, uses no optional feature beyond the
   test's declared ``feature`` (and what that feature needs). Allowed exceptions are
   listed in ``COMBINED`` with their reason; the engine scenarios and the generated tests
   excuse refusals case by case and are covered by part 2 or by their own design.
2. The generators: cases drawn for the generated and differential tests with the
   profile of required features alone (``generators.profile_for({core layout})``) use no
   optional feature; with one optional feature F added, nothing beyond F.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from kvx_conformance.cases import build as cb, generators as gen, strategies as strat
from kvx_conformance.cases.checks import refusable_features
from kvx_conformance.cases.served import PROBED

HERE = Path(__file__).parent
#: a declared feature that needs another one
IMPLIED = {"secondary_pool": {"kv_offsets"}, "scale_strides": {"fp8"}}
#: required tests whose cases combine features on purpose: id pattern -> reason
COMBINED = {
    r"layout\.hnd_packed_pack16_fp8\[.*\]": "vLLM's FP8 cache: pack 16 (hnd_packed) is the layout of 1-byte FP8 caches (fp8); "
                                           "excused unless both are claimed",
    r"fp8\.write\.mixed_formats\[.*\]": "an E4M3 K cache beside an E5M2 V cache: K and V dtypes differ (mixed_layouts) "
                                      "in an FP8 cache (fp8); excused unless both are claimed",
    r"layout\.mixed_k_v\[.*vllm_packed_k_transposed_v\]":
        "vLLM's cache is a packed K (HND_PACKED) beside a transposed V (non-canonical strides)",
    r"layout\.mixed_k_v\.io_convert\[.*\]":
        "K and V that differ, written / gathered through F32 IO: mixed_layouts with mixed_io_dtype "
        "(excused unless both are claimed)",
    r"layout\.padded_rows\[.*hnd_packed.*\]": "padding of an HND_PACKED cache needs HND_PACKED",
    r"(write\.prefill_batch(_sentinel|_sentinel_convert|_65600)?|gather\.decode_batch|concurrency\.threads\.layouts|"
    r"shapes\.layouts|shapes\.prefill_wide_blocks|write\.slots\.block_size_non_pow2_layouts|"
    r"gather\.packed\.block_size_non_pow2_layouts)\[.*hnd_packed.*\]":
        "the engine-sized batches, the thread tests, the shape extremes, the prefills into blocks past 256 tokens "
        "and the blocks of no power of two run in "
        "each cache layout: their "
        "HND_PACKED case is that layout's (hnd_packed), excused as the case's own optional feature unless claimed "
        "(the converting sentinel batch: with mixed_io_dtype, excused unless both are claimed)",
    r"matrix\..*\[.*(hnd_packed|e4m3|e5m2).*\]":
        "the matrix crosses every layout with every cache dtype and table format: a case's HND_PACKED layout, "
        "FP8 dtype or table is its own optional feature, excused unless claimed",
    r"gather\.packed\.output_4d_sequence_stride(_batch\[.*\])?": "a 4-D output with its own sequence stride is a "
                                                                  "4-D output (gather_4d) with non-dense strides "
                                                                  "(io_strides), in a decode batch too",
}
#: profiles whose tests excuse a refusal per case (engine scenarios) or draw what the provider
#: served (generated: part 2 audits the generators)
PER_CASE = {"engines", "generated"}


@pytest.fixture(scope="module")
def audit(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("audit") / "calls.jsonl"
    env = {**os.environ, "KVX_FEATURE_AUDIT": str(out), "PYTHONPATH": str(HERE) + os.pathsep +
           os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "kvx_conformance.plugin", "-p", "feature_audit_plugin",
           "-p", "no:cacheprovider", "--kvx-hypothesis-examples", "3", "--kvx-progress", "none",
           "-o", "addopts=", "--pyargs", "kvx_conformance.suites"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(HERE), timeout=600)
    assert out.exists(), f"the audit run recorded nothing (exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-2000:]}"
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_required_tests_use_only_their_declared_feature(audit):
    assert len(audit) > 300, f"only {len(audit)} valid calls recorded"
    bad: dict[str, set[str]] = {}
    for r in audit:
        if r["level"] != "required" or r["profile"] in PER_CASE:
            continue
        if any(re.fullmatch(p, r["id"]) for p in COMBINED):
            continue
        declared = r["declared"]
        allowed = ({declared} | IMPLIED.get(declared, set())) if declared else set()
        extra = set(r["features"]) - allowed
        if extra:
            bad.setdefault(r["id"], set()).update(extra)
    assert not bad, "required tests whose valid cases use optional features they do not declare:\n" + "\n".join(
        f"  {k}: {sorted(v)}" for k, v in sorted(bad.items()))
    ids = {r["id"] for r in audit}
    for pattern in COMBINED:  # every exception still names a test
        assert any(re.fullmatch(pattern, i) for i in ids), f"COMBINED entry {pattern!r} matches no test any more"


def test_per_case_tests_pass_the_case_features(audit):
    """Engine and generated tests do not declare a feature but hand each case's features to
    the checks, so that a refusal of an unclaimed one is excused, never failed."""
    for r in audit:
        if r["level"] == "required" and r["profile"] in PER_CASE and r["features"]:
            assert r["passed"], f"{r['id']}: a case using {r['features']} was checked with no feature to excuse it"


SETTINGS = settings(max_examples=150, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])
CORES = ("nhd", "hnd")


def _allowed(features) -> set[str]:
    out = set(features)
    for f in features:
        out |= IMPLIED.get(f, set())
    return out


@pytest.mark.parametrize("kind", ["write", "gather", "validate"])
@pytest.mark.parametrize("core", CORES)
def test_required_profile_draws_no_optional_feature(kind, core):
    prof = gen.profile_for({core})
    strategy = {"write": strat.write_cases, "gather": strat.gather_cases, "validate": strat.validate_cases}[kind]

    @SETTINGS
    @given(drawn=strategy(profile=prof))
    def check(drawn):
        assert refusable_features(drawn.case, core=core) == (), f"{drawn!r}: {cb.case_features(drawn.case)}"

    check()


@pytest.mark.parametrize("feature", [f for f in PROBED if f not in CORES])
@pytest.mark.parametrize("kind", ["write", "gather"])
def test_one_served_feature_draws_nothing_else(kind, feature):
    feats = {"nhd", feature} | IMPLIED.get(feature, set())
    prof = gen.profile_for(feats)
    strategy = {"write": strat.write_cases, "gather": strat.gather_cases}[kind]

    @settings(SETTINGS, max_examples=60)
    @given(drawn=strategy(profile=prof))
    def check(drawn):
        extra = set(cb.case_features(drawn.case)) - _allowed(feats)
        assert not extra, f"{drawn!r} uses {sorted(extra)} beyond {sorted(feats)}"

    check()


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("op", ["write", "gather"])
def test_differential_draws_with_the_profile(op, core):
    """The differential tests' unconstrained generator calls follow the profile too."""
    fn = gen.random_write_case if op == "write" else gen.random_gather_case
    with gen.using_profile(gen.profile_for({core})):
        for seed in range(7000, 7048):
            case = fn(np.random.default_rng(seed), seed=seed)
            assert refusable_features(case, core=core) == (), f"seed {seed}: {cb.case_features(case)}"


def test_profile_of_every_feature_is_the_full_profile():
    """A provider that serves everything (the reference) is drawn from exactly as before."""
    full = gen.profile_for(set(PROBED))
    assert full.layout_kinds == gen.FULL.layout_kinds and full.io_kinds == gen.FULL.io_kinds
    assert full.cache_dtypes == gen.FULL.cache_dtypes and full.formats == gen.FULL.formats
    assert full.four_d and full.mixed_kv and full.mixed_io and full.noncanonical and full.secondary
