"""The threads-on-streams check (`concurrency.threads.streams`, suites/conformance/test_s7_concurrency.py)
bites: on a GPU, the small CUDA test provider whose calls share one device scratch buffer, guarded
by a lock held only while a call enqueues its work (csrc/testing/kvx_faulting.cu, KVX_SHARED_SCRATCH),
passes the threads checks on the NULL stream (one stream orders its calls) and fails both forms of
the check where each thread calls on a stream of its own; its twin and the bundled reference pass
every one. Skips without a CUDA GPU (CI); run on the device machine."""
from __future__ import annotations

import pytest

from kvx_conformance.abi import native

from test_cli_run import explain, kvx, results  # tests/test_cli_run.py
from test_device_faults import gpu_reason  # tests/test_device_faults.py

WHY_NOT = gpu_reason("twin", "shared_scratch")
#: the threads checks of the core path: on the NULL stream, and each thread on a stream of its own
IDS = ("concurrency.threads.write_disjoint", "concurrency.threads.gather", "concurrency.threads.streams[write]",
       "concurrency.threads.streams[gather]")


@pytest.mark.skipif(WHY_NOT is not None, reason=f"GPU only: {WHY_NOT}")
@pytest.mark.parametrize("provider", ["cuda_shared_scratch", "cuda_twin", None])
def test_threads_on_streams_of_their_own(tmp_path, provider):
    lib = [str(native.testing_provider(provider))] if provider else []
    ids = [a for i in IDS for a in ("--id", i)]
    p, _ = kvx("run", *lib, "--memory", "device", *ids, "--output-dir", str(tmp_path), "--progress", "none",
               timeout=300)
    got = {t["id"]: t for t in results(tmp_path)["tests"]}
    assert sorted(got) == sorted(IDS), explain(p)
    defective = provider == "cuda_shared_scratch"
    want = {i: "fail" if defective and i.startswith("concurrency.threads.streams") else "pass" for i in IDS}
    assert {i: t["outcome"] for i, t in got.items()} == want, explain(p)
    if defective:
        for i in ("concurrency.threads.streams[write]", "concurrency.threads.streams[gather]"):
            msg = got[i]["message"]
            assert "each thread on a stream of its own" in msg and "thread-safe on disjoint cache regions" in msg, msg
