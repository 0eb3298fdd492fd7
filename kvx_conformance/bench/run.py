"""Run a preset: roofline, every case on the provider and its peers, checks, results document.

Device and unified memory are timed here (CUDA events, graph replay, host call cost:
:mod:`.timing`); host memory is timed by pytest-benchmark (``suites/bench/bench_host.py``,
driven by :func:`run_host`). Both produce the same results document (docs/benchmarks.md).
"""
from __future__ import annotations

import datetime as _dt
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

from .. import __version__
from .sweep import BenchCase

SCHEMA = "kvx-conform.bench/1"


def case_seed(case: BenchCase) -> int:
    return zlib.crc32(case.id.encode()) & 0x7FFFFFFF


def _log(msg: str, quiet: bool = False) -> None:
    if not quiet:
        print(msg, flush=True)


# ----------------------------------------------------------------------------- environment


def _nvidia_smi() -> dict:
    q = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit,temperature.gpu,pstate"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    if not out:
        return {}
    vals = [v.strip() for v in out[0].split(",")]
    return dict(zip(q.split(","), vals))


def _nvcc_version() -> str | None:
    try:
        out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln for ln in out.splitlines() if "release" in ln]
    return lines[0].strip() if lines else None


def environment(memory: str) -> dict:
    env = {"python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine(),
           "cpu_count": os.cpu_count(), "hostname_hash": f"{zlib.crc32(platform.node().encode()):08x}"}
    try:
        import numpy

        env["numpy"] = numpy.__version__
    except ImportError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    env["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
        if memory != "host" and torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            env["gpu"] = {"name": p.name, "sm_count": p.multi_processor_count,
                          "memory_bytes": p.total_memory, "l2_bytes": getattr(p, "L2_cache_size", None),
                          "capability": f"{p.major}.{p.minor}"}
            env["nvidia_smi"] = _nvidia_smi()
            env["cuda_driver"] = env["nvidia_smi"].get("driver_version")
            env["nvcc"] = _nvcc_version()
    except ImportError:
        env["torch"] = None
    return env


def provider_info(path: str | None) -> dict | None:
    if not path:
        return None
    from ..abi.loader import load_provider

    p = load_provider(path)
    return {"path": str(p.path), "name": p.path.name, "sha256": p.sha256, "abi_version": str(p.version())}


# ----------------------------------------------------------------------------- one case, one impl


def _bw(case: BenchCase, t_s: float | None) -> float | None:
    return case.bytes_moved() / t_s if t_s else None


def _figures(case: BenchCase, entry: dict, roofline: float | None, floor_s: float | None = None) -> dict:
    """Headline numbers of one implementation: device time (warm graph replay for the decode
    preset's cases, else graph replay when it worked, else events) and, with a floor, the excess."""
    src = entry.get("graph_warm") or entry.get("graph") or entry.get("events") or entry.get("host_timer")
    if not src:
        return entry
    t = src["median_s"]
    entry["time_s"] = t
    entry["time_source"] = ("graph_warm" if entry.get("graph_warm") else "graph" if entry.get("graph") else
                            "events" if entry.get("events") else "pytest-benchmark")
    if floor_s is not None and entry["time_source"] == "graph_warm":
        entry["excess_over_floor_s"] = t - floor_s
    entry["bandwidth_Bps"] = _bw(case, t)
    entry["bandwidth_p10_Bps"] = _bw(case, src["p90_s"])
    entry["bandwidth_p90_Bps"] = _bw(case, src["p10_s"])
    if roofline:
        entry["pct_roofline"] = 100.0 * entry["bandwidth_Bps"] / roofline
        if case.bytes_sector():
            entry["pct_sector_roofline"] = 100.0 * case.bytes_sector() / t / roofline
    return entry


def _time_device(timer, fn, nsets: int, graph: bool = True, replay: int = 0, before_replay=None,
                 no_graph_why: str = "not attempted (unified memory)") -> dict:
    """Eager (events) then graph timing of ``fn(set, stream)``; ``before_replay()`` runs before the
    last timed round of eager calls and between the capture and the first replay (the bench poisons
    the verified results there, so that what it verifies afterwards is timed work: the graph's, or
    where no graph is timed the last eager round's, repeats of calls already made); if a replay
    fails after it, every set is called again eagerly."""
    from .timing import CallFailed

    out: dict = {}
    try:
        inner, est = timer.plan(fn, nsets)
        out["inner_calls"] = inner
        out["events"], out["host"] = timer.events(fn, inner, before_last=before_replay)
    except CallFailed as e:
        return {"error": str(e)}
    if not graph:
        out["graph"] = None
        out["graph_error"] = no_graph_why
        return out
    poisoned = False

    def poison() -> None:
        nonlocal poisoned
        poisoned = True
        before_replay()

    hook = poison if before_replay is not None else None
    try:
        if replay:
            out["graph_warm"] = timer.graph_warm(fn, replay, before_replay=hook)
        else:
            out["graph"] = timer.graph(fn, nsets, inner, before_replay=hook)
    except Exception as e:  # capture refused (a call that synchronizes, allocates, ...)
        out["graph"] = None
        out["graph_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        import torch

        torch.cuda.synchronize()
        # one eager call after the failed capture: its status is recorded (a provider that keeps a stale
        # CUDA error from inside the capture answers it here, not in the next case)
        out["status_after_failed_capture"] = int(fn(0, timer.stream.cuda_stream) or 0)
        if poisoned:  # the poisoned results, made again by eager calls
            for i in range(1, nsets):
                fn(i, timer.stream.cuda_stream)
        timer.stream.synchronize()
    return out


def _device_setup(provider_path: str, reference_path: str | None, repeats: int, roof: float, peers: bool,
                  verify: bool, floor_s: float | None = None) -> dict:
    """The state of one case process (isolation.isolated_map): providers, timer, L2 size."""
    import torch

    from ..abi.loader import load_provider
    from .timing import DeviceTimer

    provider = load_provider(provider_path)
    reference = load_provider(reference_path) if reference_path and \
        Path(reference_path).resolve() != Path(provider_path).resolve() else None
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20) or (50 << 20)
    return {"provider": provider, "reference": reference, "l2": l2, "timer": DeviceTimer(repeats=repeats),
            "roof": roof, "peers": peers, "verify": verify, "floor_s": floor_s}


def _device_case(state: dict, case: BenchCase) -> dict:
    """Time one case on the provider, the reference and the torch peer."""
    import torch

    from .peers import torch_peer
    from .prepare import prepare

    timer, l2, roof, verify = state["timer"], state["l2"], state["roof"], state["verify"]
    floor_s = state.get("floor_s")
    rec: dict = {"case": case.to_dict(), "impls": {}}
    try:
        pr = prepare(case, seed=case_seed(case), last_level_cache=l2)
    except Exception as e:
        rec["error"] = f"setup: {type(e).__name__}: {e}"[:300]
        return rec
    rec["nsets"] = pr.nsets
    rec["working_set_bytes"] = pr.nsets * case.bytes_moved()
    rec["l2_bytes"] = l2
    rec["l2_resident"] = l2_resident(rec)
    impls = [("provider", state["provider"])] + ([("reference", state["reference"])] if state["reference"] else [])
    replay = case.replay if case.memory == "device" else 0
    # the set verified after timing: the warm replay's graph calls set 0 only, the other graphs every set
    vsets = (0,) if replay else (pr.nsets - 1,)
    poison = (lambda: pr.poison(vsets)) if verify else None
    for name, prov in impls:
        st = pr.call(prov, 0, timer.stream.cuda_stream)
        timer.stream.synchronize()
        if st != 0:
            rec["impls"][name] = {"status": int(st), "error": f"status {st} (not timed)"}
            continue
        e = _time_device(timer, lambda i, s, p=prov: pr.call(p, i, s), pr.nsets, graph=case.memory != "unified",
                         replay=replay, before_replay=poison)
        e["status"] = 0
        if verify and "error" not in e:
            e["verified"] = _verified(pr, vsets, e)
        rec["impls"][name] = _figures(case, e, roof, floor_s)
    if state["peers"] and case.memory == "device" and large_case(rec):
        rec["impls"]["copy"] = _same_bytes_copy(timer, case, roof)
    if state["peers"] and case.memory == "device":
        fn, desc = torch_peer(pr)
        if fn is not None:
            try:
                e = _time_device(timer, fn, pr.nsets, replay=case.replay, before_replay=poison)
                e["what"] = desc
                if verify and "error" not in e:
                    e["verified"] = _verified(pr, vsets, e)
                rec["impls"]["torch"] = _figures(case, e, roof, floor_s)
            except Exception as ex:
                rec["impls"]["torch"] = {"error": f"{type(ex).__name__}: {ex}"[:300], "what": desc}
    rec["ratios"] = _ratios(rec["impls"])
    del pr
    gc.collect()
    torch.cuda.empty_cache()
    return rec


#: a large case moves at least this many bytes (summary.large_*, and the cases timed beside a copy of their bytes)
LARGE_BYTES = 256e6
SAME_BYTES_WHAT = ("torch.Tensor.copy_ device-to-device of bytes_moved / 2 bytes (the case's bytes moved, read "
                   "and written), CUDA events over back-to-back copies, as the roofline's")
#: why the copy has no graph figure
SAME_BYTES_NO_GRAPH = ("not attempted: a copy captured in a CUDA graph may become a memcpy node the copy engines "
                       "serve, slower than the stream's copy (on an H200 it read 1.5x the events' time)")


def large_case(rec: dict) -> bool:
    """Whether a case is a large one (``summary.large_*``), timed beside a copy of its bytes: at least
    ``LARGE_BYTES`` moved, its working set past the L2."""
    return rec["case"]["bytes_moved"] >= LARGE_BYTES and not l2_resident(rec)


def _same_bytes_copy(timer, case: BenchCase, roof: float | None) -> dict:
    """A copy of the case's bytes (``bytes_moved / 2`` read and as many written, between two buffers of
    its own) timed by CUDA events over back-to-back copies, as the roofline's copies are (a graph's
    memcpy node may run on the copy engines instead): what the best copy reaches at this size, where
    launch, ramp and tail weigh more than in the 1 GiB roofline (docs/benchmarks.md, "Method").
    Verified once (the destination equals the source)."""
    import torch

    n = int(case.bytes_moved()) // 2
    try:
        src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
    except Exception as ex:  # noqa: BLE001 - no room for the copy's buffers: recorded, the case stands
        return {"error": f"{type(ex).__name__}: {ex}"[:300], "what": SAME_BYTES_WHAT}

    def fn(i, stream=None):
        dst.copy_(src)
        return 0

    try:
        e = _time_device(timer, fn, 1, graph=False, no_graph_why=SAME_BYTES_NO_GRAPH)
        e["what"] = SAME_BYTES_WHAT
        torch.cuda.synchronize()
        e["copied_equal"] = bool(torch.equal(dst, src))
        return _figures(case, e, roof)
    finally:
        del src, dst


#: ``verified.after``: which calls made the checked results, each zeroed first; what a failed check says first
VERIFIED_AFTER = {
    "graph replay": "after the timed CUDA-graph replays (results zeroed once the graph was captured), which must do "
                    "the work of the eager calls on the stream they are given: ",
    "eager calls": "after the last timed round of eager calls (results zeroed before it; each of its calls repeats "
                   "one made before, and a repeated call must do its work again, spec 7.2): ",
    "a repeat of the timed calls": "after a repeat of the timed calls (results zeroed before it; a repeated call must "
                                   "do its work again, spec 7.2): ",
}


def label_verified(v: dict, after: str) -> dict:
    """``v`` (:meth:`Prepared.verify`) with ``after`` (a key of VERIFIED_AFTER) recorded and named
    in its first problem."""
    v["after"] = after
    if not v["ok"]:
        v["problems"] = [VERIFIED_AFTER[after] + v["problems"][0], *v["problems"][1:]]
    return v


def _verified(pr, vsets: tuple[int, ...], e: dict) -> dict:
    """The oracle check of the results the timing left, poisoned before the timed work that made
    them: after a graph's replays (poisoned between its capture and its first replay) they are the
    graph's work, else the last eager round's; a failure says which."""
    return label_verified(pr.verify(vsets), "graph replay" if e.get("graph") or e.get("graph_warm") else "eager calls")


def l2_resident(rec: dict) -> bool:
    """True when a case's working set (the bytes one round of its calls touches) fits in the
    device's L2 (``working_set_bytes <= l2_bytes``): its calls may be served by the cache, so it
    is not held to the DRAM copy roofline (left out of ``summary.large_*`` and of the targets'
    verdicts; docs/benchmarks.md, "Working sets")."""
    ws, l2 = rec.get("working_set_bytes"), rec.get("l2_bytes")
    return bool(ws and l2 and ws <= l2)


def _faulted_record(case: BenchCase, out: dict) -> dict:
    """The record of a case that left a device fault or whose process died (the rest ran on)."""
    rec: dict = {"case": case.to_dict(), "impls": {}}
    if "device_fault" in out:
        f = out["device_fault"]
        rec["device_fault"] = {k: f.get(k) for k in ("error", "error_string", "entry", "case")}
        rec["error"] = f"device fault: {f.get('error')} ({f.get('error_string')}); the case process was replaced"
    elif "crash" in out:
        rec["crash"] = out["crash"]
        rec["error"] = f"the case process died ({out['crash']}); it was replaced"
    else:
        rec["error"] = out.get("error", "no result")
    return rec


def run_device(provider_path: str, cases: list[BenchCase], *, reference_path: str | None, peers: bool = True,
               repeats: int = 11, quiet: bool = False, verify: bool = True,
               partial: Path | None = None) -> dict:
    """Time every case on device/unified memory. ``partial``: a JSON-lines file that gets each
    case's record as it finishes (what is left if the run is cut short).

    The cases run in a child process (:func:`~kvx_conformance.cases.isolation.isolated_map`): a case
    whose provider call leaves a device fault (or crashes) is recorded as such and a fresh
    process times the rest."""
    from ..cases.isolation import isolated_map
    from .timing import device_copy_roofline

    t0 = time.monotonic()
    roof_start = device_copy_roofline()
    _log(f"roofline (start): {roofline_line(roof_start)}", quiet)
    roof = roof_start["bandwidth_Bps"]
    from .timing import DeviceTimer

    replay = max((c.replay for c in cases if c.memory == "device"), default=0)
    floor_timer = DeviceTimer(repeats=repeats) if replay else None
    floor_start = floor_timer.floor(replay) if replay else None
    if floor_start:
        _log(f"floor (start): {floor_start['what']}, {replay} launches per graph, warm: "
             f"{floor_start['median_s'] * 1e6:.3f} us per launch", quiet)
    floor_s = floor_start["median_s"] if floor_start else None
    results: list = [None] * len(cases)

    def finished(n: int, out) -> None:
        case = cases[n]
        rec = out if isinstance(out, dict) and "case" in out else _faulted_record(case, out or {})
        results[n] = rec
        if partial is not None:
            with open(partial, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec, default=float) + "\n")
        p = rec["impls"].get("provider", {})
        tq = rec["impls"].get("torch", {})
        ver = p.get("verified", {}).get("ok")
        if rec.get("error") and not rec["impls"]:
            _log(f"[{n + 1}/{len(cases)}] {case.id}: {rec['error']}", quiet)
            return
        _log(f"[{n + 1}/{len(cases)}] {case.id}: "
             + (f"{p['bandwidth_Bps'] / 1e9:8.1f} GB/s {p.get('pct_roofline', 0):5.1f}% {p['time_s'] * 1e6:9.2f} us"
                if p.get("bandwidth_Bps") else f"{p.get('error', 'no figure')}")
             + (f"  +{p['excess_over_floor_s'] * 1e6:.2f} us over the floor" if "excess_over_floor_s" in p else "")
             + (f"  torch {tq['bandwidth_Bps'] / 1e9:7.1f} GB/s" if tq.get("bandwidth_Bps") else "")
             + f"  verified={ver}", quiet)

    isolated_map(_device_case, cases, setup=_device_setup,
                 setup_args=(provider_path, reference_path, repeats, roof, peers, verify, floor_s),
                 on_result=finished)
    results = [r if r is not None else _faulted_record(c, {}) for r, c in zip(results, cases)]
    roof_end = device_copy_roofline()
    _log(f"roofline (end): {roofline_line(roof_end)}; run {time.monotonic() - t0:.0f} s", quiet)
    floor = None
    if floor_start:
        floor_end = floor_timer.floor(replay)
        _log(f"floor (end): {floor_end['median_s'] * 1e6:.3f} us per launch", quiet)
        floor = {"time_s": floor_s, "method": floor_start["what"], "calls_per_graph": replay,
                 "start": floor_start, "end": floor_end,
                 "drift_pct": 100.0 * (floor_end["median_s"] - floor_s) / floor_s}
    return {"roofline": {"start": roof_start, "end": roof_end, "bandwidth_Bps": roof,
                         "method": roof_start["method"], "winner": roof_start.get("winner"),
                         "drift_pct": 100.0 * (roof_end["bandwidth_Bps"] - roof) / roof},
            "floor": floor,
            "cases": results, "elapsed_s": time.monotonic() - t0,
            "timing": {"device": "CUDA events over back-to-back calls (eager), CUDA graph replay (device time), "
                                 "host perf_counter per call", "repeats": repeats,
                       "headline": "graph replay median when capture worked, else events median; decode "
                                   "preset: warm graph replay median (graph_warm), and its excess over the floor",
                       "isolation": "cases run in a child process; a case that leaves a device fault or crashes "
                                    "is recorded (device_fault / crash) and a fresh process runs the rest"}}


def roofline_line(r: dict) -> str:
    """One line for a roofline record: the winner's bandwidth and method, every method's figure, notes."""
    ms = ", ".join(f"{m['id']} {m['bandwidth_Bps'] / 1e9:.0f}" if m.get("bandwidth_Bps") else f"{m['id']} -"
                   for m in r.get("methods") or [])
    return (f"{r['bandwidth_Bps'] / 1e9:.0f} GB/s, best of the device-to-device copies: {r.get('winner', r['method'])}"
            + (f" (GB/s: {ms})" if ms else "") + "".join(f"; {n}" for n in r.get("notes") or []))


def _ratios(impls: dict) -> dict:
    p = impls.get("provider", {}).get("bandwidth_Bps")
    out = {}
    for other in ("reference", "torch", "numpy", "copy"):
        o = impls.get(other, {}).get("bandwidth_Bps")
        if p and o:
            out[f"provider_over_{other}"] = p / o
    return out


# ----------------------------------------------------------------------------- host (pytest-benchmark)


def run_host(provider_path: str, cases: list[BenchCase], *, reference_path: str | None, peers: bool = True,
             rounds: int = 7, quiet: bool = False, workdir: Path) -> dict:
    """Time host-memory cases with pytest-benchmark (suites/bench/bench_host.py) and collect its stats."""
    import pytest

    from .sweep import BenchCase as _BC  # noqa: F401

    workdir.mkdir(parents=True, exist_ok=True)
    status_log = workdir / "statuses.jsonl"  # calls answered with a non-OK status (not timed)
    status_log.unlink(missing_ok=True)
    plan = {"provider": provider_path, "reference": reference_path if reference_path and Path(
        reference_path).resolve() != Path(provider_path).resolve() else None,
            "peers": peers, "rounds": rounds, "cases": [c.to_dict() for c in cases], "status_log": str(status_log)}
    plan_path = workdir / "bench-plan.json"
    plan_path.write_text(json.dumps(plan), encoding="utf-8")
    out_json = workdir / "pytest-benchmark.json"
    out_json.unlink(missing_ok=True)
    suite = Path(__file__).resolve().parent.parent / "suites" / "bench" / "bench_host.py"
    if not suite.exists():
        from .. import suites

        suite = Path(suites.__file__).resolve().parent / "bench" / "bench_host.py"
    ini = workdir / "pytest.ini"
    ini.write_text("[pytest]\naddopts =\n", encoding="utf-8")
    autoload_off = bool(os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"))
    args = ["-c", str(ini), "--rootdir", str(workdir), *(["-p", "pytest_benchmark.plugin"] if autoload_off else []),
            "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "--benchmark-json", str(out_json), "--benchmark-save-data",
            "--benchmark-disable-gc", "--benchmark-sort", "name", "-W", "ignore::DeprecationWarning",
            str(suite)]
    if quiet:
        args.append("--benchmark-quiet")
    t0 = time.monotonic()
    # pytest-benchmark turns itself off inside an xdist worker (PYTEST_XDIST_WORKER): this session is not one
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("PYTEST_XDIST") or k == "KVX_BENCH_PLAN"}
    os.environ["KVX_BENCH_PLAN"] = str(plan_path)
    try:
        rc = int(pytest.main(args, plugins=[]))
    finally:
        os.environ.pop("KVX_BENCH_PLAN", None)
        os.environ.update(saved)
    if not out_json.exists():
        raise RuntimeError(f"pytest-benchmark wrote no results (pytest exit status {rc})")
    pb = json.loads(out_json.read_text(encoding="utf-8"))
    statuses = {}
    if status_log.exists():
        for line in status_log.read_text(encoding="utf-8").splitlines():
            e = json.loads(line)
            statuses[(e["case"], e["impl"])] = int(e["status"])
    return collect_host(pb, cases, time.monotonic() - t0, rc, statuses)


def _pb_stats(b: dict) -> dict:
    from .timing import stats

    data = b["stats"].get("data")
    st = stats(data) if data else {"median_s": b["stats"]["median"], "p10_s": b["stats"]["q1"],
                                   "p90_s": b["stats"]["q3"], "mean_s": b["stats"]["mean"],
                                   "min_s": b["stats"]["min"], "max_s": b["stats"]["max"],
                                   "cv": b["stats"]["stddev"] / b["stats"]["mean"], "rounds": b["stats"]["rounds"]}
    st["pytest_benchmark"] = {k: b["stats"][k] for k in ("min", "max", "mean", "stddev", "median", "iqr", "q1", "q3",
                                                          "rounds", "iterations", "ops") if k in b["stats"]}
    return st


def collect_host(pb: dict, cases: list[BenchCase], elapsed: float, rc: int,
                 statuses: dict[tuple[str, str], int] | None = None) -> dict:
    """``statuses``: (case id, impl) -> the non-OK status a call answered (it was not timed)."""
    statuses = statuses or {}
    by_case: dict[str, dict] = {}
    roof = None
    for b in pb.get("benchmarks", []):
        info = b.get("extra_info", {})
        if info.get("kind") == "roofline":
            st = _pb_stats(b)
            roof = {"method": "numpy.copyto host-to-host, pytest-benchmark", "bytes_copied": info["bytes"],
                    "bytes_moved": 2 * info["bytes"], "bandwidth_Bps": 2 * info["bytes"] / st["median_s"],
                    "bandwidth_p10_Bps": 2 * info["bytes"] / st["p90_s"],
                    "bandwidth_p90_Bps": 2 * info["bytes"] / st["p10_s"], "time": st, "verified": info.get("verified")}
            continue
        cid, impl = info.get("case"), info.get("impl")
        if not cid:
            continue
        e = {"host_timer": _pb_stats(b), "status": info.get("status", 0), "verified": info.get("verified"),
             "nsets": info.get("nsets")}
        if info.get("what"):
            e["what"] = info["what"]
        by_case.setdefault(cid, {})[impl] = e
    rbw = roof["bandwidth_Bps"] if roof else None
    results = []
    for c in cases:
        rec = {"case": c.to_dict(), "impls": {}}
        for impl, e in by_case.get(c.id, {}).items():
            rec["nsets"] = e.pop("nsets", None)
            rec["impls"][impl] = _figures(c, e, rbw)
        for (cid, impl), st in statuses.items():
            if cid == c.id and impl not in rec["impls"]:
                rec["impls"][impl] = {"status": st, "error": f"status {st} (not timed)"}
        if not rec["impls"]:
            rec["error"] = "not timed (see the pytest-benchmark output: setup failed or the call was refused)"
        rec["ratios"] = _ratios(rec["impls"])
        results.append(rec)
    return {"roofline": {"start": roof, "end": None, "bandwidth_Bps": rbw, "method": roof["method"] if roof else None,
                         "drift_pct": None},
            "cases": results, "elapsed_s": elapsed, "pytest_exit_status": rc,
            "timing": {"host": "pytest-benchmark pedantic rounds of one call each (rotating input sets), "
                               "after warm-up rounds; its statistics are kept under pytest_benchmark",
                       "machine_info": pb.get("machine_info"), "pytest_benchmark_version": pb.get("version")}}


# ----------------------------------------------------------------------------- document


def rederive(doc: dict) -> dict:
    """Recompute the derived sector-bound fields of a results document from its measured times.

    ``bytes_sector`` / ``pct_sector_roofline`` follow :meth:`BenchCase.bytes_sector`; documents
    written before its definition settled (read + write of a sector per piece) get it here.
    """
    roof = (doc.get("roofline") or {}).get("bandwidth_Bps")
    for rec in doc.get("cases", []):
        c = BenchCase.from_dict(rec["case"])
        sector = c.bytes_sector()
        rec["case"]["bytes_sector"] = sector
        for e in (rec.get("impls") or {}).values():
            e.pop("pct_sector_roofline", None)
            if sector and roof and e.get("time_s"):
                e["pct_sector_roofline"] = 100.0 * sector / e["time_s"] / roof
    return doc


def results_document(*, preset: str, memory: str, provider_path: str, reference_path: str | None,
                     body: dict, command: list[str] | None, label: str | None = None,
                     claimed_features: list[str] | None = None) -> dict:
    doc = {
        "schema": SCHEMA,
        "harness": {"name": "kvx-conform", "version": __version__},
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "label": label,
        "command": command,
        "preset": preset,
        "memory": memory,
        "provider": provider_info(provider_path),
        "reference": provider_info(reference_path) if reference_path else None,
        "environment": environment(memory),
        "claimed_features": sorted(claimed_features or ()),
        "bytes_moved": {
            "write": "2*T*H*D*(io_size+cache_size) + T*8 (S64 slots) [+ 8 bytes of FP8 scales]",
            "gather": "2*R*H*D*(cache_size+io_size) + table bytes (PACKED seqs*ceil(L/bs)*4, RAGGED R*4+(seqs+1)*4, "
                      "KV_OFFSETS seqs*2*ceil(L/bs)*4) + seqs*4 lengths",
            "convention": "bytes read plus bytes written, as the copy roofline counts them",
        },
        **body,
    }
    doc["summary"] = summarize(doc)
    return doc


#: statuses a provider refuses a call with (spec 8): UNSUPPORTED, or INVALID_ARGUMENT for a
#: field it does not serve
REFUSALS = {1: "INVALID_ARGUMENT", 2: "UNSUPPORTED"}


def refusal(rec: dict, claimed: set[str], served: set[str] = frozenset()) -> dict | None:
    """The refusal of an optional feature a case records, or None: the provider answered
    UNSUPPORTED or INVALID_ARGUMENT (not timed) for a case that exercises an optional
    feature the provider neither claims nor served in another, timed case of the same
    operation (``served``: the features timed writes, or timed gathers, served); those
    features are the refusal's (docs/benchmarks.md, "Refused cases")."""
    p = rec.get("impls", {}).get("provider", {})
    st = p.get("status")
    if p.get("bandwidth_Bps") or st not in REFUSALS:
        return None
    feats = [f for f in BenchCase.from_dict(rec["case"]).features() if f not in claimed and f not in served]
    if not feats:
        return None
    return {"id": rec["case"]["id"], "status": REFUSALS[st], "features": feats}


def summarize(doc: dict) -> dict:
    cases = doc.get("cases", [])
    claimed = set(doc.get("claimed_features") or ())
    ok = [r for r in cases if r["impls"].get("provider", {}).get("bandwidth_Bps")]
    failed_verify = [r["case"]["id"] for r in ok if r["impls"]["provider"].get("verified")
                     and not r["impls"]["provider"]["verified"].get("ok")]
    served: dict[str, set[str]] = {}  # per operation: serving HND gathers commits no HND writes
    for r in ok:
        c = BenchCase.from_dict(r["case"])
        served.setdefault(c.op, set()).update(c.features())
    refused = [x for x in (refusal(r, claimed, served.get(r["case"].get("op"), set())) for r in cases) if x]
    refused_ids = {x["id"] for x in refused}
    resident = [r for r in ok if l2_resident(r)]
    big = [r for r in ok if large_case(r)]
    small = [r for r in ok if r["case"]["rows"] <= 256]
    pct = [r["impls"]["provider"].get("pct_roofline") for r in big if r["impls"]["provider"].get("pct_roofline")]
    of_copy = [100.0 * r["ratios"]["provider_over_copy"] for r in big if (r.get("ratios") or {}).get("provider_over_copy")]
    copy_pct = [r["impls"]["copy"]["pct_roofline"] for r in big if (r["impls"].get("copy") or {}).get("pct_roofline")]
    excess = sorted(r["impls"]["provider"]["excess_over_floor_s"] * 1e6 for r in ok
                    if r["impls"]["provider"].get("excess_over_floor_s") is not None)
    floor = doc.get("floor") or {}
    return {
        "cases": len(cases), "timed": len(ok),
        "errors": [r["case"]["id"] for r in cases if r["case"]["id"] not in refused_ids and (
            r.get("error") or not r["impls"].get("provider", {}).get("bandwidth_Bps"))],
        "refused": refused,
        "refused_features": sorted({f for x in refused for f in x["features"]}),
        "verification_failures": failed_verify,
        "l2_resident_cases": len(resident),
        "large_l2_resident": [r["case"]["id"] for r in resident if r["case"]["bytes_moved"] >= LARGE_BYTES],
        "large_cases": len(big),
        "large_pct_roofline_min": min(pct) if pct else None,
        "large_pct_roofline_median": statistics.median(pct) if pct else None,
        "large_pct_copy_same_bytes_min": min(of_copy) if of_copy else None,
        "large_pct_copy_same_bytes_median": statistics.median(of_copy) if of_copy else None,
        "large_copy_same_bytes_pct_roofline_median": statistics.median(copy_pct) if copy_pct else None,
        "small_time_us_max": max((r["impls"]["provider"]["time_s"] * 1e6 for r in small), default=None),
        "small_time_us_median": (statistics.median(r["impls"]["provider"]["time_s"] * 1e6 for r in small)
                                 if small else None),
        "floor_us": floor["time_s"] * 1e6 if floor.get("time_s") else None,
        "decode_cases": len(excess),
        "decode_excess_us_median": statistics.median(excess) if excess else None,
        "decode_excess_us_max": excess[-1] if excess else None,
    }


def decode_table(doc: dict) -> list[dict]:
    """The decode preset's rows: case, per-call time, its excess over the floor (µs), verified."""
    rows = []
    for r in doc.get("cases", []):
        c = r["case"]
        if not c.get("replay"):
            continue
        p = r["impls"].get("provider", {})
        rows.append({"id": c["id"], "op": c["op"], "layout": c["layout"], "dtype": c["dtype"], "io": c["io_dtype"],
                     "tokens": c["tokens"], "scale": c.get("scale", 1.0), "cache_blocks": c.get("cache_blocks"),
                     "us": p["time_s"] * 1e6 if p.get("time_s") else None,
                     "excess_us": (p["excess_over_floor_s"] * 1e6 if p.get("excess_over_floor_s") is not None
                                   else None),
                     "p10_us": ((p.get("graph_warm") or {}).get("p10_s") or 0) * 1e6 or None,
                     "p90_us": ((p.get("graph_warm") or {}).get("p90_s") or 0) * 1e6 or None,
                     "verified": (p.get("verified") or {}).get("ok"), "error": r.get("error") or p.get("error")})
    return rows


def write_json(doc: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=float), encoding="utf-8")
