"""The bandwidth benchmarks on the host provider: results.json, report, compare gates, checks.

CPU only: the whole quick preset (what CI runs of ``--bench quick``) through the real
``kvx-conform bench`` command (pytest-benchmark timing, oracle verification), then
the report in headless chromium and ``kvx-conform compare`` exit codes on copies of
that run's results.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvx_conformance.bench import compare as cmp
from kvx_conformance.bench.prepare import prepare
from kvx_conformance.bench.run import SCHEMA, case_seed
from kvx_conformance.bench.sweep import PRESETS, BenchCase, preset
from kvx_conformance.cli import main as cli_main

sys.path.insert(0, str(Path(__file__).parent))
from browser import chromium, open_headless  # noqa: E402

REPRO = "KVX_CONFORM_NATIVE_DIR=... .venv/bin/python -m pytest tests/test_bench.py"


def _native_ok() -> bool:
    try:
        from kvx_conformance.abi.native import reference_provider

        return reference_provider().exists()
    except Exception:
        return False


pytestmark = pytest.mark.skipif(not _native_ok(), reason="the bundled reference provider is not built")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    cmd = [sys.executable, "-m", "kvx_conformance.cli", "bench", "--preset", "quick", "--memory", "host",
           "--output-dir", str(out), "--rounds", "3", "--quiet"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONHASHSEED": "0"})
    assert p.returncode == 0, f"expected exit 0 from {' '.join(cmd)}, got {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    doc = json.loads((out / "results.json").read_text())
    return out, doc


def test_quick_results_json_is_valid_and_verified(quick_run):
    out, doc = quick_run
    assert doc["schema"] == SCHEMA
    assert doc["preset"] == "quick" and doc["memory"] == "host"
    assert doc["provider"]["sha256"] and len(doc["provider"]["sha256"]) == 64
    roof = doc["roofline"]
    assert roof["bandwidth_Bps"] > 0 and roof["start"]["verified"] is True, roof
    ids = [r["case"]["id"] for r in doc["cases"]]
    want = [c.id for c in preset("quick", "host")]
    assert ids == want, f"expected cases {want}, got {ids}"
    for r in doc["cases"]:
        c = BenchCase.from_dict(r["case"])
        p = r["impls"]["provider"]
        # pytest-benchmark's own statistics are kept, and ours are derived from its rounds
        pb = p["host_timer"]["pytest_benchmark"]
        assert pb["rounds"] >= 3 and p["host_timer"]["rounds"] == pb["rounds"], p["host_timer"]
        assert p["host_timer"]["p10_s"] <= p["host_timer"]["median_s"] <= p["host_timer"]["p90_s"]
        assert p["bandwidth_Bps"] == pytest.approx(c.bytes_moved() / p["time_s"])
        assert p["pct_roofline"] == pytest.approx(100 * p["bandwidth_Bps"] / roof["bandwidth_Bps"])
        v = p["verified"]
        assert v["ok"] and v["rows_checked"] == v["rows_total"] == c.rows * len(v["sets_checked"]), \
            f"{c.id}: expected every row verified, got {p['verified']}"
        peer = r["impls"]["numpy"]
        assert peer["bandwidth_Bps"] > 0 and peer["verified"]["ok"], peer
        assert r["ratios"]["provider_over_numpy"] == pytest.approx(p["bandwidth_Bps"] / peer["bandwidth_Bps"])
    assert doc["summary"]["timed"] == len(ids) and not doc["summary"]["verification_failures"]


def test_bytes_moved_formulas():
    w = BenchCase("write", "nhd", "f16", "f16", tokens=100, heads=8, head_dim=128)
    assert w.bytes_moved() == 2 * 100 * 8 * 128 * (2 + 2) + 100 * 8
    q = BenchCase("write", "nhd", "fp8_e4m3", "f16", tokens=10, heads=2, head_dim=64)
    assert q.bytes_moved() == 2 * 10 * 2 * 64 * (2 + 1) + 10 * 8 + 8
    g = BenchCase("gather", "hnd", "f32", "f32", tokens=4096, heads=8, head_dim=128, table="packed", seq_len=1000)
    seqs, L = 4, 1000
    assert (g.seqs, g.sl, g.rows) == (seqs, L, 4000)
    assert g.bytes_moved() == 2 * 4000 * 8 * 128 * 8 + seqs * 63 * 4 + seqs * 4
    r = BenchCase("gather", "hnd", "f16", "f16", tokens=512, table="ragged", seq_len=256)
    assert r.bytes_moved() == 2 * 512 * 8 * 128 * 4 + 512 * 4 + 3 * 4 + 2 * 4
    hp = BenchCase("write", "hnd_packed", "f16", "f16", tokens=64, table="random")
    # IO read, plus per 16-byte piece (8 F16) a 32-byte sector read and written back, K and V; slots
    assert hp.pack == 8 and hp.bytes_sector() == 2 * 64 * 1024 * 2 + 2 * (64 * 1024 // 8) * 64 + 64 * 8
    assert BenchCase("write", "hnd_packed", "f16", "f16", tokens=64, table="prefill").bytes_sector() is None


def test_presets_cover_the_axes():
    std = preset("standard", "device")
    assert {c.tokens for c in std} >= {1, 256, 4096, 65536, 262144}
    assert {c.layout for c in std} == {"nhd", "hnd", "hnd_packed"}
    assert {"f16", "bf16", "f32", "fp8_e4m3"} <= {c.dtype for c in std}
    assert {c.heads for c in std} == {1, 8, 32} and {c.head_dim for c in std} == {64, 128, 256}
    assert {c.block_size for c in std} == {16, 32, 64, 128}
    assert {c.table for c in std if c.op == "gather"} == {"packed", "ragged", "kv_offsets"}
    assert len({c.id for c in std}) == len(std)
    assert set(PRESETS) == {"quick", "standard", "full", "decode"}
    assert all(c.tokens <= 65536 for c in preset("full", "host"))


def test_decode_preset_is_the_engine_comparison_set():
    dec = preset("decode", "device")
    writes = [c for c in dec if c.op == "write"]
    gathers = [c for c in dec if c.op == "gather"]
    assert {c.tokens for c in dec} == {1, 4, 16, 64, 256}
    assert all((c.heads, c.head_dim, c.block_size, c.cache_blocks, c.replay) == (8, 128, 16, 8192, 50) for c in dec)
    assert all(c.table == "random" for c in writes) and all(c.table == "packed" for c in gathers)
    by = {(c.layout, c.dtype, c.io) for c in writes}
    for lay in ("nhd", "hnd", "hnd_packed"):
        assert {(lay, d, d) for d in ("f16", "bf16", "f32")} <= by
        assert {(lay, d, "bf16") for d in ("fp8_e4m3", "fp8_e5m2")} <= by
    for lay in ("nhd", "hnd"):
        assert {(lay, d, "bf16") for d in ("nvfp4", "mxfp4")} <= by
    assert all(c.scale != 1.0 for c in writes if c.dtype.startswith("fp8")), "FP8 decode writes divide by a scale"
    assert {c.layout for c in gathers} == {"nhd", "hnd", "hnd_packed"} and max(c.seqs for c in gathers) == 4
    assert len({c.id for c in dec}) == len(dec) == 140
    # FP4 bytes: codes plus one scale byte per 16 values, K and V, slots, and NVFP4's two global scales
    nv = next(c for c in writes if c.dtype == "nvfp4" and c.tokens == 4)
    assert nv.bytes_moved() == 2 * 4 * 8 * 128 * 2 + 2 * 4 * 8 * (64 + 8) + 4 * 8 + 8


@pytest.fixture(scope="module")
def decode_host_run(tmp_path_factory):
    """The decode preset on host memory, a few cases of each kind (FP8 and FP4 included)."""
    out = tmp_path_factory.mktemp("bench-decode")
    cmd = [sys.executable, "-m", "kvx_conformance.cli", "bench", "--preset", "decode", "--memory", "host",
           "--output-dir", str(out), "--rounds", "3",
           "--filter", "write-nhd-bf16-t4-*", "--filter", "write-hnd-fp8_e4m3-*-t16-*",
           "--filter", "write-hnd_packed-f16-t4-*", "--filter", "write-*nvfp4-*-t4-*", "--filter", "write-nhd-mxfp4-*-t1-*",
           "--filter", "gather-hnd-f32-t16-*"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONHASHSEED": "0"})
    assert p.returncode == 0, f"expected exit 0 from {' '.join(cmd)}, got {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return out, json.loads((out / "results.json").read_text()), p.stdout


def test_decode_preset_runs_on_host_memory(decode_host_run):
    from kvx_conformance.bench.report import render
    from kvx_conformance.bench.run import decode_table

    out, doc, stdout = decode_host_run
    assert doc["preset"] == "decode" and len(doc["cases"]) == 7, [r["case"]["id"] for r in doc["cases"]]
    for r in doc["cases"]:
        p = r["impls"]["provider"]
        assert r["nsets"] == 1 and r["case"]["cache_blocks"] == 8192, r["case"]["id"]
        v = p["verified"]
        assert v["ok"] and v["rows_checked"] == r["case"]["rows"], f"{r['case']['id']}: {v}"
        assert "excess_over_floor_s" not in p  # no floor on host memory
    assert doc["summary"]["floor_us"] is None and doc["summary"]["decode_cases"] == 0
    rows = decode_table(doc)
    assert len(rows) == 7 and all(r["us"] > 0 and r["verified"] for r in rows)
    assert "decode-sized calls, per call (no floor on host memory)" in stdout
    html = (out / "bench.html").read_text()
    assert "Decode-sized calls" in html and "write-nhd-nvfp4-iobf16-t4" in html
    # a device document's floor and excess reach the summary, the table and the report
    dev = copy.deepcopy(doc)
    dev["memory"] = "device"
    dev["floor"] = {"time_s": 0.9e-6, "method": "empty kernel", "calls_per_graph": 50,
                    "start": {"median_s": 0.9e-6}, "end": {"median_s": 0.91e-6}, "drift_pct": 1.1}
    for r in dev["cases"]:
        p = r["impls"]["provider"]
        p["graph_warm"] = {"median_s": 2.0e-6, "p10_s": 1.9e-6, "p90_s": 2.1e-6}
        p["time_s"], p["excess_over_floor_s"] = 2.0e-6, 1.1e-6
    from kvx_conformance.bench.run import summarize

    s = summarize(dev)
    assert s["floor_us"] == pytest.approx(0.9) and s["decode_cases"] == 7
    assert s["decode_excess_us_median"] == pytest.approx(1.1) and s["decode_excess_us_max"] == pytest.approx(1.1)
    dev["summary"] = s
    page = render(dev)
    assert "Floor: 0.90 µs" in page and "1.10" in page


def test_decode_fields_documented():
    text = (Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    for key in ("`floor`", "`graph_warm`", "`excess_over_floor_s`", "`cache_blocks`", "`replay`", "`scale`",
                "`floor_us`", "`decode_excess_us_median`", "`--preset decode`"):
        assert key in text, f"expected {key} documented in docs/benchmarks.md"


@pytest.mark.parametrize("mutant,case", [
    ("block_offset_off_by_one", BenchCase("write", "nhd", "f16", tokens=64, memory="host")),
    ("v_into_k", BenchCase("write", "hnd", "f16", tokens=64, memory="host")),
    ("block_offset_off_by_one", BenchCase("gather", "nhd", "f16", tokens=64, table="packed", memory="host")),
])
def test_verification_catches_a_wrong_provider(mutant, case):
    from kvx_conformance.abi.loader import load_provider
    from kvx_conformance.abi.native import mutant_provider, reference_provider

    seed = case_seed(case)
    pr = prepare(case, seed=seed, nsets=2)
    bad = load_provider(mutant_provider(mutant))
    for i in range(pr.nsets):
        assert pr.call(bad, i) == 0
    v = pr.verify()
    assert not v["ok"] and v["problems"], f"expected the oracle check to fail for mutant {mutant} on {case.id} " \
                                          f"(seed {seed}), got {v}; repro: {REPRO}"
    good = prepare(case, seed=seed, nsets=2)
    ref = load_provider(reference_provider())
    for i in range(good.nsets):
        assert good.call(ref, i) == 0
    assert good.verify()["ok"], f"expected the reference to verify on {case.id} (seed {seed})"


def _slower(doc: dict, case_index: int, factor: float) -> dict:
    d = copy.deepcopy(doc)
    p = d["cases"][case_index]["impls"]["provider"]
    p["bandwidth_Bps"] *= factor
    p["pct_roofline"] *= factor
    return d


def test_compare_detects_a_regression_and_sets_the_exit_code(quick_run, tmp_path, capsys):
    out, doc = quick_run
    base = out / "results.json"
    same = tmp_path / "same.json"
    same.write_text(json.dumps(doc))
    assert cli_main(["compare", str(base), str(same), "--max-regression", "5"]) == cmp.EXIT_OK
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(_slower(doc, 1, 0.8)))
    rc = cli_main(["compare", str(base), str(slow), "--max-regression", "5"])
    text = capsys.readouterr().out
    assert rc == cmp.EXIT_GATE, f"expected exit {cmp.EXIT_GATE} for a 20% drop, got {rc}\n{text}"
    assert "REGRESSION" in text and doc["cases"][1]["case"]["id"] in text
    # a 20% drop passes a 25% allowance; gates limited to large cases ignore these small ones
    assert cli_main(["compare", str(base), str(slow), "--max-regression", "25"]) == cmp.EXIT_OK
    assert cli_main(["compare", str(base), str(slow), "--max-regression", "5", "--min-bytes", "1e12"]) == cmp.EXIT_OK
    lowest = min(r["impls"]["provider"]["pct_roofline"] for r in doc["cases"])
    assert cli_main(["compare", str(base), str(same), "--fail-below", f"{lowest * 0.99}"]) == cmp.EXIT_OK
    assert cli_main(["compare", str(base), str(same), "--fail-below", f"{lowest * 1.01}"]) == cmp.EXIT_GATE
    # a case timed in the base but not in the new run is a regression; one timed in neither is not
    lost = json.loads(json.dumps(doc))
    lost["cases"][0]["impls"]["provider"]["bandwidth_Bps"] = None
    lost_path = tmp_path / "lost.json"
    lost_path.write_text(json.dumps(lost))
    assert cli_main(["compare", str(base), str(lost_path), "--max-regression", "5"]) == cmp.EXIT_GATE
    assert cli_main(["compare", str(lost_path), str(lost_path), "--max-regression", "5"]) == cmp.EXIT_OK
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "something-else/1"}')
    assert cli_main(["compare", str(base), str(bad)]) == cmp.EXIT_BAD_INPUT


def test_agreement_reports_the_spread(quick_run):
    _, doc = quick_run
    a = cmp.agreement(doc, _slower(doc, 0, 0.98), min_bytes=0)
    assert a["cases"] == len(doc["cases"]) and a["within"], a
    assert a["max_diff_pct"] == pytest.approx(100 * 0.02 / 0.99, rel=1e-6)
    b = cmp.agreement(doc, _slower(doc, 0, 0.9), min_bytes=0)
    assert not b["within"] and b["rows"][0]["id"] == doc["cases"][0]["case"]["id"], b


@pytest.mark.browser
@pytest.mark.skipif(chromium() is None, reason="no chromium installed (.ci/run installs it)")
def test_report_opens_in_headless_chromium_without_errors(quick_run, tmp_path):
    from kvx_conformance.bench.report import write_report

    out, doc = quick_run
    html = (out / "bench.html").read_text()
    for section in ("Summary", "Bandwidth against tokens", "Small-batch latency", "Percent of the copy roofline",
                    "Provider, reference and the peer", "Environment", "Method"):
        assert section in html, f"expected section {section!r} in bench.html"
    assert "http://" not in html and "https://" not in html and "<script" not in html.lower()
    # the report as `bench` wrote it, re-rendered with a second run: every section plus the agreement table
    two = tmp_path / "two.html"
    write_report(doc, two, second=_slower(doc, 0, 0.99), second_label="run 2")
    assert "Run-to-run agreement" in two.read_text()
    r = open_headless(two)
    assert r.checked, f"expected the page to load in chromium (rc {r.returncode}):\n{r.stderr_tail}"
    assert r.console == [], f"expected no console messages, got {r.console}"
    assert r.images >= 4 and r.broken == 0, f"expected 4+ decoded plots, got {r.images} images, {r.broken} broken"


def test_run_accepts_bench_option():
    from kvx_conformance.cli import build_parser

    args = build_parser().parse_args(["run", "--bench", "quick", "--memory", "host"])
    assert args.bench == "quick"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--bench", "huge"])


def _hwconv_host() -> str:
    from kvx_conformance.abi.native import testing_provider

    path = testing_provider("hwconv_host")
    if not path.exists():
        pytest.fail(f"{path} is not built: the package build (csrc/testing) must produce it")
    return str(path)


#: cases the host twin (csrc/testing/hwconv) serves and cases it refuses (HND_PACKED, RAGGED,
#: KV_OFFSETS: optional features it does not claim)
REFUSAL_FILTERS = ["write-nhd-f16-t16-*", "gather-hnd-f16-t512-*-packed-sl256-*", "write-hnd_packed-f16-t16-*",
                   "gather-hnd_packed-f16-t16-*", "*-ragged-*", "*-kv_offsets-*"]


def _bench_refusing(out: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    cmd = [sys.executable, "-m", "kvx_conformance.cli", "bench", _hwconv_host(), "--preset", "quick", "--memory",
           "host", "--output-dir", str(out), "--rounds", "3", "--no-peers",
           *[a for f in REFUSAL_FILTERS for a in ("--filter", f)], *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONHASHSEED": "0"})
    doc = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    return p, doc


def test_refused_optional_features_are_listed_not_failed(tmp_path):
    """A provider that refuses HND_PACKED, RAGGED and KV_OFFSETS: exit 0, the refused cases
    listed apart (console, results.json, report), the served ones timed and verified."""
    p, doc = _bench_refusing(tmp_path)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    s = doc["summary"]
    refused = {x["id"]: x for x in s["refused"]}
    assert len(refused) == 5 and not s["errors"] and not s["verification_failures"], s
    assert s["timed"] == 2, s
    assert set(s["refused_features"]) == {"hnd_packed", "ragged", "kv_offsets"}, s["refused_features"]
    assert all(x["status"] == "UNSUPPORTED" for x in refused.values())
    assert "refused      5 case(s) for optional features not claimed" in p.stdout, p.stdout
    assert "gather-hnd-f16-t512-h8-d128-bs16-ragged-sl256-host" in p.stdout
    html = (tmp_path / "bench.html").read_text()
    assert "refused for optional features the provider does not claim" in html


def test_refusal_of_a_claimed_feature_or_strict_fails(tmp_path):
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps({"features": ["ragged"]}))
    p, doc = _bench_refusing(tmp_path / "claimed", "--claims", str(claims))
    assert p.returncode == 1, p.stdout[-2000:]
    assert doc["summary"]["errors"] == ["gather-hnd-f16-t512-h8-d128-bs16-ragged-sl256-host"], doc["summary"]
    p, doc = _bench_refusing(tmp_path / "strict", "--strict")
    assert p.returncode == 1 and len(doc["summary"]["refused"]) == 5, p.stdout[-2000:]


# ----------------------------------------------------------------------------- the graph's work is what is verified


class _FakeTimer:
    """Stands in for the device timer on host memory: eager calls run every set (a warm-up round,
    then the last timed round); the "graph" holds them (``in_graph=True``: they run at replay), or
    the calls do their work while the graph is captured and the graph holds nothing (``False``: a
    provider working on a stream of its own)."""

    def __init__(self, in_graph: bool):
        self.in_graph = in_graph
        self.order: list[str] = []

    def plan(self, fn, nsets):
        for i in range(nsets):
            fn(i, None)
        return nsets, 0.0

    def events(self, fn, inner, before_last=None):
        if before_last is not None:
            before_last()
        for i in range(inner):
            fn(i, None)
        self.order.append("events")
        st = {"median_s": 1e-3, "p10_s": 1e-3, "p90_s": 1e-3}
        return st, dict(st)

    def graph(self, fn, nsets, inner, before_replay=None):
        self.order.append("capture")
        if not self.in_graph:
            for i in range(nsets):
                fn(i, None)
        if before_replay is not None:
            before_replay()
        self.order.append("replay")
        if self.in_graph:
            for i in range(nsets):
                fn(i, None)
        return {"median_s": 1e-9, "p10_s": 1e-9, "p90_s": 1e-9}


@pytest.mark.parametrize("case", [
    BenchCase("write", "nhd", "f16", tokens=64, memory="host"),
    BenchCase("write", "hnd", "f16", io_dtype="f32", tokens=64, memory="host"),
    BenchCase("write", "nhd", "nvfp4", io_dtype="bf16", tokens=64, memory="host"),
    BenchCase("gather", "nhd", "f16", tokens=64, table="packed", seq_len=16, memory="host"),
    BenchCase("gather", "hnd", "bf16", tokens=64, table="kv_offsets", seq_len=16, memory="host"),
], ids=lambda c: c.id)
def test_what_is_verified_is_the_graphs_work(case):
    """The bench zeroes the verified results between the graph's capture and its replays
    (``Prepared.poison``), so a provider whose graph-captured calls do less than its eager ones
    (work on a stream of its own, done during the capture; nothing while the stream is capturing)
    fails the oracle check, the message naming the graph; a provider whose graph does the work
    verifies."""
    from kvx_conformance.abi.loader import load_provider
    from kvx_conformance.abi.native import reference_provider
    from kvx_conformance.bench.run import _time_device, _verified

    ref = load_provider(reference_provider())
    seed = case_seed(case)
    for in_graph in (True, False):
        pr = prepare(case, seed=seed, nsets=2)
        vsets = (pr.nsets - 1,)
        timer = _FakeTimer(in_graph)
        e = _time_device(timer, lambda i, s: pr.call(ref, i, s), pr.nsets,
                         before_replay=lambda: (timer.order.append("poison"), pr.poison(vsets)))
        assert timer.order == ["poison", "events", "capture", "poison", "replay"], timer.order
        v = _verified(pr, vsets, e)
        assert v["after"] == "graph replay"
        if in_graph:
            assert v["ok"], f"{case.id} (seed {seed}): the reference's results after the graph: {v}; repro: {REPRO}"
        else:
            assert not v["ok"] and v["problems"][0].startswith("after the timed CUDA-graph replays"), \
                f"{case.id} (seed {seed}): a graph that did nothing must fail the check, got {v}; repro: {REPRO}"


@pytest.mark.parametrize("case", [
    BenchCase("write", "nhd", "f16", tokens=64, memory="host"),
    BenchCase("gather", "hnd", "bf16", tokens=64, table="packed", seq_len=16, memory="host"),
], ids=lambda c: c.id)
def test_repeated_calls_must_do_their_work(case):
    """The bench's timed calls repeat calls already made, and the results it verifies are zeroed
    before the timed work that makes them: the last eager round where no graph is timed, the replays
    where one is. A provider that answers a call it has seen without work (libkvx_testing_host_memo.so)
    fails both ways, each message naming the timing; the independent correct one verifies."""
    from kvx_conformance.abi.loader import load_provider
    from kvx_conformance.abi.native import testing_provider
    from kvx_conformance.bench.run import _time_device, _verified

    seed = case_seed(case)
    for variant in ("ok", "memo"):
        path = testing_provider(f"host_{variant}")
        if not path.exists():
            pytest.fail(f"{path} is not built: the package build (csrc/testing) must produce it")
        prov = load_provider(str(path))
        for capture, after in ((False, "after the last timed round of eager calls"),
                               (True, "after the timed CUDA-graph replays")):
            pr = prepare(case, seed=seed, nsets=2)
            vsets = (pr.nsets - 1,)
            # graph=False: no graph timed (unified memory; a refused capture takes the same path)
            e = _time_device(_FakeTimer(True), lambda i, s: pr.call(prov, i, s), pr.nsets, graph=capture,
                             before_replay=lambda: pr.poison(vsets))
            v = _verified(pr, vsets, e)
            assert v["after"] == ("graph replay" if capture else "eager calls"), v
            if variant == "ok":
                assert v["ok"], f"{case.id} (seed {seed}): host_ok after {v['after']}: {v}; repro: {REPRO}"
            else:
                assert not v["ok"] and v["problems"][0].startswith(after), \
                    f"{case.id} (seed {seed}): a provider skipping repeated calls must fail, got {v}; repro: {REPRO}"


def test_host_bench_fails_a_provider_that_skips_repeated_calls(tmp_path):
    """``kvx-conform bench --memory host``: the verified sets' results are zeroed after timing and
    their calls made once more; the memoizing provider leaves zeros (exit 1, the verification
    failure named), the correct one verifies (exit 0)."""
    from kvx_conformance.abi.native import testing_provider

    filters = ["write-nhd-f16-t16-*", "gather-hnd-f16-t512-*-packed-sl256-*"]
    for variant, rc in (("ok", 0), ("memo", 1)):
        out = tmp_path / variant
        cmd = [sys.executable, "-m", "kvx_conformance.cli", "bench", str(testing_provider(f"host_{variant}")),
               "--preset", "quick", "--memory", "host", "--output-dir", str(out), "--rounds", "3", "--no-peers",
               *[a for f in filters for a in ("--filter", f)]]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONHASHSEED": "0"})
        assert p.returncode == rc, f"{variant}: exit {p.returncode}, expected {rc}\n{p.stdout[-3000:]}\n{p.stderr[-2000:]}"
        doc = json.loads((out / "results.json").read_text())
        fails = doc["summary"]["verification_failures"]
        assert doc["summary"]["timed"] == 2, doc["summary"]
        if variant == "ok":
            assert not fails, fails
        else:
            assert len(fails) == 2, doc["summary"]
            for rec in doc["cases"]:
                v = rec["impls"]["provider"]["verified"]
                assert v["after"] == "a repeat of the timed calls" and not v["ok"], v
                assert v["problems"][0].startswith("after a repeat of the timed calls"), v
