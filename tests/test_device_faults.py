"""Device faults and writes after return: charged to the provider, to the right test, and
nothing later inherits them (docs/device-faults.md).

CI (no GPU) covers the plumbing with the fake checker (``KVX_CONFORM_FAKE_DEVICE_FAULT``,
kvx_conformance/abi/health.py): a fault reported right after one provider call must end that
test as ``crash`` (kind device-fault, entry point, case), a fresh worker must run the
rest, the circuit breaker must count it; a single process marks it and skips the rest.
The late-write mutants must be caught by the default command without a crash charged
to an entry point. On a GPU, ``test_cuda_faulting_provider`` runs the suites on a
CUDA provider that makes an illegal memory access on one kind of write and on its
non-faulting twin (csrc/testing/kvx_faulting.cu).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvx_conformance.abi import health, native
from kvx_conformance.abi.header import Memory
from kvx_conformance.cases.isolation import isolated_map
from kvx_conformance.harness.plugin.config import _RECORD_MARK, _START_MARK
from kvx_conformance.harness.plugin.controller import _Controller, _read_crash_detail

from test_cli_run import explain, kvx, lib, results  # tests/test_cli_run.py

SENTINEL = "write.slots.invalid_slot_sentinel*"
FAKE_ONE = "kvx_write_kv:*test_invalid_slot_sentinel?s32-minus7?"


def _run_with_fake(tmp: Path, fake: str, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = dict(os.environ, **{health.FAKE_ENV: fake})
    cmd = [str(Path(sys.executable).with_name("kvx-conform")), "run", "--output-dir", str(tmp), "--progress", "none",
           *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert (tmp / "results.json").exists(), explain(p)
    return p, results(tmp)


# ----------------------------------------------------------------------------- host: the plumbing


def test_fake_device_fault_charges_one_test_and_a_fresh_worker_runs_the_rest(tmp_path):
    p, doc = _run_with_fake(tmp_path, FAKE_ONE, "-n", "2", "--id", SENTINEL)  # default re-runs
    by = {t["id"]: t for t in doc["tests"]}
    bad = by["write.slots.invalid_slot_sentinel[s32-minus7]"]
    assert bad["outcome"] == "crash", explain(p)
    # the re-run pass runs it again on a fresh worker each time: a crash every time, no flaky
    assert doc["config"]["reruns"] == 3 and bad["attempts"] == ["crash"] * 4, bad.get("attempts")
    assert bad["crash"]["kind"] == "device-fault" and bad["crash"]["entry"] == "kvx_write_kv", bad
    assert bad["crash"]["error"] == "cudaErrorIllegalAddress" and "invalid_slot=-7" in bad["crash"]["case"], bad
    assert "device fault in kvx_write_kv" in bad["message"] and bad["repro"], bad
    others = [t for t in doc["tests"] if t is not bad]
    assert others and all(t["outcome"] == "pass" for t in others), [(t["id"], t["outcome"]) for t in others]
    assert doc["counts"]["error"] == 0
    assert "device fault in kvx_write_kv" in p.stdout  # the console names it


def test_fake_device_faults_trip_the_breaker_of_their_entry_point(tmp_path):
    # every fresh worker faults on its first sentinel write: 3 device faults trip kvx_write_kv; a test the
    # other of the 2 workers had already started when the third was recorded may fault too (one more at most).
    # The breaker counts in the main pass: no re-runs (each would be one more worker lost to a fault; a
    # faulting test's re-runs: the test above)
    p, doc = _run_with_fake(tmp_path, "kvx_write_kv:*test_invalid_slot_sentinel*", "-n", "2", "--id", SENTINEL,
                            "--reruns", "0")
    crashes = [t for t in doc["tests"] if t["outcome"] == "crash"]
    assert len(crashes) in (3, 4) and all(t["crash"]["kind"] == "device-fault" for t in crashes), explain(p)
    assert doc["breaker"]["kvx_write_kv"]["tripped"], doc["breaker"]
    assert doc["breaker"]["kvx_write_kv"]["count"] == len(crashes), doc["breaker"]
    assert doc["counts"]["error"] == 0
    skipped = [t for t in doc["tests"] if t["outcome"] == "skip"]
    assert skipped and all(t["breaker"] == "kvx_write_kv" for t in skipped)


def test_single_process_marks_the_fault_and_skips_the_rest(tmp_path):
    env = dict(os.environ, **{health.FAKE_ENV: FAKE_ONE})
    from kvx_conformance.results.certificate import suite_root

    root = suite_root("kvx_conformance.suites")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "pytest", "-p", "kvx_conformance.plugin", "-p", "no:cacheprovider", "-n", "0",
           "--rootdir", str(root), "-c", os.devnull, "--kvx-output-dir", str(out), "--kvx-progress", "none",
           "--kvx-id", SENTINEL, "-qq", "--pyargs", "kvx_conformance.suites"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    doc = results(out)
    order = [t["id"] for t in doc["tests"]]
    i = order.index("write.slots.invalid_slot_sentinel[s32-minus7]")
    bad = doc["tests"][i]
    assert bad["outcome"] == "crash" and bad["crash"]["kind"] == "device-fault", explain(p)
    after = doc["tests"][i + 1:]
    assert after and all(t["outcome"] == "skip" and "CUDA context was lost" in t["message"] for t in after), after
    assert all(t["outcome"] == "pass" for t in doc["tests"][:i])
    assert doc["counts"]["error"] == 0


def _controller(tmp: Path) -> SimpleNamespace:
    ctl = SimpleNamespace(state_dir=tmp, tainted={}, writer=None, metas={}, _late_printed=0, done=set(),
                          _amend={}, config=SimpleNamespace(getoption=lambda name: "sanitize-python.sh"),
                          rc=SimpleNamespace(memory=Memory.HOST))
    ctl._sanitizer_report = lambda fault: _Controller._sanitizer_report(ctl, fault)
    ctl._meta = lambda nodeid: {"id": nodeid.split("::")[-1]}
    ctl._print = lambda *a, **k: None
    ctl.late_writes_seen = lambda findings, wid, replaced=False: _Controller.late_writes_seen(ctl, findings, wid,
                                                                                              replaced)
    ctl._amend_late = lambda nodeid, row: None
    return ctl


def _fault_log(tmp: Path, wid: str, nodeid: str, *lines: str) -> None:
    d = tmp / "faults"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{wid}.log").write_text("\n".join([f"{_RECORD_MARK}" + json.dumps({"kind": "worker", "pid": 4242}),
                                             f"{_START_MARK}a.py::earlier", "noise",
                                             f"{_START_MARK}{nodeid}", *lines, ""]), encoding="utf-8")


def test_controller_turns_each_record_into_the_right_outcome(tmp_path):
    ctl = _controller(tmp_path)
    fault = {"kind": "device-fault", "error": "cudaErrorMisalignedAddress", "error_string": "misaligned address",
             "code": 716, "entry": "kvx_gather_kv", "case": "gather seed=3", "pid": 4242}
    _fault_log(tmp_path, "gw0", "m.py::t_fault", _RECORD_MARK + json.dumps(fault))
    head, frames, recs, in_py = _read_crash_detail(tmp_path, "gw0", "m.py::t_fault")
    res = _Controller.crash_result(ctl, "m.py::t_fault", "gw0", 0.1, 30, head, frames, recs, in_py)
    assert res["outcome"] == "crash" and res["crash"]["kind"] == "device-fault"
    assert res["crash"]["entry"] == "kvx_gather_kv" and res["crash"]["error"] == "cudaErrorMisalignedAddress"
    assert "device fault in kvx_gather_kv" in res["message"] and "gather seed=3" in res["detail"]
    # compute-sanitizer's log of that process names the kernel and the address
    (tmp_path / "faults" / "sanitizer-4242.log").write_text(
        "========= COMPUTE-SANITIZER\n========= Invalid __global__ write of size 1 bytes\n"
        "=========     at wild_store(unsigned long)+0x30\n=========     Address 0x9000 is out of bounds\n")
    res = _Controller.crash_result(ctl, "m.py::t_fault", "gw0", 0.1, 30, head, frames, recs, in_py)
    assert res["crash"]["sanitizer"] == "Invalid __global__ write of size 1 bytes"
    assert "wild_store" in res["detail"] and "0x9000" in res["detail"]

    # a signal in the test's thread: kind signal, the entry point from the frames
    _fault_log(tmp_path, "gw1", "m.py::t_segv", "Fatal Python error: Segmentation fault", "",
               "Current thread 0x01 (most recent call first):",
               '  File "/x/kvx_conformance/loader.py", line 140 in write_kv',
               '  File "/x/_pytest/python.py", line 1 in f')
    res = _Controller.crash_result(ctl, "m.py::t_segv", "gw1", 0.1, 30, *_read_crash_detail(tmp_path, "gw1",
                                                                                           "m.py::t_segv"))
    assert res["crash"] == {"kind": "signal", "entry": "kvx_write_kv"}
    assert "read-only while it runs on host memory" in res["message"]  # a store into an input faults there
    # a signal in a thread with no Python frame: a thread the provider left running
    _fault_log(tmp_path, "gw2", "m.py::t_thread", "Fatal Python error: Segmentation fault", "",
               "Thread 0x01 (most recent call first):", '  File "/x/_pytest/python.py", line 1 in f')
    res = _Controller.crash_result(ctl, "m.py::t_thread", "gw2", 0.1, 30, *_read_crash_detail(tmp_path, "gw2",
                                                                                             "m.py::t_thread"))
    assert res["crash"]["thread"] == "provider" and res["crash"]["possible_cause"]
    # the process just exited
    _fault_log(tmp_path, "gw3", "m.py::t_exit")
    res = _Controller.crash_result(ctl, "m.py::t_exit", "gw3", 0.1, 30, *_read_crash_detail(tmp_path, "gw3",
                                                                                           "m.py::t_exit"))
    assert res["crash"]["kind"] == "exit" and res["outcome"] == "crash"
    # a worker replaced after the lifetime test: that test keeps its own outcome
    late = {"kind": "late-write", "result": {"when": "call", "outcome": "fail", "message": "wrote after return"},
            "late": [{"what": "k cache: 8 byte(s)", "owner": "m.py::t_life", "where": "lifetime"}]}
    _fault_log(tmp_path, "gw4", "m.py::t_life", _RECORD_MARK + json.dumps(late))
    res = _Controller.crash_result(ctl, "m.py::t_life", "gw4", 0.1, 30, *_read_crash_detail(tmp_path, "gw4",
                                                                                           "m.py::t_life"))
    assert res["outcome"] == "fail" and "crash" not in res and "worker 'gw4' was replaced" in res["message"]
    # and a later crash in a worker with such a finding is marked (and kept off the breaker)
    ctl.tainted["gw1"] = "lifetime.no_write_after_return[write]"
    res = _Controller.crash_result(ctl, "m.py::t_segv", "gw1", 0.1, 30, *_read_crash_detail(tmp_path, "gw1",
                                                                                           "m.py::t_segv"))
    assert res["message"].startswith("possibly caused by writes after return detected in lifetime.no_write")
    assert res["crash"]["possible_cause"].startswith("writes after return detected in")


def test_one_check_defers_the_check_after_each_call_to_its_end(monkeypatch):
    """Within ``health.one_check`` (the stream-order check) provider calls are not followed by the
    device check; leaving it makes one check, charged to the entry it names, even when the body
    raised (a sticky fault can surface as the caller's own CUDA error first)."""
    entries, seen = [], []
    monkeypatch.setattr(health._Armed, "on", True)
    monkeypatch.setattr(health._Armed, "handler", seen.append)
    monkeypatch.setattr(health, "check", lambda entry="": entries.append(entry) or health.Fault(
        "device-fault", "cudaErrorIllegalAddress", "an illegal memory access was encountered", 700))
    with pytest.raises(health.DeviceFault):
        with health.one_check("kvx_write_kv / kvx_gather_kv"):
            health.after_call("kvx_write_kv")
            health.after_call("kvx_gather_kv")
            assert entries == [] and not health.armed()
    assert entries == ["kvx_write_kv / kvx_gather_kv"] and health.armed()
    assert [f.entry for f in seen] == ["kvx_write_kv / kvx_gather_kv"]
    with pytest.raises(health.DeviceFault):
        with health.one_check("kvx_gather_kv"):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
    assert entries[-1] == "kvx_gather_kv" and health.armed()


# ----------------------------------------------------------------------------- bench-style isolation


def _case(state, item):
    if item == "fault":  # as a sticky CUDA error would: every later check says so
        health._Armed.fake, health._Armed.fake_hit = ("*", "*"), True
        return {"value": "returned"}
    if item == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if item == "raise":
        raise ValueError("a case's own error")
    return {"value": item * state}


def test_isolated_map_records_the_faulting_case_and_runs_the_rest():
    out = isolated_map(_case, [1, "fault", 2, "segv", 3, "raise", 4], setup=int, setup_args=("10",))
    assert out[0] == {"value": 10} and out[2] == {"value": 20} and out[4] == {"value": 30} and out[6] == {"value": 40}
    assert out[1]["device_fault"]["error"] == "cudaErrorIllegalAddress"
    assert out[3] == {"crash": {"kind": "signal", "signal": "SIGSEGV"}}
    assert out[5] == {"error": "ValueError: a case's own error"}


# ----------------------------------------------------------------------------- late writers


@pytest.mark.parametrize("mutant", ["late_write", "late_write_delayed"])
def test_late_writer_is_named_and_nothing_is_blamed_on_other_entry_points(tmp_path, mutant):
    """The default command (here on the profiles where the late writes show) fails the
    provider for writes after return, and no crash is charged to an entry point."""
    p, _ = kvx("run", lib("mutant", mutant), "--output-dir", str(tmp_path), "--progress", "none",
               "--profile", "concurrency", "--profile", "core", "-n", "2")
    doc = results(tmp_path)
    assert p.returncode == 1, explain(p)
    assert doc["late_writes"], explain(p)
    failing = [t for t in doc["tests"] if t["outcome"] == "fail" and "after return" in t["message"] + str(
        t.get("failure"))]
    assert failing, explain(p)
    assert not any(b.get("tripped") for b in doc["breaker"].values()), doc["breaker"]
    charged = [t for t in doc["tests"] if t["outcome"] == "crash" and not (t.get("crash") or {}).get("possible_cause")]
    assert not charged, [(t["id"], t["message"][:200]) for t in charged]
    assert "writes after return" in p.stdout.split("== profiles")[0]


# ----------------------------------------------------------------------------- GPU


def gpu_reason(*variants: str) -> str | None:
    """Why a GPU test of the small CUDA test providers ``libkvx_testing_cuda_<variant>.so``
    (csrc/testing/kvx_faulting.cu; a variant named ``hwconv_*``: ``libkvx_testing_hwconv_*.so``,
    csrc/testing/hwconv; ``fp4_own_stream``: csrc/testing/kvx_defect_front.c) cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    if not native.have_cuda():
        return "the package was built without nvcc: the CUDA test providers are not built"
    for v in variants:
        name = v if v.startswith(("hwconv_", "fp4_")) else f"cuda_{v}"
        if not native.testing_provider(name).exists():
            return f"{native.testing_provider(name)} is not built"
    return None


def _gpu_reason() -> str | None:
    return gpu_reason("faulting", "twin")


@pytest.mark.skipif(_gpu_reason() is not None, reason=f"GPU only: {_gpu_reason()}")
def test_cuda_faulting_provider(tmp_path):
    """Zero error outcomes; the faulting writes are device-fault crashes of kvx_write_kv;
    every other test has its outcome on the non-faulting twin."""
    args = ["--memory", "device", "-n", "4", "--quick", "--breaker", "100000", "--progress", "none"]
    runs = {}
    for v in ("twin", "faulting"):
        p, _ = kvx("run", str(native.testing_provider(f"cuda_{v}")), "--output-dir", str(tmp_path / v), *args,
                   timeout=900)
        runs[v] = results(tmp_path / v)
        assert runs[v]["complete"], explain(p)
    twin = {t["nodeid"]: t for t in runs["twin"]["tests"]}
    got = {t["nodeid"]: t for t in runs["faulting"]["tests"]}
    assert runs["faulting"]["counts"]["error"] == 0 == runs["twin"]["counts"]["error"], \
        [t["message"][:300] for t in got.values() if t["outcome"] == "error"][:5]
    faults = [t for t in got.values() if t["outcome"] == "crash"]
    for t in faults:
        assert t["crash"]["kind"] == "device-fault", t
    # the twin's own faults (a real bug of this small provider is a real device fault) stay the same
    same = [t for t in faults if twin[t["nodeid"]]["outcome"] == "crash"]
    for t in same:
        assert twin[t["nodeid"]]["crash"]["entry"] == t["crash"]["entry"], (t, twin[t["nodeid"]])
    injected = [t for t in faults if t not in same]
    assert injected, "the faulting provider did not fault"
    for t in injected:
        assert t["crash"]["entry"] == "kvx_write_kv" and t["crash"]["error"] == "cudaErrorIllegalAddress", t
        assert "tokens=9" in (t["crash"]["case"] or "") or t["id"].startswith(("generated.", "differential.")), t
    differ = [(n, twin[n]["outcome"], t["outcome"]) for n, t in got.items()
              if t["outcome"] != "crash" and twin.get(n, {}).get("outcome") != t["outcome"]]
    assert not differ, differ
    summary = {v: runs[v]["counts"] for v in runs}
    print(json.dumps({"injected": sorted(t["id"] for t in injected), "twin_faults": sorted(t["id"] for t in same),
                      "counts": summary}))
