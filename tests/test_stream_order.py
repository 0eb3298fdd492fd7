"""The stream-order check (`stream.order`, suites/conformance/test_s7_concurrency.py) bites: on a GPU,
the small CUDA test provider with its work on a stream of its own (csrc/testing/kvx_faulting.cu,
KVX_OWN_STREAM) fails it, naming what ran out of order; its twin, which works on the caller's stream,
and the bundled reference pass it. Skips without a CUDA GPU (CI); run on the device machine."""
from __future__ import annotations

import pytest

from kvx_conformance.abi import native

from test_cli_run import explain, kvx, results  # tests/test_cli_run.py
from test_device_faults import gpu_reason  # tests/test_device_faults.py


WHY_NOT = gpu_reason("twin", "own_stream")


@pytest.mark.skipif(WHY_NOT is not None, reason=f"GPU only: {WHY_NOT}")
@pytest.mark.parametrize("provider,outcome", [("cuda_own_stream", "fail"), ("cuda_twin", "pass"), (None, "pass")])
def test_stream_order_verdict(tmp_path, provider, outcome):
    """`stream.order` on device memory: fail for the provider whose work leaves the caller's stream,
    pass for the twin on the caller's stream and for the bundled reference (R-STREAM)."""
    lib = [str(native.testing_provider(provider))] if provider else []
    p, _ = kvx("run", *lib, "--memory", "device", "--id", "stream.order", "--output-dir", str(tmp_path),
               "--progress", "none", timeout=300)
    tests = results(tmp_path)["tests"]
    assert [t["outcome"] for t in tests] == [outcome], explain(p)
    if outcome == "fail":
        msg = tests[0]["message"]
        assert "calls on one stream ran outside its order" in msg and "zeros" in msg, msg
        assert tests[0]["repro"].startswith("kvx-conform run "), tests[0]
