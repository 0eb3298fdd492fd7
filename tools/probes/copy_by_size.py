"""copy_by_size.py -- what a plain device-to-device copy of N bytes reaches, by N.

`torch.Tensor.copy_` between buffers rotated so that no copy meets its source in L2, eight
back-to-back copies captured in one CUDA graph, replayed fifteen times (the first three
dropped), median per copy; bandwidth counts bytes read plus written, as the bench does. It
shows the fixed cost a call of a benchmark case's size pays before any scatter, against the
bench's roofline (a 1 GiB copy): docs/cuda-reference.md, "The same kernels under the repeat,
FP8 stream-order checks".

    python3 tools/probes/copy_by_size.py        # needs torch with CUDA
"""
import statistics

import torch

CALLS, REPLAYS, DROP = 8, 15, 3


def copy_per_call(nbytes: int) -> float:
    pairs = max(2, min(8, (4 << 30) // (2 * nbytes)))
    bufs = [(torch.empty(nbytes, dtype=torch.uint8, device="cuda"),
             torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")) for _ in range(pairs)]
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for i in range(CALLS):  # warm
            dst, src = bufs[i % pairs]
            dst.copy_(src)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for i in range(CALLS):
            dst, src = bufs[i % pairs]
            dst.copy_(src)
    times = []
    for _ in range(REPLAYS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(s):
            a.record(s)
            g.replay()
            b.record(s)
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / CALLS)
    del bufs, g
    torch.cuda.empty_cache()
    return statistics.median(times[DROP:])


def main() -> None:
    print(torch.cuda.get_device_name(0))
    for mib in (64, 128, 256):
        t = copy_per_call(mib << 20)
        print(f"{mib:4d} MiB copied ({2 * mib} MiB moved): {t * 1e6:8.2f} us, {2 * (mib << 20) / t / 1e9:6.0f} GB/s")


if __name__ == "__main__":
    main()
