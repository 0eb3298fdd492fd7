"""Decode-sized calls through the real C ABI (ctypes) on DEVICE memory: the host cost
of one call and the device time per call under CUDA-graph replay.

    python tools/cuda_perf.py [--provider LIB] [--calls 2000]

The calls are the harness's own (execute.run_write / run_gather build the guarded
device buffers and descriptors); a provider proxy does the timing inside the
call, while the buffers are alive, then makes the real call whose result the
harness checks against the oracle. Host cost: wall time per call over a loop of
eager calls (no synchronization inside the loop; ctypes marshalling, the front
end's validation and the kernel launch). Device time: a CUDA graph of 32
captured calls (torch.cuda.graph), replayed; CUDA events, median of 50 replays,
divided by 32. Geometry: F16 NHD, 8 KV heads x 128, block 16 (docs/cuda-reference.md).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> int:
    import torch

    from kvx_conformance.cases import build as cb
    from kvx_conformance.abi.header import DType, Memory, Status
    from kvx_conformance.abi.descriptors import Geometry
    from kvx_conformance.cases.execute import CallOptions, run_gather, run_write
    from kvx_conformance.abi.loader import load_provider
    from kvx_conformance.abi.native import reference_provider
    from kvx_conformance.reference_impl import expected

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--provider", default=str(reference_provider()))
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    prov = load_provider(args.provider)
    graph_calls = 32

    class Timer:
        """Provider proxy: times the call's arguments, then makes the real call."""

        def __init__(self, op: str):
            self.op, self.path = op, prov.path
            self.host_us = self.graph_us = float("nan")

        def _fn(self):
            return prov.write_kv if self.op == "write" else prov.gather_kv

        def _time(self, cache, desc):
            fn = self._fn()
            torch.cuda.synchronize()
            for _ in range(20):
                fn(cache, desc, None)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                st = fn(cache, desc, None)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            assert st == Status.OK, st
            self.host_us = (t1 - t0) / args.calls * 1e6
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                fn(cache, desc, s.cuda_stream)  # warm-up on the capture stream
            torch.cuda.synchronize()
            statuses = []
            with torch.cuda.graph(g, stream=s):
                for _ in range(graph_calls):
                    statuses.append(fn(cache, desc, s.cuda_stream))
            assert all(x == Status.OK for x in statuses), f"calls under capture answered {set(statuses)}"
            times = []
            for _ in range(50):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()  # replay() launches on the current stream
                g.replay()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e3 / graph_calls)
            self.graph_us = statistics.median(times)
            torch.cuda.synchronize()

        def write_kv(self, cache, desc, stream=None):
            self._time(cache, desc)
            return prov.write_kv(cache, desc, stream)

        def gather_kv(self, cache, desc, stream=None):
            self._time(cache, desc)
            return prov.gather_kv(cache, desc, stream)

    geom = Geometry(num_blocks=2048, block_size=16, num_kv_heads=8, head_dim=128)
    cache = cb.simple_cache(geom, "nhd", DType.F16, seed=5)
    opts = CallOptions(memory=Memory.DEVICE)
    print(f"device: {torch.cuda.get_device_name()}; provider {args.provider}")
    print("F16 NHD cache, 8 KV heads x 128, block 16, DEVICE memory, NULL stream for eager calls")
    print(f"| tokens | write: host us/call | write: device us/call (graph) | gather: host us/call | "
          f"gather: device us/call (graph) |\n| ---: | ---: | ---: | ---: | ---: |")
    bad = 0
    for n in (1, 8, 32, 64, 128, 256):
        w = cb.write_case(cache, cb.spread_slots(geom, n, 10 + n), seed=20 + n)
        tw = Timer("write")
        got = run_write(tw, w, opts)
        exp = expected(w, Memory.DEVICE)
        ok_w = got.status == exp.status and all(np.array_equal(got.arrays[k].view(np.uint8), exp.arrays[k].view(np.uint8)) for k in ("k", "v"))
        nb = -(-n // geom.block_size)
        table = cb.distinct_table(geom, 1, nb, 30 + n)
        gcase = cb.packed_gather(cache, table, [n], n, seed=40 + n)
        tg = Timer("gather")
        got = run_gather(tg, gcase, opts)
        exp = expected(gcase, Memory.DEVICE)
        ok_g = got.status == exp.status and all(np.array_equal(got.arrays[k].view(np.uint8), exp.arrays[k].view(np.uint8)) for k in ("k", "v"))
        bad += (not ok_w) + (not ok_g)
        print(f"| {n} | {tw.host_us:.2f} | {tw.graph_us:.2f}{'' if ok_w else ' MISMATCH'} | {tg.host_us:.2f} | "
              f"{tg.graph_us:.2f}{'' if ok_g else ' MISMATCH'} |")
    print("results verified against the oracle" if not bad else f"{bad} results differ from the oracle")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
