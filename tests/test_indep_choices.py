"""The independent provider's open choices, mixed: csrc/testing/indep/kvx_indep_core.h takes each
choice the spec or the readings leave open as a compile-time switch (``CHOICE_*``). The two shipped
builds set none (``indep``) or all (``contra``) of them (test_host_providers.py); a correct provider
may take any mix, so a build with a few of them must certify too.

Built here with the C compiler (skipped without one) and run in full once (about 25 s on 2 cores):

- ``CHOICE_HND_ONLY`` + ``CHOICE_REFUSE_INVALID``: HND its only core layout, its NHD caches refused
  with INVALID_ARGUMENT (spec 8: "Malformed descriptor or unsupported field"; docs/spec-readings.md
  R-REFUSAL) by ``kvx_validate_cache_desc`` as well as by writes and gathers. Either switch alone
  certified; together they once failed two informational validation tests
  (``validate.negative_stride`` built its cache NHD whatever the provider's core layout,
  ``validation.rule[R-CACHE.stride_negative]``'s validation was not read as the refusal of the NHD
  cache it uses), where the contrarian, which also validates every valid cache OK
  (``CHOICE_VALIDATE_RULES_ONLY``), never reached them.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "csrc" / "testing" / "indep" / "kvx_indep_core.h"
CC = shutil.which("gcc") or shutil.which("cc")

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler")


def _kvx() -> list[str]:
    script = Path(sys.executable).with_name("kvx-conform")
    return [str(script)] if script.exists() else [sys.executable, "-m", "kvx_conformance.cli"]


def _build(tmp: Path, name: str, switches: tuple[str, ...]) -> Path:
    """The core with ``switches`` set, compiled as csrc/testing's CMake builds the shipped ones."""
    src = tmp / f"{name}.c"
    src.write_text("".join(f"#define CHOICE_{s} 1\n" for s in switches) + f'#include "{CORE}"\n', encoding="utf-8")
    lib = tmp / f"lib{name}.so"
    p = subprocess.run([CC, "-O2", "-shared", "-fPIC", "-std=gnu11", "-Wall", "-Wextra", "-Werror",
                        f"-I{ROOT / 'csrc' / 'include'}", "-o", str(lib), str(src), "-lm"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return lib


def _claims(tmp: Path, name: str, drop: set[str]) -> Path:
    """indep's claims less the features the build refuses (a claims file claims what it serves)."""
    doc = json.loads((ROOT / "csrc" / "testing" / "indep" / "kvx-claims.json").read_text(encoding="utf-8"))
    doc["features"] = [f for f in doc["features"] if f not in drop]
    doc["provider"] = f"indep core, {name}"
    path = tmp / f"claims-{name}.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_hnd_only_refusing_with_invalid_argument_certified(tmp_path):
    """HND_ONLY + REFUSE_INVALID, nhd not claimed: CERTIFIED, no test fails at any level, and every
    refusal is excused by a feature it does not claim."""
    unclaimed = {"nhd"}
    lib = _build(tmp_path, "hnd_only_invalid", ("HND_ONLY", "REFUSE_INVALID"))
    out = tmp_path / "run"
    p = subprocess.run([*_kvx(), "run", str(lib), "--claims", str(_claims(tmp_path, "hnd_only_invalid", unclaimed)),
                        "--output-dir", str(out), "-n", "2", "--progress", "none"],
                       capture_output=True, text=True, timeout=600)
    assert (out / "results.json").exists(), f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-2000:]}"
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    bad = {t["id"]: (t["level"], t["outcome"], (t["message"] or "")[:300]) for t in doc["tests"]
           if t["outcome"] not in ("pass", "skip", "unsupported")}
    assert not bad, bad
    assert p.returncode == 0 and doc["verdict"] == "certified", (p.returncode, doc["verdict"], p.stdout[-3000:])
    # indep refuses a non-zero unknown tail (its claims' notes); NHD is the build's own refusal
    allowed = unclaimed | {"nonzero_tail"}
    for t in doc["tests"]:
        if t["outcome"] == "unsupported":
            assert set(t["message"].split("(", 1)[1].split(")", 1)[0].split(", ")) <= allowed, t
    assert any(t["outcome"] == "unsupported" and t["message"].startswith("INVALID_ARGUMENT (nhd)")
               for t in doc["tests"])  # the switches took: NHD refused with INVALID_ARGUMENT
    by_id = {t["id"]: t for t in doc["tests"]}
    assert by_id["validate.negative_stride"]["outcome"] == "pass", by_id["validate.negative_stride"]
    # The INVALID_ARGUMENT an NHD case of a rule expects is also this build's answer to any NHD cache: it
    # does not show the rule, so no pass (checks._refusal_not_rule); the HND form shows it and passes.
    for kind, outcome in (("nhd", "unsupported"), ("hnd", "pass")):
        for dim in range(4):
            t = by_id[f"validate.shape_mismatch[{kind}-k-dim{dim}]"]
            assert t["outcome"] == outcome, t
            if outcome == "unsupported":
                assert t["refusal"] == "INVALID_ARGUMENT" and "does not show the rule" in t["message"], t
    # the order tests' cases are drawn again in HND, where the order is shown (they would read
    # unsupported, as above, in the catalog's NHD draw)
    order = [t for i, t in by_id.items() if i.startswith("validation.order.descriptor_before_data[")]
    assert len(order) == 9 and all(t["outcome"] == "pass" for t in order), order


#: A provider that serves HND alone and forgets two rules there: the HND-only build above, whose
#: kvx_validate_cache_desc and kvx_write_kv are wrapped so that a cache of HND K and V with a zero
#: stride, and a write into an HND FP4 cache whose head_dim is no multiple of 16, are answered OK.
_FORGETS_ZERO_STRIDE = r"""
#define KVX_ABI_TARGET_MINOR 2 /* the 1.2 cache struct, as the core */
#include <stddef.h>
#include "kvx/kvx_abi.h"
kvx_status_t core_validate_cache_desc(const kvx_cache_desc_t* cache);
kvx_status_t core_write_kv(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream);
static int hnd_zero_stride(const kvx_cache_desc_t* cache) {
  if (!cache || cache->size < offsetof(kvx_cache_desc_t, pool) || cache->k.layout != KVX_LAYOUT_BLOCK_HND ||
      cache->v.layout != KVX_LAYOUT_BLOCK_HND)
    return 0;
  for (uint32_t i = 0; i < cache->k.ndim && i < KVX_MAX_TENSOR_DIMS; ++i)
    if (cache->k.stride[i] == 0 || cache->v.stride[i] == 0) return 1;
  return 0;
}
KVX_API kvx_status_t kvx_validate_cache_desc(const kvx_cache_desc_t* cache) {
  return hnd_zero_stride(cache) ? KVX_STATUS_OK : core_validate_cache_desc(cache);
}
/* and an HND FP4 cache whose head_dim is not a multiple of the block size */
static int hnd_fp4_odd_head_dim(const kvx_cache_desc_t* cache) {
  return cache && cache->size >= sizeof(*cache) && cache->k.dtype == KVX_DTYPE_F4_E2M1 &&
         cache->k.layout == KVX_LAYOUT_BLOCK_HND && cache->head_dim % 16u != 0;
}
KVX_API kvx_status_t kvx_write_kv(const kvx_cache_desc_t* cache, const kvx_write_desc_t* desc, void* stream) {
  return hnd_zero_stride(cache) || hnd_fp4_odd_head_dim(cache) ? KVX_STATUS_OK : core_write_kv(cache, desc, stream);
}
"""


def test_rules_tested_in_the_layout_served(tmp_path):
    """``validation.rule[R-CACHE.stride_zero]`` draws a write whose K and V are NHD and HND, and
    ``validate.field_invalid[stride_zero]`` and ``fp4.validate.invalid[head_dim_not_multiple]``
    built NHD caches. A provider that serves HND alone refuses those caches with INVALID_ARGUMENT,
    the status the rules expect, so the tests passed without reaching the rules; this one forgets
    them on HND caches. The catalog now draws the rule's case again, from the same seed, in the
    layouts the provider serves (``_in_served_layouts``), and the explicit tests build their caches
    in the provider's core layout: all three fail, and on the unwrapped build all three pass."""
    switches = "#define CHOICE_HND_ONLY 1\n#define CHOICE_REFUSE_INVALID 1\n"
    sources = {"forgets": {"core.c": switches + "#define kvx_validate_cache_desc core_validate_cache_desc\n"
                                     f'#define kvx_write_kv core_write_kv\n#include "{CORE}"\n',
                           "wrap.c": _FORGETS_ZERO_STRIDE},
               "keeps": {"core.c": switches + f'#include "{CORE}"\n'}}
    claims = _claims(tmp_path, "hnd_only_invalid", {"nhd"})
    rules = ("validation.rule[R-CACHE.stride_zero]", "validate.field_invalid[stride_zero]",
             "fp4.validate.invalid[head_dim_not_multiple]")
    outcomes = {}
    for name, files in sources.items():
        paths = []
        for fname, text in files.items():
            paths.append(tmp_path / f"{name}-{fname}")
            paths[-1].write_text(text, encoding="utf-8")
        lib = tmp_path / f"lib{name}.so"
        p = subprocess.run([CC, "-O2", "-shared", "-fPIC", "-std=gnu11", "-Wall", "-Wextra", "-Werror",
                            f"-I{ROOT / 'csrc' / 'include'}", "-o", str(lib), *map(str, paths), "-lm"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-3000:]
        out = tmp_path / f"run-{name}"
        p = subprocess.run([*_kvx(), "run", str(lib), "--claims", str(claims), *[a for r in rules for a in ("--id", r)],
                            "--output-dir", str(out), "-n", "1", "--progress", "none"],
                           capture_output=True, text=True, timeout=300)
        assert (out / "results.json").exists(), f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-2000:]}"
        doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
        got = {t["id"]: t["outcome"] for t in doc["tests"]}
        outcomes[name] = tuple(got.get(r) for r in rules)
    assert outcomes == {"forgets": ("fail",) * 3, "keeps": ("pass",) * 3}, outcomes
