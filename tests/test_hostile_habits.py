"""Providers that are correct except for one habit, and the harness's answer to each.

- inputs changed by a call: ``buffers.input_change`` names the buffer and the first
  changed element; the executor reports it for every call (``Result.input_changes``);
- a chatty provider (megabytes on stderr and stdout at load and in every call): the
  preflight drains it, probes every struct size, warns of nothing, and the run certifies;
- a provider that exits with status 0 inside a call: a crash, with its exit status;
- a flaky provider (csrc/testing FLAKY: wrong in every other process): ``--reruns``
  records ``flaky`` with the tally, which blocks; a deterministic failure stays ``fail``
  and is counted once.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvx_conformance.abi import native
from kvx_conformance.abi.buffers import input_change
from kvx_conformance.harness.preflight import run_preflight
from kvx_conformance.results.claims import Claims
from kvx_conformance.results.record import TestRecord, merge_attempts, summarize

sys.path.insert(0, str(Path(__file__).parent))
from schema_doc import undocumented  # noqa: E402


def _lib(kind: str, name: str) -> str:
    path = native.mutant_provider(name) if kind == "mutant" else native.testing_provider(name)
    if not path.exists():
        pytest.fail(f"{path} is not built: the package build must produce it")
    return str(path)


def _kvx(*args: str, env: dict | None = None, timeout: float = 400) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("kvx-conform")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "kvx_conformance.cli"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _explain(p) -> str:
    return f"exit {p.returncode}\n--- stdout\n{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-2000:]}"


# ----------------------------------------------------------------------------- inputs


def test_input_change_names_first_element():
    before = np.array([3, 18, -1, 8], np.int64)
    assert input_change("slots", before, before.view(np.uint8).copy()) is None
    after = before.copy()
    after[1:] = -1
    line = input_change("slots", before, after.view(np.uint8))
    assert line == "slots: 2 of 4 element(s) changed by the call; first at element 1: 18 before, -1 after"
    key = np.array([1.5, -2.0], np.float16)
    zeroed = key.copy()
    zeroed[1] = 0
    line = input_change("key", key, zeroed.view(np.uint8))
    assert "key: 1 of 2 element(s)" in line and "element 1: -2 (0xc000) before, 0 (0x0000) after" in line


@pytest.mark.parametrize("mutant,test,buffer", [
    ("modifies_input_key", "write", "key"),
    ("modifies_slots", "write", "slots"),
])
def test_executor_reports_changed_inputs(mutant, test, buffer):
    """The comparison after the call (what device and unified memory rely on; host inputs are
    also read-only pages during the call, off here so the mutant's store lands)."""
    from kvx_conformance.cases import build as cb
    from kvx_conformance.cases.checks import check_inputs
    from kvx_conformance.cases.execute import CallOptions, run_write
    from kvx_conformance.abi.loader import load_provider
    from kvx_conformance.results.outcomes import ConformanceFailure

    prov = load_provider(_lib("mutant", mutant))
    case = cb.write_case(cb.simple_cache(cb.GEOM, "nhd", cb.DType.F16, seed=1), [3, 5, 9], seed=2)
    got = run_write(prov, case, CallOptions(seal_inputs=False))
    assert [c.split(":")[0] for c in got.input_changes] == [buffer], got.input_changes
    with pytest.raises(ConformanceFailure, match="modified an input it may only read"):
        check_inputs(got, case=case)
    ref = run_write(load_provider(native.reference_provider()), case)
    assert ref.input_changes == [] and ref.guard_violations == []


# ----------------------------------------------------------------------------- preflight


def test_chatty_provider_preflight_probes_everything():
    info = run_preflight(_lib("testing", "chatty"), timeout=30)
    assert info.warnings == [], info.warnings
    assert info.abi_version and info.version_size_set == 16
    for entry in ("kvx_get_version", "kvx_validate_cache_desc", "kvx_write_kv", "kvx_gather_kv"):
        fields = info.struct_sizes[entry]["fields"]
        assert fields and all(f["accepts_from"] == f["header"] for f in fields), (entry, fields)


def test_exit_inside_a_probe_is_a_crash():
    info = run_preflight(_lib("testing", "exit0_on_write"), timeout=30)
    assert "preflight: provider crashed (exited with status 0) while probing kvx_write_kv" in info.warnings
    assert info.struct_sizes["kvx_write_kv"]["error"] == "crashed (exited with status 0)"
    assert info.struct_sizes["kvx_gather_kv"]["fields"], "the probe goes on without the entry point"


def test_chatty_provider_certifies(tmp_path):
    out = tmp_path / "out"
    p = _kvx("run", _lib("testing", "chatty"), "--profile", "core", "-n", "2", "--output-dir", str(out),
             "--progress", "none", "--memory", "host")
    assert p.returncode == 0, _explain(p)
    doc = json.loads((out / "results.json").read_text())
    assert doc["verdict"] == "certified" and doc["profiles"]["core"]["verdict"] == "certified"
    assert not doc["provider"]["preflight_warnings"]


def test_exit0_provider_not_certified(tmp_path):
    out = tmp_path / "out"
    p = _kvx("run", _lib("testing", "exit0_on_write"), "--profile", "core", "-n", "1", "--reruns", "0",
             "--output-dir", str(out), "--progress", "none", "--memory", "host")
    assert p.returncode == 1, _explain(p)
    assert "crashed (exited with status 0) while probing kvx_write_kv" in p.stdout
    doc = json.loads((out / "results.json").read_text())
    crashes = [t for t in doc["tests"] if t["outcome"] == "crash"]
    assert crashes and all("kvx_write_kv" in t["entry"] for t in crashes)
    assert doc["verdict"] == "not certified"


# ----------------------------------------------------------------------------- re-runs


def _rec(outcome: str, level: str = "required", **kw) -> TestRecord:
    return TestRecord(id=kw.pop("id", "t"), nodeid="n", clause="c", level=level, profile="core",
                      entry=["kvx_write_kv"], feature=None, outcome=outcome, **kw)


def test_merge_attempts():
    same = merge_attempts(_rec("fail", message="m1"), [_rec("fail"), _rec("fail")])
    assert same.outcome == "fail" and same.tally == {"fail": 3} and same.message == "m1"
    flaky = merge_attempts(_rec("fail", message="bad", seed=7), [_rec("pass"), _rec("skip")])
    assert flaky.outcome == "flaky" and flaky.attempts == ["fail", "pass"] and flaky.tally == {"fail": 1, "pass": 1}
    assert flaky.seed == 7 and "1 fail, 1 pass" in flaky.message and "bad" in flaky.message
    late = merge_attempts(_rec("crash", message="down"), [_rec("crash"), _rec("fail", message="wrong")])
    assert late.outcome == "flaky" and late.tally == {"crash": 2, "fail": 1}


def test_flaky_blocks_required_and_warns_recommended():
    kw = dict(quick=False, partial=False, complete=True)
    req = summarize([_rec("pass", id="a"), _rec("flaky", id="b")], Claims(), [], **kw)
    assert req["verdict"] == "not certified" and req["profiles"]["core"]["blocking"] == ["b"]
    assert req["counts"]["flaky"] == 1 and req["counts"]["pass"] == 1
    rec = summarize([_rec("pass", id="a"), _rec("flaky", level="recommended", id="b")], Claims(), [], **kw)
    assert rec["verdict"] == "certified" and rec["profiles"]["core"]["warnings"] == ["b"]


def test_flaky_provider_rerun_records_flaky(tmp_path):
    counter = tmp_path / "counter"
    out = tmp_path / "out"
    p = _kvx("run", _lib("testing", "flaky"), "--id", "write.slots.valid*", "--id", "gather.packed.basic*",
             "-n", "1", "--output-dir", str(out), "--progress", "none", "--memory", "host",
             env={"KVX_TESTING_FLAKY_FILE": str(counter)})
    assert p.returncode == 1, _explain(p)
    doc = json.loads((out / "results.json").read_text())
    by = {t["id"]: t for t in doc["tests"]}
    for tid in ("write.slots.valid[s32]", "write.slots.valid[s64]"):
        t = by[tid]
        assert t["outcome"] == "flaky", t
        assert t["attempts"] == ["fail", "pass"] and t["tally"] == {"fail": 1, "pass": 1}
        assert t["failure"]["got"] == "INTERNAL_ERROR" and t["repro"]
    assert all(t["outcome"] == "pass" and t["attempts"] is None for i, t in by.items() if i.startswith("gather"))
    assert doc["counts"]["flaky"] == 2 and doc["counts"]["pass"] == 4 and len(doc["tests"]) == 6
    assert doc["config"]["reruns"] == 3
    assert undocumented(doc, "results") == []
    assert "FLAKY" in p.stdout and "attempts: 1 fail, 1 pass" in p.stdout
    html = (out / "report.html").read_text()
    assert 'id="flaky"' in html and "write.slots.valid[s32]" in html
    assert 'type="kvx.flaky"' in (out / "junit.xml").read_text()


def test_deterministic_failure_stays_fail_and_counts_once(tmp_path):
    out = tmp_path / "out"
    p = _kvx("run", _lib("mutant", "ignore_strides"), "--id", "layout.padded_rows[write-*", "-n", "1",
             "--reruns", "2", "--output-dir", str(out), "--progress", "none", "--memory", "host")
    assert p.returncode == 1, _explain(p)
    doc = json.loads((out / "results.json").read_text())
    n = len(doc["tests"])  # every padded_rows write case: the mutant writes them all at canonical offsets
    assert n >= 3 and [t["outcome"] for t in doc["tests"]] == ["fail"] * n
    assert all(t["attempts"] == ["fail"] * 3 and t["tally"] == {"fail": 3} for t in doc["tests"])
    assert doc["counts"]["fail"] == n and doc["counts"]["flaky"] == 0
    assert "element(s) differ" in doc["tests"][0]["failure"]["got"]
    assert sorted(p.name for p in (out / "reruns").iterdir()) == ["attempt-1", "attempt-2"]


def test_store_into_an_input_faults_in_its_call(tmp_path):
    """On host memory a call's inputs are read-only pages while it runs: the mutant that
    changes the caller's slots ends the worker inside kvx_write_kv, a crash that says why."""
    out = tmp_path / "out"
    p = _kvx("run", _lib("mutant", "modifies_slots"), "--id", "inputs.write.unchanged[*", "-n", "1",
             "--reruns", "0", "--output-dir", str(out), "--progress", "none", "--memory", "host")
    assert p.returncode == 1, _explain(p)
    doc = json.loads((out / "results.json").read_text())
    assert [t["outcome"] for t in doc["tests"]] == ["crash", "crash"], _explain(p)
    for t in doc["tests"]:
        assert t["crash"]["entry"] == "kvx_write_kv" and "read-only while it runs" in t["message"], t
