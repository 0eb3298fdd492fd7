"""The stream-order checks (`stream.order`, `stream.order_convert`, suites/conformance/test_s7_concurrency.py)
bite: on a GPU, the small CUDA test provider with its work on a stream of its own (csrc/testing/kvx_faulting.cu,
KVX_OWN_STREAM=1) fails both, naming what ran out of order; the build with only its converting calls on a
stream of its own (KVX_OWN_STREAM=2) fails the converting check alone; its twin, which works on the caller's
stream, and the bundled reference pass both. Skips without a CUDA GPU (CI); run on the device machine."""
from __future__ import annotations

import pytest

from kvx_conformance.abi import native

from test_cli_run import explain, kvx, results  # tests/test_cli_run.py
from test_device_faults import gpu_reason  # tests/test_device_faults.py

WHY_NOT = gpu_reason("twin", "own_stream", "own_stream_convert")


@pytest.mark.skipif(WHY_NOT is not None, reason=f"GPU only: {WHY_NOT}")
@pytest.mark.parametrize("provider,outcomes", [
    ("cuda_own_stream", {"stream.order": "fail", "stream.order_convert": "fail"}),
    ("cuda_own_stream_convert", {"stream.order": "pass", "stream.order_convert": "fail"}),
    ("cuda_twin", {"stream.order": "pass", "stream.order_convert": "pass"}),
    (None, {"stream.order": "pass", "stream.order_convert": "pass"}),
])
def test_stream_order_verdict(tmp_path, provider, outcomes):
    """On device memory: fail where a call's work leaves the caller's stream, pass where it keeps
    the stream's order (R-STREAM)."""
    lib = [str(native.testing_provider(provider))] if provider else []
    p, _ = kvx("run", *lib, "--memory", "device", "--id", "stream.order*", "--output-dir", str(tmp_path),
               "--progress", "none", timeout=300)
    got = {t["id"]: t for t in results(tmp_path)["tests"]}
    assert {i: t["outcome"] for i, t in got.items()} == outcomes, explain(p)
    for i, t in got.items():
        if outcomes[i] == "fail":
            msg = t["message"]
            assert "calls on one stream ran outside its order" in msg and "zeros" in msg, msg
            assert t["repro"].startswith("kvx-conform run "), t
