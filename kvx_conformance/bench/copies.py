"""The device-to-device copies the bench's roofline is the best of (docs/benchmarks.md, "Method").

Three methods, each moving the same bytes between the same two device buffers on the caller's
stream (the torch current stream), so CUDA events recorded there time them:

- ``copy_``: ``torch.Tensor.copy_``;
- ``cudaMemcpyAsync``: ``cudaMemcpyAsync`` device-to-device;
- ``copy_kernel``: a vectorized copy kernel (16-byte loads and stores, grid = SM count x the
  blocks of 256 threads that fit on one SM), in variants of 16, 32, 64 and 128 bytes in flight
  per thread, with plain or streaming (evict-first) cache hints; the best variant stands
  for the method.

The last two live in ``libkvx_bench_copy.so`` (csrc/bench, built by the package build with the
CUDA backend, called through ctypes); without it the roofline is ``copy_`` alone and its
``notes`` say so. Which method wins is :func:`pick_best`'s choice: the highest median
bandwidth among the methods whose copy verified (the destination equals the source).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

LIBRARY = "libkvx_bench_copy.so"
ABI = 1
THREADS = 256
#: (16-byte vectors per thread, streaming cache hints): the copy kernel's variants
KERNEL_VARIANTS = ((1, False), (2, False), (4, False), (8, False), (1, True), (2, True), (4, True), (8, True))
STREAMING = 1  # the library's flag for streaming loads and stores

COPY_ = "torch.Tensor.copy_ device-to-device, CUDA events"
MEMCPY = f"cudaMemcpyAsync device-to-device ({LIBRARY}), CUDA events"


class CopyLibrary:
    """ctypes binding of libkvx_bench_copy.so (csrc/bench/kvx_bench_copy.cu)."""

    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        self.path = Path(path)
        vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        lib.kvx_bench_copy_abi.restype = i
        lib.kvx_bench_copy_abi.argtypes = []
        lib.kvx_bench_error_string.restype = ctypes.c_char_p
        lib.kvx_bench_error_string.argtypes = [i]
        lib.kvx_bench_memcpy_async.restype = i
        lib.kvx_bench_memcpy_async.argtypes = [vp, vp, sz, vp]
        lib.kvx_bench_copy_plan.restype = i
        lib.kvx_bench_copy_plan.argtypes = [vp, i, i, i, ctypes.POINTER(i), ctypes.POINTER(i), ctypes.POINTER(i)]
        lib.kvx_bench_copy_kernel.restype = i
        lib.kvx_bench_copy_kernel.argtypes = [vp, vp, sz, i, i, i, vp]
        self.lib = lib
        if lib.kvx_bench_copy_abi() != ABI:
            raise OSError(f"{path}: kvx_bench_copy_abi() is {lib.kvx_bench_copy_abi()}, expected {ABI}")

    def error(self, status: int) -> str:
        return (self.lib.kvx_bench_error_string(int(status)) or b"?").decode("utf-8", "replace")

    def memcpy_async(self, dst: int, src: int, n: int, stream: int) -> int:
        return self.lib.kvx_bench_memcpy_async(dst, src, n, stream or None)

    def copy_kernel(self, dst: int, src: int, n: int, vecs: int, streaming: bool, stream: int,
                    threads: int = THREADS) -> int:
        return self.lib.kvx_bench_copy_kernel(dst, src, n, vecs, threads, STREAMING if streaming else 0, stream or None)

    def plan(self, dst: int, vecs: int, streaming: bool, threads: int = THREADS) -> dict:
        """The grid the kernel uses on the device ``dst`` lives on: ``{grid, sm_count, blocks_per_sm}``."""
        g, sm, per = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        st = self.lib.kvx_bench_copy_plan(dst, vecs, threads, STREAMING if streaming else 0, ctypes.byref(g),
                                          ctypes.byref(sm), ctypes.byref(per))
        if st != 0:
            raise RuntimeError(f"kvx_bench_copy_plan: {self.error(st)} (cudaError {st})")
        return {"grid": g.value, "sm_count": sm.value, "blocks_per_sm": per.value}


def load_library() -> tuple[CopyLibrary | None, str | None]:
    """(the library, None), or (None, why it is not there) when the CUDA backend was not built."""
    from ..abi.native import NativeBuildMissing, bench_copy_library, have_cuda

    try:
        path = bench_copy_library()
    except NativeBuildMissing as e:
        return None, str(e)
    if not path.exists():
        why = "the package was built without CUDA" if not have_cuda() else "it is missing from the build"
        return None, f"{LIBRARY} not found in {path.parent} ({why})"
    try:
        return CopyLibrary(path), None
    except OSError as e:
        return None, f"{LIBRARY} did not load: {e}"


@dataclass
class Method:
    """One way of copying ``n`` bytes from ``src`` to ``dst`` (device pointers) on ``stream``;
    ``call`` returns a CUDA status (0 = success). ``group``: the method a variant belongs to."""

    id: str
    group: str
    what: str
    call: Callable[[int, int, int, int], int]
    variant: dict | None = None


def kernel_what(v: dict) -> str:
    return (f"vectorized copy kernel ({LIBRARY}): 16-byte loads and stores, {16 * v['vecs']} bytes in flight "
            f"per thread, {'streaming' if v['streaming'] else 'plain'} cache hints, grid {v['sm_count']} SMs x "
            f"{v['blocks_per_sm']} blocks x {v['threads']} threads, CUDA events")


def methods(lib: CopyLibrary | None, dst_ptr: int) -> list[Method]:
    """The library's methods (cudaMemcpyAsync, then one per kernel variant); [] without the library.
    ``copy_`` is the caller's (it needs the tensors)."""
    if lib is None:
        return []
    out = [Method("cudaMemcpyAsync", "cudaMemcpyAsync", MEMCPY, lib.memcpy_async)]
    for vecs, streaming in KERNEL_VARIANTS:
        v = {"vecs": vecs, "bytes_in_flight_per_thread": 16 * vecs, "streaming": streaming, "threads": THREADS,
             **lib.plan(dst_ptr, vecs, streaming)}
        out.append(Method(f"copy_kernel/v{vecs}{'s' if streaming else ''}", "copy_kernel", kernel_what(v),
                          lambda d, s, n, st, _v=vecs, _c=streaming: lib.copy_kernel(d, s, n, _v, _c, st), v))
    return out


def figure(id_: str, what: str, nbytes: int, st: dict | None, verified: bool | None,
           error: str | None = None) -> dict:
    """One method's entry: bandwidth (bytes read + written) from the median time, p10/p90."""
    e = {"id": id_, "method": what, "bandwidth_Bps": None, "bandwidth_p10_Bps": None, "bandwidth_p90_Bps": None,
         "time": st, "verified": verified}
    if st and st.get("median_s"):
        e["bandwidth_Bps"] = 2 * nbytes / st["median_s"]
        e["bandwidth_p10_Bps"] = 2 * nbytes / st["p90_s"]
        e["bandwidth_p90_Bps"] = 2 * nbytes / st["p10_s"]
    if error:
        e["error"] = error
    return e


def pick_best(entries: list[dict]) -> dict | None:
    """The entry with the highest median bandwidth among those that verified; if none verified,
    the highest of those with a figure (the roofline then reads ``verified: false``); None when
    no entry has a figure. Ties keep the earlier entry."""
    timed = [e for e in entries if e.get("bandwidth_Bps")]
    pool = [e for e in timed if e.get("verified") is True] or timed
    best = None
    for e in pool:
        if best is None or e["bandwidth_Bps"] > best["bandwidth_Bps"]:
            best = e
    return best


def group_entry(group: str, variants: list[dict]) -> dict:
    """A method measured in variants (the copy kernel): the best variant's figures (and its ``variant``),
    its id under ``best_variant``, every variant under ``variants``."""
    best = pick_best(variants)
    if best is None:
        errs = sorted({v.get("error") for v in variants if v.get("error")})
        return {"id": group, "method": "vectorized copy kernel", "bandwidth_Bps": None, "bandwidth_p10_Bps": None,
                "bandwidth_p90_Bps": None, "time": None, "verified": None, "variants": variants,
                "error": "; ".join(errs) or "no variant was timed"}
    return {**best, "id": group, "best_variant": best["id"], "variants": variants}


def roofline(entries: list[dict], nbytes: int, notes: list[str], library: str | None) -> dict:
    """The roofline record (``results.json`` ``roofline.start`` / ``end``): the winner's figures,
    ``method`` (its description) and ``winner`` (its id), every method under ``methods``."""
    best = pick_best(entries)
    if best is None:
        raise RuntimeError("no copy method produced a figure: " +
                           "; ".join(f"{e['id']}: {e.get('error', 'no figure')}" for e in entries))
    return {"method": best["method"], "winner": best["id"], "bytes_copied": nbytes, "bytes_moved": 2 * nbytes,
            "bandwidth_Bps": best["bandwidth_Bps"], "bandwidth_p10_Bps": best["bandwidth_p10_Bps"],
            "bandwidth_p90_Bps": best["bandwidth_p90_Bps"], "time": best["time"], "verified": best["verified"],
            "methods": entries, "notes": notes, "library": library}
