"""The stream-order checks (`stream.order`, `stream.order_decode`, `stream.order_convert`,
`stream.order_fp8`, `stream.order_fp4`, suites/conformance/test_s7_concurrency.py) bite: on a GPU, the small CUDA test
provider with its work on a stream of its own (csrc/testing/kvx_faulting.cu, KVX_OWN_STREAM=1) fails the
three it serves, naming what ran out of order; the build with only its converting calls on a stream of its
own (KVX_OWN_STREAM=2) fails the converting check alone, the build with only its calls of at most 256 rows
there (KVX_OWN_STREAM=3) the decode-sized check alone; the independent hwconv device provider with only
its quantizing FP8 writes on a stream of its own (csrc/testing/hwconv, KVX_HW_OWN_STREAM_FP8) fails the FP8
check alone; the bundled reference behind a front that puts its FP4 calls' work on a stream of its own
(csrc/testing/kvx_defect_front.c, FRONT_OWN_STREAM) fails the FP4 check alone, for each format; the twins, which work on
the caller's stream, and the bundled reference pass every check they serve. Skips without a CUDA GPU (CI); run on the device machine."""
from __future__ import annotations

import pytest

from kvx_conformance.abi import native

from test_cli_run import explain, kvx, results  # tests/test_cli_run.py
from test_device_faults import gpu_reason  # tests/test_device_faults.py

WHY_NOT = gpu_reason("twin", "own_stream", "own_stream_convert", "own_stream_small", "hwconv_cuda",
                     "hwconv_cuda_own_stream_fp8", "fp4_own_stream")
#: outcomes of stream.order, stream.order_decode, stream.order_convert, stream.order_fp8, stream.order_fp4
P, F, U = "pass", "fail", "unsupported"


def _outcomes(plain: str, decode: str, convert: str, fp8: str, fp4: str) -> dict:
    return {"stream.order": plain, "stream.order_decode": decode, "stream.order_convert": convert,
            "stream.order_fp8": fp8, **{f"stream.order_fp4[{f}]": fp4 for f in ("nvfp4", "mxfp4", "mxfp4_ocp")}}


@pytest.mark.skipif(WHY_NOT is not None, reason=f"GPU only: {WHY_NOT}")
@pytest.mark.parametrize("provider,outcomes", [
    ("cuda_own_stream", _outcomes(F, F, F, U, U)),  # the small CUDA test provider serves no FP8, no FP4
    ("cuda_own_stream_convert", _outcomes(P, P, F, U, U)),
    ("cuda_own_stream_small", _outcomes(P, F, P, U, U)),  # its calls of at most 256 rows alone off the stream
    ("cuda_twin", _outcomes(P, P, P, U, U)),
    ("hwconv_cuda_own_stream_fp8", _outcomes(P, P, P, F, U)),  # its quantizing writes alone off the stream
    ("hwconv_cuda", _outcomes(P, P, P, P, U)),  # hwconv serves no FP4
    ("fp4_own_stream", _outcomes(P, P, P, P, F)),  # the reference, its FP4 calls alone off the stream
    (None, _outcomes(P, P, P, P, P)),
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


@pytest.mark.skipif(WHY_NOT is not None, reason=f"GPU only: {WHY_NOT}")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnknownMarkWarning")  # the suite's marks, outside a run
def test_the_hold_needs_no_private_torch_call(monkeypatch):
    """Without ``torch.cuda._sleep`` (a private torch function) the stream-order checks hold the
    stream with public calls: the hold still keeps the stream busy for tens of milliseconds."""
    import torch

    from kvx_conformance.suites.conformance import test_s7_concurrency as s7

    monkeypatch.delattr(torch.cuda, "_sleep")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        s7.hold_stream(torch, s)  # the first call times one product
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(s)
        s7.hold_stream(torch, s)
        end.record(s)
    end.synchronize()
    held_ms = start.elapsed_time(end)
    assert 25 <= held_ms <= 500, f"the hold kept the stream busy {held_ms:.1f} ms (wanted about {s7.ORDER_HOLD_S * 1e3} ms)"
