"""Engine-shaped scenario suites (``suites/engine``) and their per-engine summary.

- ``summarize_engines`` (results.json key ``engines``) on hand-made records: yes / no /
  partly / not run, adapter refusals kept apart, families named in ``where_not``;
- the HTML report's "Engines" section;
- the suites run on the bundled reference (every scenario passes, every engine
  "yes", refusals recorded as not expressible) and on two mutants of it
  (``ignore_strides``: canonical strides instead of the given ones;
  ``hnd_as_nhd``: BLOCK_HND addressed as NHD), where the engine verdict flips to
  "no" and names the scenarios that fail;
- the suites on examples/minimal_provider (NHD/HND + PACKED only, UNSUPPORTED for the
  rest): "partly", with the unserved families named and nothing failing.

The suites run in a pytest subprocess with the kvx plugin writing results.json
(no preflight, so this stays fast). Repro: python -m pytest tests/test_engine_suites.py -k <name>
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvx_conformance.results.engines import NOT_EXPRESSIBLE, engine_of, family_of, summarize_engines
from kvx_conformance.results.record import TestRecord as Record

REPO = Path(__file__).resolve().parents[1]


def rec(id, outcome, message="", level="required", waived=None):
    return Record(id=id, nodeid=f"x::{id}", clause="5.1", level=level, profile="engines", entry=[],
                      feature=None, outcome=outcome, message=message, waived=waived)


# ----------------------------------------------------------------------------- the summary


def test_engine_and_family_of_ids():
    assert engine_of("engine.vllm.paged.decode[llama3_8b]") == "vllm"
    assert engine_of("engine.ppl.cache_mode1.layout2") == "ppl"
    assert engine_of("gather.packed.basic") is None
    assert family_of("engine.vllm.paged.decode[llama3_8b]") == "paged"
    assert family_of("engine.ppl.cache_mode1.layout2") == "cache_mode1"


def test_summary_verdicts():
    tests = [
        rec("engine.vllm.flash_nhd.decode[a]", "pass"),
        rec("engine.vllm.paged.decode[a]", "fail", "memory after the call differs\n  expected: x"),
        rec("engine.vllm.paged.prefill[a]", "crash", "worker crashed"),
        rec("engine.vllm.refused.cache_dtype[int8]", "skip", f"{NOT_EXPRESSIBLE}: int8: no such dtype",
            level="informational"),
        rec("engine.tgi.ragged.mixed[bs1]", "unsupported", "UNSUPPORTED (ragged)"),
        rec("engine.tgi.flashinfer.prefill[a]", "pass"),
        rec("engine.trtllm.kv_offsets.decode[a]", "pass"),
        rec("engine.trtllm.kv_offsets.beam2[a]", "fail", "beams", waived="TICKET-1"),
        rec("engine.flashinfer.nhd.decode[a]", "pass"),
        rec("engine.ppl.refused.quant_bit8", "skip", f"{NOT_EXPRESSIBLE}: quant", level="informational"),
        rec("gather.packed.basic", "fail"),  # not an engine scenario
    ]
    s = summarize_engines(tests)
    assert list(s) == ["vllm", "tgi", "trtllm", "flashinfer", "ppl"], s.keys()
    v = s["vllm"]
    assert v["works"] == "no" and v["passed"] == 1 and v["scenarios"] == 3, v
    assert [f["id"] for f in v["failing"]] == ["engine.vllm.paged.decode[a]", "engine.vllm.paged.prefill[a]"], v
    assert v["failing"][0]["message"] == "memory after the call differs", v
    assert v["where_not"] == ["paged"], v
    assert v["not_expressible"] == [{"id": "engine.vllm.refused.cache_dtype[int8]", "reason": "int8: no such dtype"}], v
    assert s["tgi"]["works"] == "partly" and s["tgi"]["where_not"] == ["ragged"], s["tgi"]
    assert s["trtllm"]["works"] == "no" and s["trtllm"]["failing"][0]["waived"] == "TICKET-1", s["trtllm"]
    assert s["flashinfer"]["works"] == "yes" and s["flashinfer"]["where_not"] == [], s["flashinfer"]
    assert s["ppl"]["works"] == "not run" and s["ppl"]["scenarios"] == 0, s["ppl"]
    assert summarize_engines([rec("write.slots.valid", "pass")]) == {}


def test_report_engines_section(tmp_path):
    from kvx_conformance.report import render_report
    from kvx_conformance.results.record import ResultsWriter

    header = {"harness": {"name": "kvx-conform", "version": "0"},
              "provider": {"path": "/x/libp.so", "sha256": "0" * 64, "abi_version": "1.1.0"},
              "environment": {"python": "3", "machine": "x86_64", "cpu": "cpu", "cpu_count": 2, "torch": None},
              "memory_types": ["host"],
              "config": {"memory": "host", "suites_hash": "0" * 64, "workers": 2, "timeout_s": 30,
                         "hypothesis_max_examples": 100, "seed": None}}
    w = ResultsWriter(tmp_path, header)
    for t in (rec("engine.vllm.paged.decode[a]", "fail", "differs"), rec("engine.tgi.paged.decode[a]", "pass"),
              rec("engine.tgi.refused.negative_slots", "skip", f"{NOT_EXPRESSIBLE}: wraps", level="informational")):
        w.add(t)
    doc = w.close()
    assert doc["engines"]["vllm"]["works"] == "no" and doc["engines"]["tgi"]["works"] == "yes", doc["engines"]
    from kvx_conformance.harness.runner import summary_lines

    console = summary_lines(doc)
    assert "  vLLM         no      0/1 scenarios passed; not in: paged" in console, console
    assert "  TGI          yes     1/1 scenarios passed" in console, console
    html = render_report(doc)
    assert 'id="engines"' in html
    assert 'data-engine="vllm" data-works="no"' in html and 'data-engine="tgi" data-works="yes"' in html
    assert "engine.vllm.paged.decode[a]" in html and "not in: paged" in html
    assert "engine.tgi.refused.negative_slots" in html and "wraps" in html
    # a results file written before the key existed: recomputed from the tests
    del doc["engines"]
    assert 'data-engine="vllm" data-works="no"' in render_report(doc)
    # no engine scenario in the run: no section
    doc["tests"] = [rec("write.slots.valid", "pass").to_dict()]
    assert 'id="engines"' not in render_report(doc)


# ----------------------------------------------------------------------------- the suites on providers


def _provider(name: str | None) -> Path:
    from kvx_conformance.abi import native

    try:
        p = native.reference_provider() if name is None else native.mutant_provider(name)
    except native.NativeBuildMissing as e:
        pytest.skip(str(e))
    if not p.exists():
        pytest.skip(f"native build lacks {p.name} (set KVX_CONFORM_NATIVE_DIR)")
    return p


def run_engine_suites(tmp_path: Path, provider: Path, *ids: str, workers: int = 0) -> tuple[dict, str]:
    """Run suites/engine on ``provider`` (only ``ids`` globs, if given); results.json and the command.

    ``workers``: pytest-xdist workers, for a provider that may crash the process
    (a crash then costs one test, recorded as ``crash``)."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "pytest", "-p", "kvx_conformance.plugin", "-p", "no:cacheprovider", "-q",
           "--pyargs", "kvx_conformance.suites.engine", f"--kvx-provider={provider}", f"--kvx-output-dir={out}",
           "--kvx-progress=none", *(f"--kvx-id={i}" for i in ids)]
    if workers:
        cmd += ["-n", str(workers)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    shown = " ".join(cmd)
    path = out / "results.json"
    assert path.exists(), f"no results.json from: {shown}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return json.loads(path.read_text()), shown


def test_reference_works_with_every_engine(tmp_path):
    doc, cmd = run_engine_suites(tmp_path, _provider(None))
    tests = doc["tests"]
    bad = [(t["id"], t["outcome"], t["message"][:300]) for t in tests if t["outcome"] not in ("pass", "skip")]
    assert not bad, f"engine scenarios not passing on the reference: {bad}\nrepro: {cmd}"
    skips = [t for t in tests if t["outcome"] == "skip"]
    assert skips and all(t["message"].startswith(NOT_EXPRESSIBLE) and t["level"] == "informational"
                         and ".refused." in t["id"] for t in skips), skips
    eng = doc["engines"]
    assert set(eng) == {"vllm", "tgi", "trtllm", "flashinfer", "ppl"}, eng.keys()
    for key, e in eng.items():
        assert e["works"] == "yes" and e["passed"] == e["scenarios"] > 0, (key, e, cmd)
    assert len(tests) >= 50, len(tests)
    ids = {t["id"] for t in tests}
    for want in ("engine.vllm.flash_nhd.decode[llama3_8b]", "engine.vllm.paged.prefill[llama3_8b]",
                 "engine.tgi.ragged.mixed[paged_bs16]", "engine.trtllm.kv_offsets.beam2[llama70b_tp8]",
                 "engine.flashinfer.nhd.decode[h4_d256]", "engine.ppl.cache_mode1.layout2"):
        assert want in ids, (want, sorted(ids))
    assert doc["profiles"]["engines"]["verdict"] == "certified", doc["profiles"]["engines"]


def test_ignore_strides_mutant_flips_engines(tmp_path):
    """Canonical strides instead of the given ones: every engine whose caches are strided views fails."""
    doc, cmd = run_engine_suites(tmp_path, _provider("ignore_strides"), "engine.vllm.paged.decode*",
                                 "engine.vllm.flash_nhd.decode*", "engine.ppl.cache_mode1.layout0",
                                 "engine.tgi.paged.decode*")
    eng = doc["engines"]
    failing = {e: [f["id"] for f in eng[e]["failing"]] for e in eng}
    assert eng["vllm"]["works"] == "no" and "paged" in eng["vllm"]["where_not"], (eng["vllm"], cmd)
    assert "engine.vllm.paged.decode[llama3_8b]" in failing["vllm"], (failing, cmd)
    # canonical NHD caches keep working: the verdict names where, not everything
    assert "engine.vllm.flash_nhd.decode[llama3_8b]" not in failing["vllm"] and eng["vllm"]["passed"] > 0, failing
    assert eng["ppl"]["works"] == "no" and "engine.ppl.cache_mode1.layout0" in failing["ppl"], (eng["ppl"], cmd)
    assert eng["tgi"]["works"] == "no" and "engine.tgi.paged.decode[llama3_8b]" in failing["tgi"], (eng["tgi"], cmd)


def test_hnd_as_nhd_mutant_flips_vllm_hnd(tmp_path):
    """BLOCK_HND addressed as NHD: vLLM's HND-memory flash caches fail (or crash), NHD ones pass."""
    doc, cmd = run_engine_suites(tmp_path, _provider("hnd_as_nhd"), "engine.vllm.flash_hnd.*",
                                 "engine.vllm.flash_nhd.decode*", workers=1)  # it writes out of bounds
    v = doc["engines"]["vllm"]
    failing = [f["id"] for f in v["failing"]]
    assert v["works"] == "no" and v["where_not"] == ["flash_hnd"], (v, cmd)
    assert "engine.vllm.flash_hnd.decode[llama3_8b]" in failing, (failing, cmd)
    assert v["passed"] == v["scenarios"] - len(failing) == 4, (v, cmd)


def test_core_only_provider_partly_works(tmp_path):
    """examples/minimal_provider executes NHD/HND caches and PACKED tables only and answers
    UNSUPPORTED for the rest (HND_PACKED, KV_OFFSETS, ...): the engines it cannot serve
    "partly" work, with the unserved families named and nothing failing."""
    import shutil

    cc = os.environ.get("CC", "cc")
    if shutil.which("make") is None or shutil.which(cc) is None:
        pytest.skip("make / a C compiler not found: the example provider cannot be built here")
    build = subprocess.run(["make", "-C", str(REPO / "examples" / "minimal_provider"), f"OUT={tmp_path / 'lib'}",
                            f"KVX_INCLUDE={REPO / 'csrc' / 'include'}"], capture_output=True, text=True, timeout=120)
    lib = tmp_path / "lib" / "libkvx_minimal.so"
    assert build.returncode == 0 and lib.exists(), f"make failed:\n{build.stdout}\n{build.stderr}"
    doc, cmd = run_engine_suites(tmp_path, lib, "engine.trtllm.kv_offsets.*", "engine.vllm.paged.decode*",
                                 "engine.vllm.flash_nhd.decode*")
    eng = doc["engines"]
    assert not any(e["failing"] for e in eng.values()), ({k: e["failing"] for k, e in eng.items()}, cmd)
    t, v = eng["trtllm"], eng["vllm"]
    assert t["works"] == "partly" and t["passed"] == 0 and t["where_not"] == ["kv_offsets"], (t, cmd)
    assert v["works"] == "partly" and v["where_not"] == ["paged"] and v["passed"] == 4, (v, cmd)
    unsup = [u["id"] for u in v["unsupported"]]
    assert unsup == ["engine.vllm.paged.decode[llama3_8b]", "engine.vllm.paged.decode[llama70b_tp8]"], (unsup, cmd)
