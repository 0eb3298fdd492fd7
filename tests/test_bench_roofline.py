"""The bench's roofline (the best of several device-to-device copies), the L2-resident cases it
does not hold, and the cross-device page of ``kvx-conform compare``.

CPU: method selection and the roofline record on synthetic figures, the measurement's rounds,
verification and choice on host buffers (a fake torch and copy library), the copy library's
presence and its answers without a GPU, the L2 exclusion on synthetic results made from the
published H100 run, the side-by-side comparison of that run against a synthetic second
device made from it, and of the published H100 and H200 runs. GPU (skipped without CUDA):
the three methods measured and verified, the copy kernel on unaligned and ragged buffers.
"""
from __future__ import annotations

import copy
import ctypes
import json
import sys
from pathlib import Path

import pytest

from kvx_conformance.bench import compare as cmp
from kvx_conformance.bench import copies, crossdevice
from kvx_conformance.bench.run import l2_resident, roofline_line, summarize
from kvx_conformance.cli import main as cli_main

sys.path.insert(0, str(Path(__file__).parent))
from browser import chromium, open_headless  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "reports" / "h100-reference" / "results.json"
H200 = ROOT / "reports" / "h200-reference" / "results.json"
N = 1 << 30


def _st(bw: float) -> dict:
    t = 2 * N / bw
    return {"median_s": t, "p10_s": t * 0.99, "p90_s": t * 1.02, "mean_s": t, "min_s": t * 0.98, "max_s": t * 1.03,
            "cv": 0.01, "rounds": 20}


def _roof(copy_bw: float, memcpy_bw: float, kernel_bws: list[float], *, verified=None, notes=()) -> dict:
    """A roofline record from synthetic figures, built by the same functions the GPU path uses."""
    verified = verified or {}
    es = [copies.figure("copy_", copies.COPY_, N, _st(copy_bw), verified.get("copy_", True)),
          copies.figure("cudaMemcpyAsync", copies.MEMCPY, N, _st(memcpy_bw), verified.get("cudaMemcpyAsync", True))]
    vs = []
    for (vecs, streaming), bw in zip(copies.KERNEL_VARIANTS, kernel_bws):
        v = {"vecs": vecs, "bytes_in_flight_per_thread": 16 * vecs, "streaming": streaming, "threads": 256,
             "grid": 132 * 8, "sm_count": 132, "blocks_per_sm": 8}
        vid = f"copy_kernel/v{vecs}{'s' if streaming else ''}"
        e = copies.figure(vid, copies.kernel_what(v), N, _st(bw), verified.get(vid, True))
        e["variant"] = v
        vs.append(e)
    es.append(copies.group_entry("copy_kernel", vs))
    return copies.roofline(es, N, list(notes), "/x/libkvx_bench_copy.so")


# ----------------------------------------------------------------------------- method selection


def test_pick_best_takes_the_fastest_verified_copy():
    a = {"id": "a", "bandwidth_Bps": 3.0e12, "verified": True}
    b = {"id": "b", "bandwidth_Bps": 3.2e12, "verified": True}
    wrong = {"id": "wrong", "bandwidth_Bps": 9.9e12, "verified": False}  # fast because it copied nothing right
    none = {"id": "none", "bandwidth_Bps": None, "verified": None, "error": "cudaErrorNoDevice"}
    assert copies.pick_best([a, b, wrong, none])["id"] == "b"
    assert copies.pick_best([b, a])["id"] == "b"
    assert copies.pick_best([a, dict(a, id="a2")])["id"] == "a", "a tie keeps the earlier method"
    # nothing verified: the fastest figure stands (the record then reads verified: false)
    assert copies.pick_best([wrong, dict(wrong, id="w2", bandwidth_Bps=1e12)])["id"] == "wrong"
    assert copies.pick_best([none]) is None and copies.pick_best([]) is None


def test_roofline_record_names_the_winner_and_keeps_every_method():
    kern = [3.05e12, 3.10e12, 3.20e12, 3.15e12, 3.0e12, 3.1e12, 3.12e12, 3.11e12]
    r = _roof(2.94e12, 2.96e12, kern)
    assert r["winner"] == "copy_kernel" and r["bandwidth_Bps"] == pytest.approx(3.20e12)
    assert "64 bytes in flight per thread" in r["method"] and "plain cache hints" in r["method"], r["method"]
    assert [m["id"] for m in r["methods"]] == ["copy_", "cudaMemcpyAsync", "copy_kernel"]
    for m in r["methods"]:
        assert m["bandwidth_p10_Bps"] < m["bandwidth_Bps"] < m["bandwidth_p90_Bps"], m
        assert m["time"]["rounds"] == 20 and m["verified"] is True
    k = r["methods"][2]
    assert k["best_variant"] == "copy_kernel/v4" and k["variant"]["bytes_in_flight_per_thread"] == 64
    assert len(k["variants"]) == len(copies.KERNEL_VARIANTS) == 8
    assert {v["variant"]["bytes_in_flight_per_thread"] for v in k["variants"]} == {16, 32, 64, 128}
    assert (r["bytes_copied"], r["bytes_moved"], r["verified"]) == (N, 2 * N, True)
    # copy_ wins when it is the fastest; an unverified kernel variant is never the kernel's figure
    r2 = _roof(3.3e12, 2.96e12, kern, verified={"copy_kernel/v4": False})
    assert r2["winner"] == "copy_" and r2["method"] == copies.COPY_
    assert r2["methods"][2]["best_variant"] == "copy_kernel/v8"
    line = roofline_line(r)
    assert line.startswith("3200 GB/s") and "copy_kernel" in line and "copy_ 2940" in line \
        and "cudaMemcpyAsync 2960" in line, line


def test_roofline_without_any_figure_is_an_error():
    with pytest.raises(RuntimeError, match="no copy method produced a figure"):
        copies.roofline([copies.figure("copy_", copies.COPY_, N, None, None, "boom")], N, [], None)
    g = copies.group_entry("copy_kernel", [copies.figure("copy_kernel/v1", "k", N, None, None, "no device")])
    assert g["bandwidth_Bps"] is None and g["error"] == "no device"


def test_roofline_falls_back_to_copy_and_says_so(tmp_path, monkeypatch):
    """No libkvx_bench_copy.so (a build without CUDA): load_library says why; the record's notes carry it."""
    monkeypatch.setenv("KVX_CONFORM_NATIVE_DIR", str(tmp_path))
    lib, why = copies.load_library()
    assert lib is None and copies.LIBRARY in why and str(tmp_path) in why, why
    assert copies.methods(None, 0) == []
    note = f"cudaMemcpyAsync and the copy kernel not measured: {why}; the roofline is copy_ alone"
    r = copies.roofline([copies.figure("copy_", copies.COPY_, N, _st(2.9e12), True)], N, [note], None)
    assert r["winner"] == "copy_" and r["notes"] == [note] and r["library"] is None
    assert note in roofline_line(r)


class _FakeTorch:
    """Just enough of torch for device_copy_roofline on the host: numpy buffers, a clock that each copy
    advances by its method's duration (so the figures, and the winner, are known in advance)."""

    uint8 = "uint8"

    def __init__(self):
        import types

        import numpy as np

        self.np = np
        self.now = 0.0
        self.calls: list[str] = []
        fake = self

        class Tensor:
            def __init__(self, a):
                self.a = a

            def data_ptr(self):
                return self.a.ctypes.data

            def copy_(self, other):
                self.a[:] = other.a
                fake.tick("copy_")
                return self

            def zero_(self):
                self.a[:] = 0
                return self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self, stream=None):
                self.t = fake.now

            def elapsed_time(self, other):
                return (other.t - self.t) * 1e3

        class Gen:
            def __init__(self, device=None):
                self.seed = 0

            def manual_seed(self, s):
                self.seed = s

        self.Tensor, self.Generator = Tensor, Gen
        self.cuda = types.SimpleNamespace(Event=Event, synchronize=lambda: None, empty_cache=lambda: None,
                                          current_stream=lambda: types.SimpleNamespace(cuda_stream=0))

    DURATION = {"copy_": 1.2e-3, "cudaMemcpyAsync": 1.1e-3, "v4": 0.9e-3, "v8s": 0.5e-3}

    def tick(self, what: str) -> None:
        self.calls.append(what)
        self.now += self.DURATION.get(what, 1.0e-3)

    def randint(self, lo, hi, shape, dtype=None, device=None, generator=None):
        return self.Tensor(self.np.random.default_rng(generator.seed).integers(lo, hi, shape, dtype=self.np.uint8))

    def empty_like(self, t):
        return self.Tensor(self.np.empty_like(t.a))

    def equal(self, a, b):
        return bool((a.a == b.a).all())


class _FakeCopyLibrary:
    """libkvx_bench_copy.so's calls on host memory (ctypes.memmove); the variant v8s copies one byte short
    (fast and wrong: never the roofline), cudaMemcpyAsync can be made to fail."""

    path = Path("/fake/libkvx_bench_copy.so")

    def __init__(self, torch: _FakeTorch, memcpy_status: int = 0, fail_from: int = 0):
        self.torch, self.memcpy_status, self.fail_from, self.memcpys = torch, memcpy_status, fail_from, 0

    def error(self, st):
        return f"fake error {st}"

    def plan(self, dst, vecs, streaming, threads=copies.THREADS):
        return {"grid": 132 * 8, "sm_count": 132, "blocks_per_sm": 8}

    def memcpy_async(self, dst, src, n, stream):
        self.memcpys += 1
        if self.memcpy_status and self.memcpys > self.fail_from:
            return self.memcpy_status
        ctypes.memmove(dst, src, n)
        self.torch.tick("cudaMemcpyAsync")
        return 0

    def copy_kernel(self, dst, src, n, vecs, streaming, stream, threads=copies.THREADS):
        v = f"v{vecs}{'s' if streaming else ''}"
        ctypes.memmove(dst, src, n - 1 if v == "v8s" else n)
        self.torch.tick(v)
        return 0


def test_device_roofline_takes_the_fastest_verified_method(monkeypatch):
    """device_copy_roofline's rounds, verification and choice, on host buffers with a fake clock."""
    from kvx_conformance.bench.timing import device_copy_roofline

    fake = _FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(copies, "load_library", lambda: (_FakeCopyLibrary(fake), None))
    r = device_copy_roofline(nbytes=4096, repeats=5)
    assert [m["id"] for m in r["methods"]] == ["copy_", "cudaMemcpyAsync", "copy_kernel"]
    k = r["methods"][2]
    v8s = next(v for v in k["variants"] if v["id"] == "copy_kernel/v8s")
    assert v8s["verified"] is False and v8s["bandwidth_Bps"] == pytest.approx(2 * 4096 / 0.5e-3)
    assert k["best_variant"] == "copy_kernel/v4" and k["verified"] is True
    assert r["winner"] == "copy_kernel" and r["bandwidth_Bps"] == pytest.approx(2 * 4096 / 0.9e-3)
    assert r["methods"][0]["bandwidth_Bps"] == pytest.approx(2 * 4096 / 1.2e-3)
    assert all(m["time"]["rounds"] == 5 for m in r["methods"]) and r["notes"] == []
    # every method warmed up 3 times, timed 5 times, verified once; the rounds rotate the order
    assert fake.calls.count("copy_") == fake.calls.count("v4") == 3 + 5 + 1
    timed = fake.calls[3 * 10:3 * 10 + 5 * 10]
    assert [timed[i * 10] for i in range(3)] == ["copy_", "cudaMemcpyAsync", "v1"], timed[:30]
    # a method that fails is recorded with its error and left out; no library: copy_ alone, said so
    fake = _FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(copies, "load_library", lambda: (_FakeCopyLibrary(fake, memcpy_status=700), None))
    r = device_copy_roofline(nbytes=4096, repeats=3)
    m = r["methods"][1]
    assert m["bandwidth_Bps"] is None and "fake error 700" in m["error"] and r["winner"] == "copy_kernel"
    # one that fails after its warm-up (in the third round): no figure either, the others timed in full
    fake = _FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(copies, "load_library", lambda: (_FakeCopyLibrary(fake, memcpy_status=700, fail_from=5), None))
    r = device_copy_roofline(nbytes=4096, repeats=4)
    m = r["methods"][1]
    assert m["bandwidth_Bps"] is None and "fake error 700" in m["error"] and r["methods"][0]["time"]["rounds"] == 4
    monkeypatch.setattr(copies, "load_library", lambda: (None, "libkvx_bench_copy.so not found in /x"))
    r = device_copy_roofline(nbytes=4096, repeats=3)
    assert [m["id"] for m in r["methods"]] == ["copy_"] and r["winner"] == "copy_" and r["library"] is None
    assert r["notes"] and "not found in /x" in r["notes"][0] and "copy_ alone" in r["notes"][0]


def _built_library() -> Path:
    from kvx_conformance.abi.native import bench_copy_library, have_cuda

    if not have_cuda():
        pytest.skip("the package was built without CUDA: no libkvx_bench_copy.so (the roofline is copy_ alone)")
    path = bench_copy_library()
    assert path.exists(), f"a CUDA build must install {path.name} beside the reference provider"
    return path


def test_empty_kernel_launch_config_has_the_cuda_h_layout():
    """The decode floor's overlapping form launches through ``cuLaunchKernelEx`` (ctypes): its structs
    must lay out as cuda.h's ``CUlaunchAttribute`` (id, 4 bytes of padding, a 64-byte value union) and
    ``CUlaunchConfig``, and the attribute id must be cuda.h's where the toolkit is here."""
    import os
    import re
    import shutil

    from kvx_conformance.bench import timing as tm

    attr, cfg_t = tm._CuLaunchAttribute, tm._CuLaunchConfig
    assert ctypes.sizeof(attr) == 72 and attr.value.offset == 8
    assert ctypes.sizeof(cfg_t) == 56
    assert (cfg_t.shared_mem_bytes.offset, cfg_t.stream.offset, cfg_t.attrs.offset, cfg_t.num_attrs.offset) == \
        (24, 32, 40, 48)
    attr_id = tm.EmptyKernel.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    cfg = tm._launch_config(1234, attr_id)
    assert (list(cfg.grid), list(cfg.block), cfg.stream, cfg.num_attrs) == ([1, 1, 1], [32, 1, 1], 1234, 1)
    assert (cfg.attrs[0].id, cfg.attrs[0].value) == (attr_id, 1)
    nvcc = shutil.which("nvcc")  # the toolkit's bin/nvcc, or a wrapper beside /usr/local/cuda
    homes = [Path(nvcc).resolve().parent.parent] if nvcc else []
    homes += [Path(os.environ["CUDA_HOME"])] if os.environ.get("CUDA_HOME") else []
    homes += [Path("/usr/local/cuda")]
    header = next((h / "include" / "cuda.h" for h in homes if (h / "include" / "cuda.h").exists()), None)
    if header:
        m = re.search(r"CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION\s*=\s*(\d+)",
                      header.read_text(encoding="utf-8", errors="replace"))
        assert m and int(m.group(1)) == attr_id, f"{header}: the attribute id is not {attr_id}"


def test_copy_library_is_built_with_cuda_and_is_not_a_provider():
    path = _built_library()
    raw = ctypes.CDLL(str(path))
    for name in ("kvx_write_kv", "kvx_gather_kv", "kvx_get_abi_version"):
        assert not hasattr(raw, name), f"{path.name} must not export the KVX entry point {name}"
    lib, why = copies.load_library()
    assert lib is not None and why is None and lib.path == path
    assert lib.lib.kvx_bench_copy_abi() == copies.ABI
    # null pointers are refused with a CUDA error (no device, no driver or an invalid value), never a crash
    st = lib.memcpy_async(0, 0, 16, 0)
    assert st != 0 and lib.error(st), st
    st = lib.copy_kernel(0, 0, 16, 4, False, 0)
    assert st != 0, st
    assert lib.lib.kvx_bench_copy_kernel(None, None, 16, 3, 256, 0, None) != 0, "vecs 3 is not a variant"
    with pytest.raises(RuntimeError, match="kvx_bench_copy_plan"):
        lib.plan(0, 4, False)


# ----------------------------------------------------------------------------- L2-resident cases


def _h100() -> dict:
    return json.loads(H100.read_text(encoding="utf-8"))


def _large_baseline_gather(doc: dict) -> dict:
    return next(r for r in doc["cases"] if r["case"]["id"] == "gather-nhd-f16-t262144-h8-d128-bs16-packed-sl2048-device")


def test_l2_resident_is_the_working_set_against_the_l2():
    assert l2_resident({"working_set_bytes": 50, "l2_bytes": 50}) and l2_resident({"working_set_bytes": 1, "l2_bytes": 50})
    assert not l2_resident({"working_set_bytes": 51, "l2_bytes": 50})
    assert not l2_resident({"working_set_bytes": 51}) and not l2_resident({})  # host runs: no L2 figure
    doc = _h100()
    marked = [r["case"]["id"] for r in doc["cases"] if l2_resident(r)]
    assert len(marked) == 46 and all("-t1-" in c or "-t16-" in c for c in marked), marked


def test_l2_resident_cases_leave_the_large_statistics_and_the_targets():
    from kvx_conformance.bench.report import render, targets

    doc = _h100()
    base = summarize(doc)
    base_g = {x["what"]: x for x in targets(doc)}["gather, NHD/HND/HND_PACKED, F16/BF16/F32, ≥ 256 MB"]
    assert base_g["worst_id"] != _large_baseline_gather(doc)["case"]["id"], base_g
    # a large baseline gather made slow: held to the roofline, it is the worst case and fails its target
    slow = copy.deepcopy(doc)
    r = _large_baseline_gather(slow)
    r["impls"]["provider"]["pct_roofline"] = 10.0
    s = summarize(slow)
    assert s["large_pct_roofline_min"] == pytest.approx(10.0) and s["large_cases"] == base["large_cases"]
    t = {x["what"]: x for x in targets(slow)}
    g = t["gather, NHD/HND/HND_PACKED, F16/BF16/F32, ≥ 256 MB"]
    assert g["worst_id"] == r["case"]["id"] and g["met"] is False, g
    held = g["cases"]
    # the same case with its working set inside the L2 (a synthetic device with a huge L2): left out
    r["l2_bytes"] = r["working_set_bytes"]
    s = summarize(slow)
    assert s["large_l2_resident"] == [r["case"]["id"]] and s["large_cases"] == base["large_cases"] - 1
    assert s["large_pct_roofline_min"] == pytest.approx(base["large_pct_roofline_min"])
    assert s["l2_resident_cases"] == base["l2_resident_cases"] + 1 == 47
    t = {x["what"]: x for x in targets(slow)}
    g = t["gather, NHD/HND/HND_PACKED, F16/BF16/F32, ≥ 256 MB"]
    # ... so the target reads as on the published run: the same worst case and verdict
    assert g["worst_id"] == base_g["worst_id"] and g["met"] is base_g["met"] and g["cases"] == held - 1, (g, base_g)
    # small calls stay held to the µs target whatever their working set
    us = t["calls of 1 to 256 tokens, device time under graph replay"]
    assert us["cases"] == 69, us
    slow["summary"] = s
    page = render(slow)
    assert "47 timed case(s) touch no more bytes per round than the L2 holds" in page
    assert "1 more whose working set fits in the L2 left out" in page


def test_fail_below_gate_skips_l2_resident_cases():
    doc = _h100()
    lowest_resident = min(r["impls"]["provider"]["pct_roofline"] for r in doc["cases"] if l2_resident(r))
    res = cmp.compare(doc, doc, fail_below=5.0)
    assert lowest_resident < 5.0 and not any(l2_resident(next(r for r in doc["cases"] if r["case"]["id"] == b["id"]))
                                             for b in res["below"])
    # the same cases with their L2 figure gone (held to DRAM) fail the gate
    held = copy.deepcopy(doc)
    for r in held["cases"]:
        r.pop("l2_bytes", None)
    assert len(cmp.compare(held, held, fail_below=5.0)["below"]) > len(res["below"])


def test_copy_of_each_large_case_bytes_in_the_summary_and_the_report():
    """A copy of each large case's own bytes, timed beside it (``impls.copy``): the summary holds the
    provider against it (median, lowest) and the copy against the roofline; cases below 256 MB and
    L2-resident ones have none; the report and the console say so."""
    from kvx_conformance.bench.report import all_rows, render
    from kvx_conformance.bench.run import LARGE_BYTES, _ratios, large_case

    doc = copy.deepcopy(_h100())
    assert summarize(doc)["large_pct_copy_same_bytes_median"] is None  # a run before the copy: nothing said
    roof = doc["roofline"]["bandwidth_Bps"]
    big = [r for r in doc["cases"] if large_case(r) and r["impls"]["provider"].get("bandwidth_Bps")]
    assert big and not [r for r in doc["cases"] if large_case(r) and
                        (r["case"]["bytes_moved"] < LARGE_BYTES or l2_resident(r))]
    for k, r in enumerate(big):
        bw = roof * (0.90 + 0.001 * k)  # the copy of the case's bytes: 90 % of the roofline and up
        r["impls"]["copy"] = {"bandwidth_Bps": bw, "pct_roofline": 100 * bw / roof, "time_s": 1.0,
                              "what": "torch.Tensor.copy_ device-to-device of bytes_moved / 2 bytes"}
        r["ratios"] = _ratios(r["impls"])
    s = summarize(doc)
    of_copy = [100 * r["impls"]["provider"]["bandwidth_Bps"] / r["impls"]["copy"]["bandwidth_Bps"] for r in big]
    assert s["large_pct_copy_same_bytes_min"] == pytest.approx(min(of_copy))
    assert s["large_pct_copy_same_bytes_median"] == pytest.approx(sorted(of_copy)[len(of_copy) // 2]
                                                                   if len(of_copy) % 2 else
                                                                   sum(sorted(of_copy)[len(of_copy) // 2 - 1:
                                                                                       len(of_copy) // 2 + 1]) / 2)
    assert 90.0 <= s["large_copy_same_bytes_pct_roofline_median"] <= 90.0 + 0.1 * len(big)
    rows = {x["id"]: x for x in all_rows(doc)}
    assert rows[big[0]["case"]["id"]]["pct_copy"] == pytest.approx(of_copy[0])
    assert all(x["pct_copy"] is None for i, x in rows.items() if i not in {r["case"]["id"] for r in big})
    doc["summary"] = s
    page = render(doc)
    assert "against a copy of each case&#39;s own bytes, timed beside it" in page or \
        "against a copy of each case's own bytes, timed beside it" in page
    assert f"lowest {s['large_pct_copy_same_bytes_min']:.1f}%" in page


# ----------------------------------------------------------------------------- the report and the docs


def test_report_names_the_roofline_method_and_every_figure():
    from kvx_conformance.bench.report import render

    doc = _h100()
    doc["roofline"]["start"] = _roof(2.94e12, 2.96e12, [3.0e12, 3.05e12, 3.01e12, 2.9e12, 2.8e12, 2.8e12, 2.8e12, 2.8e12])
    doc["roofline"]["end"] = _roof(2.93e12, 2.97e12, [3.02e12] * 8)
    doc["roofline"]["bandwidth_Bps"] = doc["roofline"]["start"]["bandwidth_Bps"]
    doc["roofline"]["method"] = doc["roofline"]["start"]["method"]
    page = render(doc)
    assert "the best of 3 device-to-device copies" in page and "<b>copy_kernel</b>" in page
    assert "32 bytes in flight per thread" in page and "v2 3050" in page and "cudaMemcpyAsync" in page
    note = "cudaMemcpyAsync and the copy kernel not measured: libkvx_bench_copy.so not found"
    doc["roofline"]["start"] = copies.roofline([copies.figure("copy_", copies.COPY_, N, _st(2.9e12), True)], N, [note],
                                               None)
    assert note in render(doc)


def test_roofline_and_cross_device_fields_documented():
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    r = _roof(2.94e12, 2.96e12, [3.0e12] * 8)
    keys = set(r) | {k for m in r["methods"] for k in m} | {k for k in r["methods"][2]["variant"]}
    keys |= {"l2_resident", "l2_resident_cases", "large_l2_resident", "winner", "--html", "--side-by-side",
             "impls.copy", "provider_over_copy", "large_pct_copy_same_bytes_median", "large_pct_copy_same_bytes_min",
             "large_copy_same_bytes_pct_roofline_median", "copied_equal",
             "speed_b_over_a", "pct_b_over_a", "libkvx_bench_copy.so"}
    import re

    names = set(re.findall(r"[\w.\-]+", " ".join(re.findall(r"`([^`\n]+)`", text))))  # words inside code spans
    missing = sorted(keys - names)
    assert not missing, f"expected these documented in docs/benchmarks.md: {missing}"
    assert "docs/benchmarks.md" in (ROOT / "docs" / "results-schema.md").read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- two devices side by side


def _second_device(doc: dict, speed: float = 1.35, roof: float = 1.4) -> dict:
    """The H100 run as if made on another device: large cases ``speed`` times faster, small ones as fast,
    the roofline ``roof`` times higher, each case's percentage against it."""
    b = copy.deepcopy(doc)
    b["environment"]["gpu"].update(name="Synthetic HBM3e part", l2_bytes=160 << 20, sm_count=132)
    b["environment"]["cuda_driver"] = "999.01"
    b["roofline"]["bandwidth_Bps"] *= roof
    for r in b["cases"]:
        p = r["impls"].get("provider") or {}
        if p.get("time_s"):
            f = speed if r["case"]["bytes_moved"] >= 256e6 else 1.0
            p["time_s"] /= f
            p["bandwidth_Bps"] *= f
            p["pct_roofline"] = 100 * p["bandwidth_Bps"] / b["roofline"]["bandwidth_Bps"]
        r["l2_bytes"] = 160 << 20  # an L2 that holds the 64 sets of the 256-token calls
    return b


def test_side_by_side_holds_each_device_to_its_own_roofline():
    a = _h100()
    b = _second_device(a)
    res = crossdevice.side_by_side(a, b)
    assert res["a"]["name"] == "NVIDIA H100 80GB HBM3" and res["b"]["name"] == "Synthetic HBM3e part"
    assert res["a"]["driver"] == "580.159.04" and res["b"]["driver"] == "999.01"
    assert len(res["rows"]) == 170 and not res["only_a"] and not res["only_b"] and not res["warnings"]
    for r in res["rows"]:
        want = 1.35 if r["bytes_moved"] >= 256e6 else 1.0
        assert r["speed_b_over_a"] == pytest.approx(want), r["id"]
        assert r["pct_b_over_a"] == pytest.approx(want / 1.4), r["id"]
        assert r["b"]["pct_roofline"] == pytest.approx(r["a"]["pct_roofline"] * want / 1.4), r["id"]
    s = res["summary"]
    assert s["roofline_b_over_a"] == pytest.approx(1.4) and s["large_speed_b_over_a_median"] == pytest.approx(1.35)
    assert s["large_cases"] == 70 and s["small_cases"] == 69
    assert s["large_pct_b_median"] == pytest.approx(s["large_pct_a_median"] * 1.35 / 1.4)
    assert s["l2_resident_a"] == 46 and s["l2_resident_b"] > 46  # a larger L2 holds more of the small cases
    # a case missing on one side, another provider: listed and warned
    b2 = copy.deepcopy(b)
    gone = b2["cases"].pop(3)["case"]["id"]
    b2["provider"]["sha256"] = "0" * 64
    res2 = crossdevice.side_by_side(a, b2)
    assert res2["only_a"] == [gone] and len(res2["rows"]) == 169
    assert any("providers" in w for w in res2["warnings"]), res2["warnings"]
    assert crossdevice.different_devices(a, b) and not crossdevice.different_devices(a, a)


def test_compare_cli_renders_two_devices_side_by_side(tmp_path, capsys):
    a = _h100()
    bpath = tmp_path / "b.json"
    bpath.write_text(json.dumps(_second_device(a)))
    html = tmp_path / "devices.html"
    rc = cli_main(["compare", str(H100), str(bpath), "--html", str(html)])
    out = capsys.readouterr().out
    assert rc == cmp.EXIT_OK, out
    assert out.startswith("A: NVIDIA H100 80GB HBM3, driver 580.159.04") and "B: Synthetic HBM3e part, driver 999.01" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("write-nhd-f16-t262144-h8-d128-bs16-random-device "))
    assert line.split()[-2:] == ["1.350", f"{1.35 / 1.4:.3f}"], line
    assert "roofline B/A 1.400" in out and "speed B/A median 1.350" in out.split("large cases")[1]
    page = html.read_text(encoding="utf-8")
    assert "http://" not in page and "https://" not in page and "<script" not in page.lower()
    for want in ("NVIDIA H100 80GB HBM3", "Synthetic HBM3e part", "580.159.04", "999.01",
                 "write-nhd-f16-t262144-h8-d128-bs16-random-device", "<b>1.350</b>", "data:image/png;base64,"):
        assert want in page, f"expected {want!r} in the side-by-side page"
    # --json carries the comparison; the same device twice keeps the regression table
    assert cli_main(["compare", str(H100), str(bpath), "--json"]) == cmp.EXIT_OK
    assert json.loads(capsys.readouterr().out)["devices"]["summary"]["cases"] == 170
    assert cli_main(["compare", str(H100), str(H100)]) == cmp.EXIT_OK
    same = capsys.readouterr().out
    assert "base GB/s" in same and not same.startswith("A: ")
    assert cli_main(["compare", str(H100), str(H100), "--side-by-side"]) == cmp.EXIT_OK
    assert capsys.readouterr().out.startswith("A: NVIDIA H100")
    # the gates still apply across devices
    assert cli_main(["compare", str(H100), str(bpath), "--fail-below", "99"]) == cmp.EXIT_GATE
    assert "BELOW 99% of roofline" in capsys.readouterr().out


def test_the_published_h100_and_h200_runs_side_by_side():
    """The two published reports: two real devices, each case against its own device's roofline,
    every case verified on both, and the bench's own summary agreeing with the comparison's."""
    a, b = _h100(), json.loads(H200.read_text(encoding="utf-8"))
    res = crossdevice.side_by_side(a, b)
    assert (res["a"]["name"], res["b"]["name"]) == ("NVIDIA H100 80GB HBM3", "NVIDIA H200")
    assert crossdevice.different_devices(a, b)
    assert len(res["rows"]) == 170 and not res["only_a"] and not res["only_b"]
    ra, rb = a["roofline"]["bandwidth_Bps"], b["roofline"]["bandwidth_Bps"]
    s = res["summary"]
    assert s["roofline_b_over_a"] == pytest.approx(rb / ra) and 1.3 < rb / ra < 1.5, (ra, rb)
    for r in res["rows"]:
        assert r["a"]["verified"] and r["b"]["verified"], r["id"]
        for side, roof in (("a", ra), ("b", rb)):
            x = r[side]
            assert x["pct_roofline"] == pytest.approx(100 * x["bandwidth_Bps"] / roof, rel=1e-9), (r["id"], side)
    # the bench's summary of each run and the comparison give the same medians (the statistical median)
    for doc, side in ((a, "a"), (b, "b")):
        own = summarize(doc)
        assert own == doc["summary"], f"the published summary of the {side} run is stale"
        assert own["large_cases"] == s["large_cases"] == 70
        assert own["large_pct_roofline_median"] == pytest.approx(s[f"large_pct_{side}_median"])
        assert own["large_pct_roofline_min"] == pytest.approx(s[f"large_pct_{side}_min"])
        assert own["small_time_us_median"] == pytest.approx(s[f"small_us_{side}_median"])
    # the H200 run times each large case beside a verified copy of its own bytes (the H100 run predates it)
    copied = [r for r in b["cases"] if r["case"]["bytes_moved"] >= 256e6 and not l2_resident(r)]
    assert len(copied) == 70 and all(r["impls"]["copy"]["copied_equal"] is True for r in copied)
    assert all(r["impls"]["copy"]["time_source"] == "events" for r in copied)
    assert 90 < b["summary"]["large_pct_copy_same_bytes_median"] < 100 and a["summary"]["large_pct_copy_same_bytes_median"] is None
    assert "against a copy of each case's own bytes" in (ROOT / "reports" / "h200-reference" / "bench.html").read_text(encoding="utf-8")
    page = (ROOT / "reports" / "h100-vs-h200.html").read_text(encoding="utf-8")
    for want in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "write-nhd-f16-t262144-h8-d128-bs16-random-device"):
        assert want in page, f"expected {want!r} in reports/h100-vs-h200.html"


@pytest.mark.browser
@pytest.mark.skipif(chromium() is None, reason="no chromium installed (.ci/run installs it)")
def test_side_by_side_page_opens_in_headless_chromium(tmp_path):
    a = _h100()
    html = tmp_path / "devices.html"
    html.write_text(crossdevice.render(crossdevice.side_by_side(a, _second_device(a))), encoding="utf-8")
    r = open_headless(html)
    assert r.checked, f"expected the page to load in chromium (rc {r.returncode}):\n{r.stderr_tail}"
    assert r.console == [] and r.images == 1 and r.broken == 0, (r.console, r.images, r.broken)


# ----------------------------------------------------------------------------- GPU


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA device (torch.cuda)")
def test_device_roofline_measures_and_verifies_every_method():
    from kvx_conformance.bench.timing import device_copy_roofline

    _built_library()
    r = device_copy_roofline(nbytes=256 << 20, repeats=5)
    assert [m["id"] for m in r["methods"]] == ["copy_", "cudaMemcpyAsync", "copy_kernel"], r["methods"]
    assert all(m["verified"] is True and m["bandwidth_Bps"] > 0 for m in r["methods"]), r["methods"]
    bad = [(v["id"], v["verified"], v.get("error")) for v in r["methods"][2]["variants"] if v["verified"] is not True]
    assert not bad, f"copy kernel variants not verified (id, verified, error): {bad}"
    assert r["bandwidth_Bps"] == max(m["bandwidth_Bps"] for m in r["methods"]) and r["verified"] is True
    assert r["notes"] == [] and r["methods"][2]["variant"]["sm_count"] > 0


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA device (torch.cuda)")
def test_copy_of_a_case_bytes_is_timed_and_verified():
    from kvx_conformance.bench.run import _same_bytes_copy
    from kvx_conformance.bench.sweep import BenchCase
    from kvx_conformance.bench.timing import DeviceTimer

    case = BenchCase(op="write", layout="nhd", dtype="f16", io_dtype="f16", tokens=65536, heads=8, head_dim=128,
                     block_size=16, table="random", memory="device")
    e = _same_bytes_copy(DeviceTimer(repeats=3), case, 1e12)
    assert e["copied_equal"] is True and e["bandwidth_Bps"] > 1e11 and e["time_source"] == "events", e
    assert e["pct_roofline"] == pytest.approx(100 * e["bandwidth_Bps"] / 1e12)
    assert e["bandwidth_Bps"] == pytest.approx(case.bytes_moved() / e["time_s"])


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA device (torch.cuda)")
@pytest.mark.parametrize("dst_off,src_off,n", [(0, 0, 4096 * 16 + 5), (3, 3, 100003), (1, 2, 777), (0, 0, 7)])
def test_copy_kernel_copies_unaligned_and_ragged_buffers(dst_off, src_off, n):
    import torch

    lib, why = copies.load_library()
    assert lib is not None, why
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    src = torch.randint(0, 255, (n + 64,), dtype=torch.uint8, device="cuda", generator=gen)
    # a refused call first: the error it leaves in the runtime must not be reported by the copies below
    assert lib.memcpy_async(0, 0, 16, 0) != 0
    for vecs, streaming in copies.KERNEL_VARIANTS:
        dst = torch.zeros(n + 64, dtype=torch.uint8, device="cuda")
        st = lib.copy_kernel(dst.data_ptr() + dst_off, src.data_ptr() + src_off, n, vecs, streaming,
                             torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        assert st == 0, lib.error(st)
        assert torch.equal(dst[dst_off:dst_off + n], src[src_off:src_off + n]), (vecs, streaming, dst_off, src_off, n)
        assert not dst[:dst_off].any() and not dst[dst_off + n:].any(), "wrote outside the destination"
    dst = torch.zeros(n, dtype=torch.uint8, device="cuda")
    assert lib.memcpy_async(dst.data_ptr(), src.data_ptr(), n, torch.cuda.current_stream().cuda_stream) == 0
    torch.cuda.synchronize()
    assert torch.equal(dst, src[:n])
