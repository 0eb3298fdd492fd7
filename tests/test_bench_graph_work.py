"""The bench verifies the work its timed CUDA graphs hold (kvx_conformance/bench/run.py,
`Prepared.poison`): on a GPU, the small CUDA test provider that answers OK without doing anything
while the stream is capturing (csrc/testing/kvx_faulting.cu, KVX_SKIP_CAPTURED) times near zero and
must fail the oracle check, named as the graph's; its twin (not capturable: its calls synchronize,
so it is timed by events) and the bundled reference (timed by graphs) verify. Skips without a CUDA
GPU (CI); the host half of the check is tests/test_bench.py::test_what_is_verified_is_the_graphs_work."""
from __future__ import annotations

import pytest

from kvx_conformance.abi import native

from test_cli_run import explain, kvx, results  # tests/test_cli_run.py
from test_device_faults import gpu_reason  # tests/test_device_faults.py

CASES = ("write-nhd-f16-t65536-h8-d128-bs16-random-device", "gather-nhd-f16-t256-h8-d128-bs16-packed-sl256-device")


WHY_NOT = gpu_reason("twin", "capture_skip")


@pytest.mark.skipif(WHY_NOT is not None, reason=f"GPU only: {WHY_NOT}")
@pytest.mark.parametrize("provider,ok,after", [("cuda_capture_skip", False, "graph replay"),
                                               ("cuda_twin", True, "eager calls"), (None, True, "graph replay")])
def test_bench_verifies_the_graphs_work(tmp_path, provider, ok, after):
    lib = [str(native.testing_provider(provider))] if provider else []
    filters = [a for c in CASES for a in ("--filter", c)]
    p, _ = kvx("bench", *lib, "--preset", "standard", "--memory", "device", "--no-peers", *filters,
               "--output-dir", str(tmp_path), "--quiet", timeout=600)
    assert (p.returncode == 0) == ok, explain(p)
    doc = results(tmp_path)
    got = {c["case"]["id"]: c["impls"]["provider"].get("verified") or {} for c in doc["cases"]}
    assert sorted(got) == sorted(CASES), explain(p)
    for cid, v in got.items():
        assert v.get("ok") is ok and v.get("after") == after, f"{cid}: {v}"
        if not ok:
            assert v["problems"][0].startswith("after the timed CUDA-graph replays"), v
    assert sorted(doc["summary"]["verification_failures"]) == ([] if ok else sorted(CASES))
