"""Spec 7, 7.2 (R-THREADS, R-LIFETIME, R-STREAM): threads, lifetime after return, streams.

- Concurrent calls from several threads on disjoint cache regions equal the serial
  result: writes of disjoint slots into one shared cache (F16 IO into F16; converting:
  F32 IO into BF16 / F16, feature ``mixed_io_dtype``; quantizing into E4M3 with scales,
  profile fp8), and gathers into separate outputs (converting too: F16 cache into F32 /
  BF16 outputs, feature ``mixed_io_dtype``), the threads released together by a
  barrier right before each provider call (ctypes drops the GIL for the call, so the
  calls overlap); on device memory the plain writes and gathers again with each thread
  on a stream of its own (``concurrency.threads.streams``).
- Nothing is written after return: right after the provider returns, the buffers it
  may write are snapshotted and overwritten with a fresh pattern; 1.2 s later the
  pattern must still be there (then the snapshot is put back and compared with the
  oracle as usual).
- The NULL stream is the default stream; on GPU memory a non-NULL stream gives the
  same result once synchronized.
- Stream order (device memory): a write and a gather queued on one stream between work of
  that stream (a long kernel, then copies filling the IO rows; after them, copies of the
  gathered rows), with one wait at the end, take their places in the stream's order: the
  copies equal what the same calls give with a wait after each (plain copies of 16384 tokens
  and of a decode step's 64; converting calls, feature ``mixed_io_dtype``; quantizing FP8 writes
  and their gathers, feature ``fp8``; writes into an FP4 cache of each format and their
  dequantizing gathers, feature ``fp4``).
"""
from __future__ import annotations

import ctypes
import dataclasses
import threading
import time

import numpy as np
import pytest

from kvx_conformance.abi import buffers, descriptors as d, header, health
from kvx_conformance.abi.descriptors import Geometry, IOLayout, SlotMapping
from kvx_conformance.abi.header import DType, Fp4Format, Layout, Memory, ScaleGranularity, Status
from kvx_conformance.abi.loader import status_name
from kvx_conformance.cases import build as cb
from kvx_conformance.cases import fp4 as fx
from kvx_conformance.cases.case import WriteCase
from kvx_conformance.cases.checks import check_arrays, check_guards, check_status, verify_gather, verify_write
from kvx_conformance.cases.threads import BarrierProvider, run_threads
from kvx_conformance.results.outcomes import (
    REQUIRED,
    ConformanceFailure,
    Unsupported,
    conformance,
    note_served_call,
)

CL_THREADS = "spec 7.2 (thread-safe on disjoint cache regions); R-THREADS"
CL_LIFETIME = "spec 7.2 (implementations MUST NOT retain pointers after return); R-LIFETIME"
CL_STREAM = "spec 7 (NULL stream = the implementation's default stream); R-STREAM"
THREADS = 4
ROUNDS = 12
BIG = Geometry(num_blocks=32, block_size=16, num_kv_heads=4, head_dim=32)
#: how long the lifetime probe watches the buffers after a return (a late writer slower than
#: this is left to the harness's quarantine of freed buffers: docs/device-faults.md)
LIFETIME_WAIT_S = 1.2


class SharedCache:
    """One cache placed once in guarded buffers, for calls from several threads."""

    def __init__(self, cache, memory: Memory):
        self.case = cache
        self.k = buffers.allocate(cache.k_init.nbytes, memory, "shared k cache")
        self.v = buffers.allocate(cache.v_init.nbytes, memory, "shared v cache", salt=1)
        self.k.upload(cache.k_init)
        self.v.upload(cache.v_init)
        self.struct = d.to_c_cache(cache.geom, cache.k, self.k.ptr, cache.v, self.v.ptr, memory)
        self.memory = memory

    def arrays(self) -> dict[str, np.ndarray]:
        buffers.synchronize(self.memory)
        return {"k": self.k.download().view(self.case.k_init.dtype), "v": self.v.download().view(self.case.v_init.dtype)}

    def violations(self) -> list[str]:
        return self.k.violations() + self.v.violations()


def _split(case: WriteCase, parts: int) -> list[WriteCase]:
    """The write's tokens in ``parts`` consecutive groups (dense IO)."""
    g = case.cache.geom
    hd = g.num_kv_heads * g.head_dim
    out = []
    for idx in np.array_split(np.arange(case.num_tokens), parts):
        lo, hi = int(idx[0]), int(idx[-1]) + 1
        n = hi - lo
        lay = IOLayout.dense(case.key_layout.dtype, n, g.num_kv_heads, g.head_dim)
        out.append(cb.replace(case, key_layout=lay, value_layout=lay, key=case.key[lo * hd:hi * hd].copy(),
                              value=case.value[lo * hd:hi * hd].copy(), num_tokens=n,
                              slots=SlotMapping(np.asarray(case.slots.slots[lo:hi]), case.slots.dtype,
                                                case.slots.invalid_slot)))
    return out


def _thread_opts(opts, streams: list[int] | None) -> list:
    """The call options of each of ``THREADS`` threads: ``opts``, or ``opts`` on the thread's own stream."""
    return [opts if streams is None else dataclasses.replace(opts, stream=streams[i]) for i in range(THREADS)]


def _big_cache(kind: str, dtype: DType, seed: int):
    """A cache of BIG in layout ``kind`` (HND_PACKED: 16 bytes of F16, 8 elements, a pack)."""
    return cb.simple_cache(BIG, kind, dtype, seed=seed, **({"pack": 8} if kind == "hnd_packed" else {}))


def _concurrent_write_rounds(provider, opts, cache_dtype: DType, *, io_dtype: DType | None = None, seed: int = 0,
                             feature: str | tuple | None = None, what: str = "", slot_dtype: DType = DType.S64,
                             streams: list[int] | None = None, kind: str | None = None, **scales) -> None:
    """4 rounds: ``THREADS`` threads write disjoint slots (every slot of BIG once) of one shared
    cache (layout ``kind``, None: the provider's core one) at once (``streams``: each thread on its
    own); the cache must equal the oracle's serial result. With ``feature`` (a name, or ``()`` for
    the features the case itself uses), one part is first written alone through
    :func:`verify_write`: a refusal there is the feature's (UNSUPPORTED), a wrong result a failure
    of its own; the threads then must all answer OK."""
    from kvx_conformance import reference_impl
    from kvx_conformance.cases.execute import run_write

    kind = kind or cb.core_layout(provider, opts.memory)
    for rnd in range(4):
        cache = _big_cache(kind, cache_dtype, 100 + seed + rnd)
        slots = cb.rng_for(seed + rnd).permutation(BIG.num_slots)  # disjoint by construction
        whole = cb.write_case(cache, slots, io_dtype=io_dtype, seed=200 + seed + rnd, slot_dtype=slot_dtype,
                              label=f"round {rnd}: {THREADS} threads, disjoint slots{what}", **scales)
        parts = _split(whole, THREADS)
        if feature is not None and rnd == 0:
            verify_write(provider, parts[0], opts, clause=CL_THREADS, feature=feature)  # served alone?
        shared = SharedCache(cache, opts.memory)
        proxy = BarrierProvider(provider, threading.Barrier(THREADS), shared.struct)
        results = run_threads([lambda p=p, o=o: run_write(proxy, p, o)
                                for p, o in zip(parts, _thread_opts(opts, streams))])
        for r in results:
            check_status(r.status, Status.OK, clause=CL_THREADS, case=whole)
            check_guards(r, clause=CL_THREADS, case=whole)
        got = type(results[0])(Status.OK, shared.arrays(), shared.violations())
        check_guards(got, clause=CL_THREADS, case=whole)
        check_arrays(got, reference_impl.expected_write(whole, opts.memory), whole, clause=CL_THREADS,
                     what="concurrent writes of disjoint slots differ from the serial result")


@conformance("concurrency.threads.write_disjoint", CL_THREADS, REQUIRED, "concurrency", "write")
def test_concurrent_writes(kvx_provider, kvx_call_options):
    _concurrent_write_rounds(kvx_provider, kvx_call_options(), DType.F16)


@conformance("concurrency.threads.write_s32_slots", CL_THREADS + "; spec 5.2 (S32 slots)", REQUIRED, "concurrency",
             "write")
def test_concurrent_writes_s32_slots(kvx_provider, kvx_call_options):
    """``concurrency.threads.write_disjoint`` with S32 slot mappings (the other write tests under
    threads use S64): a provider that widens S32 slots into scratch memory shared by its calls (to
    reuse an S64 kernel) lets one thread's tokens land at another thread's slots."""
    _concurrent_write_rounds(kvx_provider, kvx_call_options(), DType.F16, seed=20, slot_dtype=DType.S32,
                             what=", S32 slots")


@conformance("concurrency.threads.write_convert", CL_THREADS + "; R-CONVERT", REQUIRED, "concurrency", "write",
             feature="mixed_io_dtype")
@pytest.mark.parametrize("cache_dtype", [DType.BF16, DType.F16], ids=["f32_to_bf16", "f32_to_f16"])
def test_concurrent_converting_writes(kvx_provider, kvx_call_options, cache_dtype):
    """``concurrency.threads.write_disjoint`` with F32 IO into a BF16 / F16 cache: the converting
    path (rows staged and rounded) must be as thread-safe as the plain copy."""
    _concurrent_write_rounds(kvx_provider, kvx_call_options(), cache_dtype, io_dtype=DType.F32, seed=40,
                             feature="mixed_io_dtype", what=", F32 IO")


@conformance("concurrency.threads.fp8_write", CL_THREADS + "; R-FP8", REQUIRED, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("io_dtype", [DType.F32, DType.BF16], ids=["io_f32", "io_bf16"])
def test_concurrent_fp8_writes(kvx_provider, kvx_call_options, io_dtype):
    """``concurrency.threads.write_disjoint`` into an E4M3 cache quantizing F32 / BF16 IO with a
    PER_TENSOR K scale and PER_HEAD V scales (``k_scale_desc`` / ``v_scale_desc``)."""
    _concurrent_write_rounds(kvx_provider, kvx_call_options(), DType.F8_E4M3, io_dtype=io_dtype, seed=60,
                             feature="fp8", what=f", {io_dtype.name} IO quantized with scales",
                             k_scale_desc=cb.scale_spec([0.37]),
                             v_scale_desc=cb.scale_spec([2.5, 0.11, 1.3, 0.6], ScaleGranularity.PER_HEAD))


#: the optional feature of each table format of the concurrent gathers (PACKED: none)
TABLE_FEATURES = {"packed": None, "ragged": "ragged", "kv_offsets": "kv_offsets"}


def _concurrent_gather_rounds(provider, opts, *, seed: int, io_dtype: DType | None = None,
                              streams: list[int] | None = None, table: str = "packed",
                              kind: str | None = None) -> None:
    """THREADS gathers of one shared F16 cache (layout ``kind``, None: the provider's core one)
    into their own outputs, at once (a barrier right before each provider call; ``streams``: each
    thread on its own), ROUNDS times, through ``table`` block tables (PACKED, RAGGED or
    KV_OFFSETS, each thread its own); each must equal the oracle's. With ``io_dtype`` (a
    converting gather), a table format that is an optional feature or a layout other than the core
    one, one gather is first made alone: a refusal there is the feature's (UNSUPPORTED); the
    threads then must all answer OK."""
    cache = _big_cache(kind or cb.core_layout(provider, opts.memory), DType.F16, seed)
    clause = CL_THREADS + ("; R-CONVERT" if io_dtype is not None else "")
    into = (f", F16 cache into {io_dtype.name} outputs" if io_dtype is not None else "") + \
        (", each thread on a stream of its own" if streams is not None else "") + \
        (f", {table.upper()} tables" if table != "packed" else "") + (f", {kind.upper()} cache" if kind else "")
    mb = 8
    if table == "kv_offsets":  # the blocks come from a primary pool of BIG's blocks
        pool = cb.kv_offsets_cache(BIG, DType.F16, primary_blocks=BIG.num_blocks, seed=seed + 1)
        cache = cb.replace(pool, k=cache.k, v=cache.v, k_init=cache.k_init, v_init=cache.v_init)
    cases = []
    for i in range(THREADS):
        rng = cb.rng_for(seed + 100 + i)
        lens = rng.integers(mb * BIG.block_size // 2, mb * BIG.block_size + 1, size=6)
        kw = dict(seed=seed + 300 + i, label=f"thread {i} of {THREADS}{into}",
                  **({"io_dtype": io_dtype} if io_dtype is not None else {}))
        ids = cb.distinct_table(BIG, 6, mb, seed + 200 + i)
        if table == "kv_offsets":
            off = np.stack([ids, cb.distinct_table(BIG, 6, mb, seed + 250 + i)], axis=1)[:, None]  # [seq, beam, K|V, block]
            cases.append(cb.kv_offsets_gather(cache, off, lens, mb * BIG.block_size, **kw))
        elif table == "ragged":
            cases.append(cb.ragged_gather(cache, ids, lens, mb * BIG.block_size, **kw))
        else:
            cases.append(cb.packed_gather(cache, ids, lens, mb * BIG.block_size, **kw))
    feature = tuple(f for f in ("mixed_io_dtype" if io_dtype is not None else None, TABLE_FEATURES[table]) if f)
    if feature or kind is not None:
        verify_gather(provider, cases[0], opts, clause=clause, feature=feature)
    for rnd in range(ROUNDS):
        proxy = BarrierProvider(provider, threading.Barrier(THREADS))
        run_threads([lambda c=c, o=o: verify_gather(proxy, c, o, clause=clause)
                      for c, o in zip(cases, _thread_opts(opts, streams))])


@conformance("concurrency.threads.gather", CL_THREADS, REQUIRED, "concurrency", "gather")
def test_concurrent_gathers(kvx_provider, kvx_call_options):
    _concurrent_gather_rounds(kvx_provider, kvx_call_options(), seed=300)


@conformance("concurrency.threads.gather_ragged", CL_THREADS + "; spec 5.1 (RAGGED)", REQUIRED, "concurrency",
             "gather", feature="ragged")
def test_concurrent_ragged_gathers(kvx_provider, kvx_call_options):
    """``concurrency.threads.gather`` through RAGGED tables (S32 ids, one per token): a provider that
    widens or rearranges a RAGGED table's ids into scratch memory its calls share (to reuse a PACKED
    kernel) gathers one thread's rows through another thread's ids."""
    _concurrent_gather_rounds(kvx_provider, kvx_call_options(), seed=340, table="ragged")


@conformance("concurrency.threads.gather_kv_offsets", CL_THREADS + "; spec 5.1 (KV_OFFSETS)", REQUIRED, "concurrency",
             "gather", feature="kv_offsets")
def test_concurrent_kv_offsets_gathers(kvx_provider, kvx_call_options):
    """``concurrency.threads.gather`` through KV_OFFSETS tables (K and V offsets of their own into a
    primary pool): the same for a provider that converts the offsets into scratch memory."""
    _concurrent_gather_rounds(kvx_provider, kvx_call_options(), seed=360, table="kv_offsets")


@conformance("concurrency.threads.layouts", CL_THREADS + "; spec 4.2 (cache layouts)", REQUIRED, "concurrency",
             ("write", "gather"))
@pytest.mark.parametrize("kind", ["nhd", "hnd", "hnd_packed"])
@pytest.mark.parametrize("op", ["write", "gather"])
def test_concurrent_calls_per_layout(kvx_provider, kvx_call_options, op, kind):
    """``concurrency.threads.write_disjoint`` and ``concurrency.threads.gather`` in each cache layout,
    a layout other than the provider's core one refusable (R-REFUSAL): the other thread tests use the
    core layout, so a kernel of another layout with scratch memory its calls share was never run
    from two threads at once."""
    opts = kvx_call_options()
    if op == "write":
        _concurrent_write_rounds(kvx_provider, opts, DType.F16, seed=80, feature=(), kind=kind,
                                 what=f", {kind.upper()} cache")
    else:
        _concurrent_gather_rounds(kvx_provider, opts, seed=380, kind=kind)


@conformance("concurrency.threads.gather_convert", CL_THREADS + "; R-CONVERT", REQUIRED, "concurrency", "gather",
             feature="mixed_io_dtype")
@pytest.mark.parametrize("io_dtype", [DType.F32, DType.BF16], ids=["f16_to_f32", "f16_to_bf16"])
def test_concurrent_converting_gathers(kvx_provider, kvx_call_options, io_dtype):
    """``concurrency.threads.gather`` from an F16 cache into F32 / BF16 outputs: the converting
    path (rows staged and converted) must be as thread-safe as the plain copy."""
    _concurrent_gather_rounds(kvx_provider, kvx_call_options(), seed=320, io_dtype=io_dtype)


@conformance("concurrency.threads.streams", CL_THREADS + "; spec 7 (`stream` parameters are opaque CUDA/HIP "
             "streams)", REQUIRED, "concurrency", ("write", "gather"))
@pytest.mark.kvx_memory_types("device")  # streams of their own: GPU memory
@pytest.mark.parametrize("op", ["write", "gather"])
def test_concurrent_calls_on_streams_of_their_own(kvx_provider, kvx_call_options, op):
    """``concurrency.threads.write_disjoint`` and ``concurrency.threads.gather`` with each thread
    calling on a stream of its own, as an engine's workers do. A provider whose calls share device
    scratch memory, kept safe only by the order of one stream (a lock held while a call enqueues
    its work), lets one thread's work read what another thread's call put there."""
    import torch

    streams = [torch.cuda.Stream() for _ in range(THREADS)]
    handles = [s.cuda_stream for s in streams]
    if op == "write":
        _concurrent_write_rounds(kvx_provider, kvx_call_options(), DType.F16, seed=80, streams=handles,
                                 what=", each thread on a stream of its own")
    else:
        _concurrent_gather_rounds(kvx_provider, kvx_call_options(), seed=340, streams=handles)
    torch.cuda.synchronize()


# ---------------------------------------------------------------------------- lifetime


class LifetimeProbe:
    """Provider proxy: right after the call returns, snapshot the buffers the call may
    write, overwrite them with a fresh pattern, wait, and require the pattern intact;
    then restore the snapshot (so the usual comparison with the oracle follows)."""

    def __init__(self, provider, regions, wait_s: float = LIFETIME_WAIT_S, memory: Memory = Memory.HOST):
        self.provider, self.regions, self.wait_s = provider, regions, wait_s
        self.memory = memory
        self.path = provider.path
        self.late: list[str] = []

    def _probe(self, ptrs: list[tuple[str, int, int]]):
        # R-LIFETIME: "after return (and stream synchronization)": work a call
        # queued on its stream may still run until the caller synchronizes.
        buffers.synchronize(self.memory)
        snaps = []
        for name, ptr, n in ptrs:
            snaps.append(ctypes.string_at(ptr, n))
            pattern = bytes((np.arange(n, dtype=np.uint32) * 29 + 0x33).astype(np.uint8))
            ctypes.memmove(ptr, pattern, n)
        time.sleep(self.wait_s)
        for (name, ptr, n), snap in zip(ptrs, snaps):
            pattern = bytes((np.arange(n, dtype=np.uint32) * 29 + 0x33).astype(np.uint8))
            now = ctypes.string_at(ptr, n)
            if now != pattern:
                diff = sum(a != b for a, b in zip(now, pattern))
                self.late.append(f"{name}: {diff} byte(s) written {self.wait_s * 1000:.0f} ms after the call returned")
                # threads the provider left may go on writing: the harness replaces this worker
                health.note_late_write(self.late[-1], where="lifetime")
            ctypes.memmove(ptr, snap, n)

    def write_kv(self, cache, desc, stream=None):
        st = self.provider.write_kv(cache, desc, stream)
        self._probe([(name, getattr(cache, side).data, n) for name, side, n in self.regions])
        return st

    def gather_kv(self, cache, desc, stream=None):
        st = self.provider.gather_kv(cache, desc, stream)
        self._probe([(name, getattr(desc.io, side).data, n) for name, side, n in self.regions])
        return st


def _lifetime_check(probe: LifetimeProbe, case) -> None:
    if probe.late:
        raise ConformanceFailure("the provider wrote after returning", expected="no write after return",
                                 got="; ".join(probe.late), clause=CL_LIFETIME, case=case.describe(), seed=case.seed)


@conformance("lifetime.no_write_after_return", CL_LIFETIME, REQUIRED, "concurrency", ("write", "gather"))
# the probe watches host-addressable memory: not run (and not counted) on DEVICE runs
@pytest.mark.kvx_memory_types("host", "unified")
@pytest.mark.parametrize("op", ["write", "gather"])
def test_no_write_after_return(kvx_provider, kvx_call_options, op):
    opts = kvx_call_options()
    cache = cb.simple_cache(cb.GEOM, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=700)
    if op == "write":
        case = cb.write_case(cache, cb.spread_slots(cb.GEOM, 10, 701), seed=702, label="lifetime probe")
        probe = LifetimeProbe(kvx_provider, [("k cache", "k", cache.k_init.nbytes), ("v cache", "v", cache.v_init.nbytes)],
                              memory=opts.memory)
        verify = verify_write
    else:
        case = cb.packed_gather(cache, cb.distinct_table(cb.GEOM, 2, 3, 703), [9, 12], 12, seed=704,
                                label="lifetime probe")
        probe = LifetimeProbe(kvx_provider, [("out key", "key", case.out_k_init.nbytes),
                                             ("out value", "value", case.out_v_init.nbytes)], memory=opts.memory)
        verify = verify_gather
    try:
        verify(probe, case, opts, clause=CL_LIFETIME)
    except ConformanceFailure:
        _lifetime_check(probe, case)  # writes after return explain a wrong result: they are the finding
        raise
    _lifetime_check(probe, case)


# ---------------------------------------------------------------------------- streams


@conformance("stream.null_default", CL_STREAM, REQUIRED, "concurrency", ("write", "gather"))
@pytest.mark.parametrize("op", ["write", "gather"])
def test_null_stream(kvx_provider, kvx_call_options, op):
    opts = kvx_call_options(stream=None)
    cache = cb.simple_cache(cb.GEOM, cb.core_layout(kvx_provider, opts.memory), DType.BF16, seed=710)
    if op == "write":
        case = cb.write_case(cache, cb.spread_slots(cb.GEOM, 10, 711), seed=712, label="NULL stream")
        verify_write(kvx_provider, case, opts, clause=CL_STREAM)
    else:
        case = cb.packed_gather(cache, cb.distinct_table(cb.GEOM, 2, 3, 713), [9, 12], 12, seed=714,
                                label="NULL stream")
        verify_gather(kvx_provider, case, opts, clause=CL_STREAM)


@conformance("stream.non_null", "spec 7 (stream parameters are opaque CUDA/HIP streams); R-STREAM", REQUIRED,
             "concurrency", ("write", "gather"))
@pytest.mark.kvx_memory_types("device", "unified")  # a stream means nothing to host memory: not run there
@pytest.mark.parametrize("op", ["write", "gather"])
def test_non_null_stream(kvx_provider, kvx_call_options, op):
    import torch

    stream = torch.cuda.Stream()
    opts = kvx_call_options(stream=stream.cuda_stream)
    cache = cb.simple_cache(cb.GEOM, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=720)
    if op == "write":
        case = cb.write_case(cache, cb.spread_slots(cb.GEOM, 10, 721), seed=722, label="non-NULL stream")
        verify_write(kvx_provider, case, opts, clause=CL_STREAM)
    else:
        case = cb.packed_gather(cache, cb.distinct_table(cb.GEOM, 2, 3, 723), [9, 12], 12, seed=724,
                                label="non-NULL stream")
        verify_gather(kvx_provider, case, opts, clause=CL_STREAM)


CL_STREAM_ORDER = ("spec 7 (`stream` parameters are opaque CUDA/HIP streams: a call's device work takes its place "
                   "in the order of the stream it is given, after the work queued before the call and before the "
                   "work queued after it); R-STREAM")
#: stream.order: a call large enough to take many waves of any GPU (K and V of 16384 tokens, 64 MiB)
ORDER_GEOM = Geometry(num_blocks=2048, block_size=16, num_kv_heads=8, head_dim=128)
ORDER_TOKENS, ORDER_SEQ_LEN = 16384, 256
#: stream.order_decode: a decode step's call (4 blocks of 16 tokens, one sequence)
ORDER_DECODE_TOKENS = 64
#: clock cycles of the kernel that keeps the stream busy before the IO rows are filled (about 50 ms)
ORDER_SLEEP_CYCLES = 100_000_000
#: stream.order_fp8's PER_TENSOR scale: N(0, 1) rows stay far inside E4M3's range (+-448)
ORDER_FP8_SCALE = 0.5
#: the hold through public torch calls where torch has no ``torch.cuda._sleep``: seconds of matrix products
ORDER_HOLD_S = 0.05
_HOLD: dict = {}


def hold_stream(torch, stream) -> None:
    """Queue tens of milliseconds of device work on ``stream`` (the current torch stream is set to
    it): ``torch.cuda._sleep`` of ORDER_SLEEP_CYCLES clock cycles, or where a torch lacks that
    private function, a chain of 2048 x 2048 matrix products, as many as one timed product says
    fill ORDER_HOLD_S (timed once per process)."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(ORDER_SLEEP_CYCLES)
        return
    if "a" not in _HOLD:
        a = torch.randn(2048, 2048, device="cuda")
        b = torch.empty_like(a)
        torch.mm(a, a, out=b)  # warm
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        for _ in range(8):
            torch.mm(a, a, out=b)
        t1.record()
        t1.synchronize()
        _HOLD.update(a=a, b=b, n=max(1, int(ORDER_HOLD_S / max(t0.elapsed_time(t1) / 8e3, 1e-6))))
        torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        for _ in range(_HOLD["n"]):
            torch.mm(_HOLD["a"], _HOLD["a"], out=_HOLD["b"])


#: rounds, each with rows of its own: the first also meets a provider's one-time set-up (loading its
#: kernels, creating its streams), which can outlast the busy kernel and hide the defect
ORDER_ROUNDS = 2
#: ... of stream.order_decode: its calls take microseconds, so whether an out-of-order provider's work
#: lands before the stream's copies is a race each round may lose (a provider putting its work on a
#: stream of its own passed one of ten runs of two rounds on an H100); six rounds of 50 ms cost little
ORDER_DECODE_ROUNDS = 6


@conformance("stream.order", CL_STREAM_ORDER, REQUIRED, "concurrency", ("write", "gather"))
@pytest.mark.kvx_memory_types("device")  # the order of a stream's work: GPU memory; UNIFIED calls may wait on it
def test_stream_order(kvx_provider, kvx_call_options):
    """On one stream, with one wait at the end: a kernel that keeps the stream busy for tens of
    milliseconds, copies that fill the IO rows, the write of those rows, the gather of the same
    slots (the blocks in the reverse order: its first rows are the write's last), and copies of the
    gathered rows. The copies must hold what the same calls give with a wait after each: a provider
    whose work leaves the stream's order writes rows the copies had not filled yet, gathers rows
    the write had not stored yet, or is copied before it has gathered. The harness's check after
    each call, which waits for the whole device, is held back to the end of each round (it would
    put the calls in order itself). F16 rows into an F16 cache: the plain copy."""
    _stream_order_rounds(kvx_provider, kvx_call_options(), DType.F16, DType.F16, seed=760)


@conformance("stream.order_decode", CL_STREAM_ORDER, REQUIRED, "concurrency", ("write", "gather"))
@pytest.mark.kvx_memory_types("device")
def test_stream_order_decode(kvx_provider, kvx_call_options):
    """``stream.order`` with calls of a decode step's size, which a provider often serves with
    kernels (or a fast path) of their own: a write of ORDER_DECODE_TOKENS F16 rows and the gather of
    them as one sequence."""
    _stream_order_rounds(kvx_provider, kvx_call_options(), DType.F16, DType.F16, seed=765,
                         tokens=ORDER_DECODE_TOKENS, seq_len=ORDER_DECODE_TOKENS, rounds=ORDER_DECODE_ROUNDS)


@conformance("stream.order_convert", CL_STREAM_ORDER + "; R-CONVERT", REQUIRED, "concurrency", ("write", "gather"),
             feature="mixed_io_dtype")
@pytest.mark.kvx_memory_types("device")
def test_stream_order_converting(kvx_provider, kvx_call_options):
    """``stream.order`` for the converting calls, which a provider often serves with kernels of
    their own: F32 rows written into a BF16 cache (rounded) and gathered back into F32 outputs.
    Each is first made alone (:func:`verify_write`, :func:`verify_gather`): a refusal there is the
    feature's (``mixed_io_dtype``, UNSUPPORTED)."""
    _alone_then_rounds(kvx_provider, kvx_call_options(), DType.BF16, DType.F32, DType.F32, feature="mixed_io_dtype",
                       seed=770, round_seed=780)


@conformance("stream.order_fp8", CL_STREAM_ORDER + "; R-FP8", REQUIRED, "concurrency", ("write", "gather"),
             feature="fp8")
@pytest.mark.kvx_memory_types("device")
def test_stream_order_fp8(kvx_provider, kvx_call_options):
    """``stream.order`` for the FP8 calls, which a provider serves with quantizing kernels of their
    own: F16 rows quantized into an E4M3 cache by a PER_TENSOR scale descriptor (its value in device
    memory, as engines keep ``k_scale``), gathered back as E4M3 bytes. Each is first made alone
    (:func:`verify_write`, :func:`verify_gather`): a refusal there is the feature's (``fp8``)."""
    _alone_then_rounds(kvx_provider, kvx_call_options(), DType.F8_E4M3, DType.F16, DType.F8_E4M3, feature="fp8",
                       seed=790, round_seed=795, scale=ORDER_FP8_SCALE)


@conformance("stream.order_fp4", CL_STREAM_ORDER + "; KVX 1.2 FP4 extension (docs/fp4.md)", REQUIRED, "concurrency",
             ("write", "gather"), feature="fp4")
@pytest.mark.kvx_memory_types("device")
@pytest.mark.parametrize("fmt", [pytest.param(f, id=fx.FORMAT_NAMES[f])
                                 for f in (Fp4Format.NVFP4, Fp4Format.MXFP4, Fp4Format.MXFP4_OCP)])
def test_stream_order_fp4(kvx_provider, kvx_call_options, fmt):
    """``stream.order`` for the FP4 calls, which a provider serves with kernels of their own: F16
    rows quantized into an FP4 cache of the format (its scale pool beside it, in the provider's
    core layout), dequantized back into F16 outputs. The control is the same calls with a wait
    after each, so the check holds the provider to its own results, not to the oracle's (the FP4
    suite judges those). Each is first made alone, small: a refusal there is the feature's
    (``fp4``; a provider of ABI minor below 2 has no FP4 extension)."""
    opts = kvx_call_options()
    provider, name = kvx_provider, fx.FORMAT_NAMES[fmt]
    if fx.provider_minor(provider) < 2:
        raise Unsupported(f"provider reports ABI minor {fx.provider_minor(provider)} (< 2): no FP4 extension",
                          feature="fp4")
    layout = Layout.BLOCK_NHD if cb.core_layout(provider, opts.memory) == "nhd" else Layout.BLOCK_HND
    seed = 800 + int(fmt)
    rng = np.random.default_rng(seed)
    small = fx.new_cache(fmt, 12, 4, 2, 64, layout)
    rows = rng.standard_normal((10, 2, 64)).astype(np.float16)
    slots = rng.permutation(48)[:10]
    for what, res in (
            ("write of 10 F16 rows, made alone",
             lambda: fx.run_write(provider, small, rows, -rows, slots, memory=opts.memory)),
            ("gather of 2 sequences of 8 into F16 outputs, made alone",
             lambda: fx.run_gather(provider, small, np.array([[0, 1], [5, 6]]), [8, 8], 8, DType.F16,
                                   memory=opts.memory))):
        st = res().status
        if st in (Status.UNSUPPORTED, Status.INVALID_ARGUMENT):  # spec 8: "unsupported field"
            raise Unsupported(f"{name} {what}: {status_name(st)}", feature=("fp4",) + fx.layout_feature(),
                              refused_with=status_name(st))
        check_status(st, Status.OK, clause=CL_STREAM_ORDER, case=f"{name} cache of 12 blocks x 4 x 2 x 64 "
                     f"({layout.name}), {what}", what=f"{what}: status")
    _stream_order_rounds(provider, opts, DType.F4_E2M1, DType.F16, seed=seed + 10, fp4=fmt)


def _alone_then_rounds(provider, opts, cache_dtype: DType, io_dtype: DType, out_dtype: DType, *, feature: str,
                       seed: int, round_seed: int, scale: float | None = None) -> None:
    """A stream-order check of calls a provider may refuse (``feature``): a write of ``io_dtype``
    rows into a ``cache_dtype`` cache (``scale``: PER_TENSOR scale descriptors) and a gather into
    ``out_dtype`` outputs, each first made alone through :func:`verify_write` / :func:`verify_gather`
    (a refusal there is the feature's, UNSUPPORTED; a wrong result a failure of its own), then the
    rounds of :func:`_stream_order_rounds`."""
    cache = cb.simple_cache(cb.GEOM, cb.core_layout(provider, opts.memory), cache_dtype, seed=seed)
    spec = cb.scale_spec([scale], ScaleGranularity.PER_TENSOR) if scale is not None else None
    scaled = f", PER_TENSOR scale {scale}" if scale is not None else ""
    verify_write(provider, cb.write_case(cache, cb.spread_slots(cb.GEOM, 10, seed + 1), io_dtype=io_dtype,
                                         seed=seed + 2, k_scale_desc=spec, v_scale_desc=spec,
                                         label=f"{io_dtype.name} rows into a {cache_dtype.name} cache{scaled}, "
                                               "made alone"),
                 opts, clause=CL_STREAM_ORDER, feature=feature)
    verify_gather(provider, cb.packed_gather(cache, cb.distinct_table(cb.GEOM, 2, 3, seed + 3), [9, 12], 12,
                                             seed=seed + 4, io_dtype=out_dtype if out_dtype != cache_dtype else None,
                                             label=f"a {cache_dtype.name} cache into {out_dtype.name} outputs, "
                                                   "made alone"),
                  opts, clause=CL_STREAM_ORDER, feature=feature)
    _stream_order_rounds(provider, opts, cache_dtype, io_dtype, seed=round_seed, out_dtype=out_dtype, scale=scale)


class _DeviceArena:
    """Where :func:`kvx_conformance.cases.fp4.cache_struct` places an FP4 cache's buffers for the
    stream-order rounds: each a torch tensor of bytes in device memory, kept (``tensors``) so that
    the rounds can zero them on the device."""

    memory = Memory.DEVICE

    def __init__(self, torch):
        self.torch, self.tensors = torch, {}

    def put(self, name: str, array: np.ndarray) -> int:
        t = self.torch.from_numpy(np.ascontiguousarray(array).view(np.uint8).reshape(-1)).to("cuda")
        self.tensors[name] = t
        return t.data_ptr()


def _stream_order_rounds(provider, opts, cache_dtype: DType, io_dtype: DType, *, seed: int,
                         out_dtype: DType | None = None, scale: float | None = None,
                         tokens: int = ORDER_TOKENS, seq_len: int = ORDER_SEQ_LEN,
                         fp4: Fp4Format | None = None, rounds: int = ORDER_ROUNDS) -> None:
    """``rounds`` rounds of the stream-order sequence (:func:`test_stream_order`), ``tokens`` rows
    of ``io_dtype`` through a cache of ``cache_dtype`` gathered as sequences of ``seq_len`` into
    outputs of ``out_dtype`` (default ``io_dtype``), each against the same calls made with a wait
    after each (the control: what the provider gives in order). ``scale``: the FP8 writes'
    PER_TENSOR scale descriptors (the value in device memory). ``fp4``: the cache is a KVX 1.2 FP4
    cache of that format (``cache_dtype`` F4_E2M1), its codes and scale pools in device memory."""
    import torch

    g, n, sl = ORDER_GEOM, tokens, seq_len
    bs, heads, dim, nblk = g.block_size, g.num_kv_heads, g.head_dim, tokens // ORDER_GEOM.block_size
    kind = cb.core_layout(provider, opts.memory)
    lay = d.cache_layout(g, Layout.BLOCK_NHD if kind == "nhd" else Layout.BLOCK_HND, cache_dtype)
    dev = torch.device("cuda")
    out_dtype = out_dtype or io_dtype
    tdt = {DType.F16: torch.float16, DType.BF16: torch.bfloat16, DType.F32: torch.float32,
           DType.F8_E4M3: torch.uint8, DType.F8_E5M2: torch.uint8}  # FP8 bytes as they are
    rng = np.random.default_rng(seed)
    blocks = rng.permutation(g.num_blocks)[:nblk].astype(np.int64)
    slots = (blocks[:, None] * bs + np.arange(bs)).reshape(-1)
    # the table reads the blocks in the reverse order: gathered row r is written row (nblk - 1 - r // bs) * bs + r % bs
    table = np.ascontiguousarray(blocks[::-1]).reshape(n // sl, sl // bs)
    bt, lens = d.BlockTable.packed(table), d.SeqLens(np.full(n // sl, sl, np.int64))
    io_in, io_out, copied = ([torch.zeros(n * heads * dim, dtype=tdt[dt], device=dev) for _ in range(2)]
                             for dt in (io_dtype, out_dtype, out_dtype))
    meta = [torch.from_numpy(a).to(dev) for a in (slots, bt.encoded_indices(), lens.encoded())]
    if fp4 is None:
        caches = [torch.zeros(lay.span_elements(), dtype=tdt[cache_dtype], device=dev) for _ in range(2)]
        cache = d.to_c_cache(g, lay, caches[0].data_ptr(), lay, caches[1].data_ptr(), Memory.DEVICE)
        w, gd = header.kvx_write_desc_t.new(), header.kvx_gather_desc_t.new(max_seq_len=sl)
        cache_name = cache_dtype.name
    else:
        arena = _DeviceArena(torch)
        cache = fx.cache_struct(fx.new_cache(fp4, g.num_blocks, bs, heads, dim, lay.layout), arena)
        caches = list(arena.tensors.values())  # codes and scale pools, K and V
        w, gd = header.kvx_write_desc_v1_2_t.new(), header.kvx_gather_desc_v1_2_t.new(max_seq_len=sl)
        cache_name = f"{fx.FORMAT_NAMES[fp4].upper()} (F4_E2M1 codes and their scale pool)"
    io = IOLayout.dense(io_dtype, n, heads, dim)
    w.io = d.to_c_io(io, io_in[0].data_ptr(), io, io_in[1].data_ptr(), Memory.DEVICE, n, heads, dim)
    w.slots = d.to_c_slots(SlotMapping(slots), meta[0].data_ptr())
    spec = None if scale is None else cb.scale_spec([scale], ScaleGranularity.PER_TENSOR)
    scales = torch.from_numpy(spec.buffer()).to(dev) if spec is not None else None
    w.k_scale_desc = w.v_scale_desc = d.to_c_scale(spec, scales.data_ptr() if spec is not None else 0)
    out = IOLayout.dense(out_dtype, n, heads, dim)
    gd.io = d.to_c_io(out, io_out[0].data_ptr(), out, io_out[1].data_ptr(), Memory.DEVICE, n, heads, dim)
    gd.block_table = d.to_c_table(bt, meta[1].data_ptr(), 0)
    gd.seq_lens = d.to_c_seq_lens(lens, meta[2].data_ptr())
    case = (f"{kind.upper()} {cache_name} cache of {g.num_blocks} blocks x {bs} x {heads} x {dim}, {n} "
            f"{io_dtype.name} tokens to the slots of {nblk} random blocks"
            + (f" (PER_TENSOR scale {scale})" if scale is not None else "")
            + f", gathered as {n // sl} sequences of {sl} into {out_dtype.name} outputs (the blocks reversed), "
              f"{rounds} rounds, seed {seed}")
    gen = torch.Generator(device=dev).manual_seed(seed + 1)
    s = torch.cuda.Stream()

    def reset() -> None:
        for t in (*io_in, *io_out, *copied, *caches):
            t.zero_()
        torch.cuda.synchronize()

    def statuses(rnd: int, what: str, st_w: int, st_g: int) -> None:
        check_status(st_w, Status.OK, clause=CL_STREAM_ORDER, case=case, what=f"round {rnd}{what}: write status")
        check_status(st_g, Status.OK, clause=CL_STREAM_ORDER, case=case, what=f"round {rnd}{what}: gather status")

    def bits(x):
        return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()])

    wrong = []
    for rnd in range(1, rounds + 1):
        src = [torch.randn(n * heads * dim, generator=gen, device=dev).to(tdt[io_dtype]) for _ in range(2)]
        reset()  # the control: the same calls, a wait after each
        for a, b in zip(io_in, src):
            a.copy_(b)
        torch.cuda.synchronize()
        st_w = int(provider.write_kv(cache, w, s.cuda_stream))
        s.synchronize()
        st_g = int(provider.gather_kv(cache, gd, s.cuda_stream))
        s.synchronize()
        statuses(rnd, " (each call waited for)", st_w, st_g)
        want = [bits(x).clone() for x in io_out]
        reset()
        with health.one_check("kvx_write_kv / kvx_gather_kv"):
            with torch.cuda.stream(s):
                hold_stream(torch, s)
                for a, b in zip(io_in, src):
                    a.copy_(b)
            st_w = int(provider.write_kv(cache, w, s.cuda_stream))
            st_g = int(provider.gather_kv(cache, gd, s.cuda_stream))
            with torch.cuda.stream(s):
                for a, b in zip(copied, io_out):
                    a.copy_(b)
            s.synchronize()
            torch.cuda.synchronize()
        statuses(rnd, "", st_w, st_g)
        for j, side in enumerate("KV"):
            final = bits(io_out[j])
            if torch.equal(bits(copied[j]), want[j]):
                continue
            if torch.equal(final, want[j]):
                wrong.append(f"round {rnd}, {side}: the gathered rows were right once the stream's work had "
                             "finished, but the copies queued after the gather did not see them (the gather's work "
                             "ran after the stream moved on)")
            elif not final.any():
                wrong.append(f"round {rnd}, {side}: the gathered rows are zeros, what the IO tensors and the cache "
                             "held before the stream's work (the write read its IO rows before the copies queued "
                             "before it filled them, or the gather read the cache before the write stored it)")
            else:
                bad = int((final.view(n, -1) != want[j].view(n, -1)).any(dim=1).sum())
                wrong.append(f"round {rnd}, {side}: {bad} of {n} gathered rows differ from those of the same calls "
                             "made with a wait after each (work of the two calls or of the copies around them "
                             "overlapped)")
    if wrong:
        raise ConformanceFailure(
            "calls on one stream ran outside its order",
            expected="the gather's outputs, copied by work queued after it on the same stream, equal to those of the "
                     "same calls made with a wait after each",
            got="; ".join(wrong), clause=CL_STREAM_ORDER, case=case, seed=seed)
    note_served_call()
