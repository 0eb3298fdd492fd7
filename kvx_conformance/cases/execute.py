"""Run one case on a provider: guarded buffers in, ctypes structs built, call, read back.

The executor is the only place where a case meets a provider. It never judges: it
returns a :class:`~kvx_conformance.cases.case.Result` (status, the memory after the call,
guard violations, changed inputs) for the suites to compare with the oracle's.

Every buffer a call may only read (the IO key and value of a write, slots, scales,
block table indices and indptr, sequence lengths, the cache and pools of a gather or a
validation) is put in read-only: its contents are kept and compared with the buffer
after the call, on host and device alike (docs/spec-readings.md R-INPUTS).
"""
from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass, field

import numpy as np

from ..abi import header as abi, buffers, descriptors as d, health
from ..abi.header import Memory, TableFormat
from .case import CacheCase, GatherCase, Result, ValidateCase, WriteCase


#: the default of ``CallOptions.seal_inputs``: off only where a store into an input must not end
#: the process (the mutant check runs its killers in its own process: harness.mutants)
SEAL_INPUTS = True


@dataclass
class CallOptions:
    """How to place a case in memory and call: memory type, misalignment, stream."""

    memory: Memory = Memory.HOST
    misalign: int = 0  # bytes added to every data pointer (cache and IO tensors)
    stream: int | None = None
    #: called between the provider's return and the read-back (e.g. lifetime checks)
    after_call: object = None
    #: DEVICE memory: the CUDA device the buffers go on (None: the current device)
    device: int | None = None
    #: inputs and descriptors read-only while the call runs (``_Arena.sealed``); off, only the
    #: comparison after the call sees a changed input (as on device memory)
    seal_inputs: bool = field(default_factory=lambda: SEAL_INPUTS)


class _Arena:
    """The buffers of one call, by name; checks all their guards, and that the read-only
    ones still hold what was put in, at the end."""

    def __init__(self, memory: Memory, misalign: int, device: int | None = None, seal: bool = True):
        self.memory, self.misalign, self.device, self.seal = memory, misalign, device, seal
        self.bufs: dict[str, buffers.Buffer] = {}
        self.readonly: dict[str, np.ndarray] = {}

    def put(self, name: str, array: np.ndarray | None, *, data: bool = False, readonly: bool = False) -> int:
        if array is None:
            return 0
        a = np.ascontiguousarray(array)
        buf = buffers.allocate(a.nbytes, self.memory, name, misalign=self.misalign if data else 0,
                               salt=len(self.bufs), device=self.device)
        buf.upload(a)
        self.bufs[name] = buf
        if readonly:
            self.readonly[name] = a.copy()
        return buf.ptr

    def input_changes(self) -> list[str]:
        """One line per read-only buffer whose contents the call changed."""
        out = []
        for name, before in self.readonly.items():
            line = buffers.input_change(name, before, self.bufs[name].download())
            if line:
                out.append(line)
        return out

    def refill(self, name: str, array: np.ndarray) -> None:
        """New contents for a buffer already placed (the same pointer; as many bytes)."""
        a = np.ascontiguousarray(array)
        self.bufs[name].upload(a)
        if name in self.readonly:
            self.readonly[name] = a.copy()

    def get(self, name: str, dtype: np.dtype) -> np.ndarray:
        return self.bufs[name].download().view(dtype)

    def violations(self) -> list[str]:
        out: list[str] = []
        for b in self.bufs.values():
            out.extend(b.violations())
        return out

    @contextlib.contextmanager
    def sealed(self, args: dict[str, object], held: dict[str, buffers.ReadOnlyWhileCalled] | None = None):
        """The call's arguments with every descriptor copied into pages of its own, and those
        pages and the read-only host buffers made read-only while the call runs: inputs are
        const (spec 7.2, kvx_abi.h), so a store into one faults in the call that made it, even
        one undone before the return (docs/spec-readings.md R-INPUTS). ``held``: copies kept
        across calls by name, refilled in place (one descriptor address for a call sequence)."""
        if not self.seal:
            yield args
            return
        copies = {}
        for k, v in args.items():
            if not isinstance(v, ctypes.Structure):
                continue
            if held is not None and k in held:
                held[k].refill(v)
                copies[k] = held[k]
            else:
                copies[k] = buffers.ReadOnlyWhileCalled(v)
        held = [c for c in copies.values()] + [self.bufs[n] for n in self.readonly]
        for h in held:
            h.seal(True)
        try:
            yield {**args, **{k: c.struct for k, c in copies.items()}}
        finally:
            for h in held:
                h.seal(False)


def apply_overrides(roots: dict[str, ctypes.Structure], overrides: dict) -> dict[str, object]:
    """Set dotted C fields (``cache.k.ndim``) on the built structs; returns the call args.

    A root overridden with None (``{"desc": None}``) is passed as a NULL pointer.
    """
    args: dict[str, object] = dict(roots)
    for path, value in overrides.items():
        parts = path.split(".")
        if len(parts) == 1:
            if value is not None:
                raise ValueError(f"only None may replace a whole struct: {path}")
            args[parts[0]] = None
            continue
        obj = roots[parts[0]]
        for p in parts[1:-1]:
            obj = getattr(obj, p)
        leaf = parts[-1]
        if "[" in leaf:
            name, idx = leaf[:-1].split("[")
            getattr(obj, name)[int(idx)] = value
        else:
            setattr(obj, leaf, value)
    return args


def _place_cache(arena: _Arena, cache: CacheCase, memory: Memory, *, readonly: bool) -> abi.kvx_cache_desc_t:
    """The cache tensors and pools; ``readonly`` for a call that only reads them (gather, validate)."""
    k_ptr = arena.put("k cache", cache.k_init, data=True, readonly=readonly)
    v_ptr = arena.put("v cache", cache.v_init, data=True, readonly=readonly)
    pool = cache.pool
    prim = sec = 0
    bpb = 0
    if pool is not None:
        bpb = pool.bytes_per_block
        prim = arena.put("primary pool", pool.primary, data=True, readonly=readonly)
        sec = (arena.put("secondary pool", pool.secondary, data=True, readonly=readonly)
               if pool.secondary is not None else 0)
        if pool.secondary_null:
            sec = 0
    return d.to_c_cache(cache.geom, cache.k, k_ptr, cache.v, v_ptr, memory,
                        pool_bytes_per_block=bpb, pool_primary=prim, pool_secondary=sec)


def run_validate(provider, case: ValidateCase, opts: CallOptions | None = None) -> Result:
    opts = opts or CallOptions()
    health.set_case(case)  # named if the call leaves a device fault
    arena = _Arena(opts.memory, opts.misalign, opts.device, opts.seal_inputs)
    c = _place_cache(arena, case.cache, opts.memory, readonly=True)
    with arena.sealed(apply_overrides({"cache": c}, case.c_overrides)) as args:
        st = provider.validate_cache_desc(args["cache"])
    buffers.synchronize(opts.memory, opts.device)
    return Result(st, {}, arena.violations(), input_changes=arena.input_changes())


def run_validate_sequence(provider, cases: list[ValidateCase], opts: CallOptions | None = None) -> list[Result]:
    """The validations of ``cases`` through one cache descriptor at one address, as an engine keeps
    its descriptor in one struct and rewrites it: the first case places the cache buffers (every case
    names the same ``CacheCase``); each call's descriptor is the first case's struct with that case's
    ``c_overrides``, copied into the same memory (the same pages while inputs are sealed, else the
    same ctypes struct). One Result per call."""
    opts = opts or CallOptions()
    if any(c.cache is not cases[0].cache for c in cases):
        raise ValueError("a validation sequence describes one cache: every case names the first case's cache")
    arena = _Arena(opts.memory, opts.misalign, opts.device, opts.seal_inputs)
    base = _place_cache(arena, cases[0].cache, opts.memory, readonly=True)
    one = type(base)()  # the struct passed while inputs are not sealed
    held = {"cache": buffers.ReadOnlyWhileCalled(base)} if opts.seal_inputs else None
    out = []
    for case in cases:
        health.set_case(case)
        c = type(base).from_buffer_copy(base)
        args = apply_overrides({"cache": c}, case.c_overrides)
        if args["cache"] is None:
            raise ValueError("a validation sequence passes a descriptor in every call")
        ctypes.memmove(ctypes.addressof(one), ctypes.addressof(c), ctypes.sizeof(c))
        with arena.sealed({"cache": one}, held) as sargs:
            st = provider.validate_cache_desc(sargs["cache"])
        buffers.synchronize(opts.memory, opts.device)
        out.append(Result(st, {}, arena.violations(), input_changes=arena.input_changes()))
    return out


def _scale_value_ptr(arena: _Arena, name: str, value: float | None) -> int:
    if value is None:
        return 0
    return arena.put(name, np.array([value], dtype=np.float32), readonly=True)


def _place_write(arena: _Arena, case: WriteCase, mem: Memory):
    """The buffers and C structs of a write: (cache, desc)."""
    cache = _place_cache(arena, case.cache, mem, readonly=False)
    g = case.cache.geom
    kp = arena.put("key", case.key, data=True, readonly=True)
    if case.value_is_key:  # one buffer for both inputs (io.value.data == io.key.data)
        if case.value_layout != case.key_layout or not np.array_equal(case.value.view(np.uint8), case.key.view(np.uint8)):
            raise ValueError("value_is_key: the value input must be the key input (same layout and contents)")
        vp = kp
    else:
        vp = arena.put("value", case.value, data=True, readonly=True)
    io = d.to_c_io(case.key_layout, kp, case.value_layout, vp, mem, case.num_tokens, g.num_kv_heads, g.head_dim)
    sp = arena.put("slots", case.slots.encoded(), readonly=True)
    desc = abi.kvx_write_desc_t.new()
    desc.io = io
    desc.slots = d.to_c_slots(case.slots, sp)
    desc.k_scale = _scale_value_ptr(arena, "k_scale", case.k_scale) or None
    desc.v_scale = _scale_value_ptr(arena, "v_scale", case.v_scale) or None
    for side in ("k", "v"):
        spec = getattr(case, f"{side}_scale_desc")
        ptr = (arena.put(f"{side}_scale_desc data", spec.buffer(), readonly=True)
               if spec is not None else 0)
        setattr(desc, f"{side}_scale_desc", d.to_c_scale(spec, ptr))
    return cache, desc


def _call_write(provider, arena: _Arena, case: WriteCase, cache, desc, opts: CallOptions) -> Result:
    with arena.sealed(apply_overrides({"cache": cache, "desc": desc}, case.c_overrides)) as args:
        st = provider.write_kv(args["cache"], args["desc"], opts.stream)
    if opts.after_call is not None:
        opts.after_call()
    buffers.synchronize(arena.memory, opts.device)
    kdt, vdt = case.cache.k_init.dtype, case.cache.v_init.dtype
    arrays = {"k": arena.get("k cache", kdt), "v": arena.get("v cache", vdt)}
    return Result(st, arrays, arena.violations(), input_changes=arena.input_changes())


def run_write(provider, case: WriteCase, opts: CallOptions | None = None) -> Result:
    opts = opts or CallOptions()
    health.set_case(case)  # named if the call leaves a device fault
    arena = _Arena(opts.memory, opts.misalign, opts.device, opts.seal_inputs)
    cache, desc = _place_write(arena, case, opts.memory)
    return _call_write(provider, arena, case, cache, desc, opts)


def _same_shapes(cases, *fields: str) -> None:
    for c in cases[1:]:
        for f in fields:
            x, y = getattr(cases[0], f), getattr(c, f)
            x = x.encoded() if hasattr(x, "encoded") else x
            y = y.encoded() if hasattr(y, "encoded") else y
            if x is not None and (np.asarray(x).nbytes != np.asarray(y).nbytes):
                raise ValueError(f"a call sequence reuses the first call's buffers: {f} must keep its size")


def run_write_sequence(provider, cases: list[WriteCase], opts: CallOptions | None = None, *,
                       reset_cache: bool = False) -> list[Result]:
    """The writes of ``cases`` through one set of buffers and descriptors, as an engine keeps a
    persistent slot mapping and input rows (CUDA graphs): the first case places the cache, the IO
    rows, the slots and the FP8 scale values; before each later call its IO rows, slots and scale
    values are copied into those same buffers (same pointers). The cache carries over, or with
    ``reset_cache`` is given the later case's initial contents again (the caller rewriting it between
    the calls); one Result per call (the cache after it)."""
    _same_shapes(cases, "key", "value", "slots")
    scales = {"k_scale": lambda c: None if c.k_scale is None else np.array([c.k_scale], np.float32),
              "v_scale": lambda c: None if c.v_scale is None else np.array([c.v_scale], np.float32),
              "k_scale_desc data": lambda c: None if c.k_scale_desc is None else c.k_scale_desc.buffer(),
              "v_scale_desc data": lambda c: None if c.v_scale_desc is None else c.v_scale_desc.buffer()}
    for c in cases[1:]:
        for name, get in scales.items():
            a, b = get(cases[0]), get(c)
            if (a is None) != (b is None) or (a is not None and a.nbytes != b.nbytes):
                raise ValueError(f"a call sequence reuses the first call's buffers: {name} must keep its size")

    def refill(arena: _Arena, case: WriteCase) -> None:
        if reset_cache:
            arena.refill("k cache", case.cache.k_init)
            arena.refill("v cache", case.cache.v_init)
            if case.cache.pool is not None:
                arena.refill("primary pool", case.cache.pool.primary)
                if case.cache.pool.secondary is not None:
                    arena.refill("secondary pool", case.cache.pool.secondary)
        arena.refill("key", case.key)
        if not case.value_is_key:
            arena.refill("value", case.value)
        arena.refill("slots", case.slots.encoded())
        for name, get in scales.items():
            values = get(case)
            if values is not None:
                arena.refill(name, values)

    return _sequence(provider, cases, opts or CallOptions(), _place_write, _call_write, refill)


def _sequence(provider, cases: list, opts: CallOptions, place, call, refill) -> list[Result]:
    """The calls of ``cases`` through the buffers ``place`` makes for the first one, ``refill``
    giving each later case's inputs to those buffers before its ``call``."""
    arena = _Arena(opts.memory, opts.misalign, opts.device, opts.seal_inputs)
    cache, desc = place(arena, cases[0], opts.memory)
    out = []
    for i, case in enumerate(cases):
        health.set_case(case)
        if i:
            refill(arena, case)
        out.append(call(provider, arena, case, cache, desc, opts))
    return out


def _place_gather(arena: _Arena, case: GatherCase, mem: Memory):
    """The buffers and C structs of a gather: (cache, desc)."""
    cache = _place_cache(arena, case.cache, mem, readonly=True)
    g = case.cache.geom
    kp = arena.put("out key", case.out_k_init, data=True)
    vp = arena.put("out value", case.out_v_init, data=True)
    io = d.to_c_io(case.out_layout, kp, case.value_out, vp, mem, case.num_tokens, g.num_kv_heads, g.head_dim)
    t = case.table
    ip = arena.put("indices", t.encoded_indices() if len(t.indices) else None, readonly=True)
    pp = arena.put("indptr", t.encoded_indptr(), readonly=True)
    lp = arena.put("seq_lens", case.seq_lens.encoded() if len(case.seq_lens.lengths) else None, readonly=True)
    desc = abi.kvx_gather_desc_t.new(max_seq_len=case.max_seq_len)
    desc.io = io
    desc.block_table = d.to_c_table(t, ip, pp)
    desc.seq_lens = d.to_c_seq_lens(case.seq_lens, lp)
    return cache, desc


def _call_gather(provider, arena: _Arena, case: GatherCase, cache, desc, opts: CallOptions) -> Result:
    with arena.sealed(apply_overrides({"cache": cache, "desc": desc}, case.c_overrides)) as args:
        st = provider.gather_kv(args["cache"], args["desc"], opts.stream)
    if opts.after_call is not None:
        opts.after_call()
    buffers.synchronize(arena.memory, opts.device)
    arrays = {"k": arena.get("out key", case.out_k_init.dtype), "v": arena.get("out value", case.out_v_init.dtype)}
    # a gather only reads the cache: a change to it is a changed input
    return Result(st, arrays, arena.violations(), input_changes=arena.input_changes())


def run_gather(provider, case: GatherCase, opts: CallOptions | None = None) -> Result:
    opts = opts or CallOptions()
    health.set_case(case)  # named if the call leaves a device fault
    arena = _Arena(opts.memory, opts.misalign, opts.device, opts.seal_inputs)
    cache, desc = _place_gather(arena, case, opts.memory)
    return _call_gather(provider, arena, case, cache, desc, opts)


def run_gather_sequence(provider, cases: list[GatherCase], opts: CallOptions | None = None) -> list[Result]:
    """The gathers of ``cases`` through one set of buffers and descriptors (as
    :func:`run_write_sequence`): the first case places the cache, the outputs, the block table and
    the lengths; before each later call its table and lengths are copied into those same buffers
    and the outputs poisoned again. One Result per call (the outputs after it)."""
    _same_shapes(cases, "out_k_init", "out_v_init")
    for c in cases[1:]:
        if (c.table.encoded_indices().nbytes, c.seq_lens.encoded().nbytes) != (
                cases[0].table.encoded_indices().nbytes, cases[0].seq_lens.encoded().nbytes):
            raise ValueError("a call sequence reuses the first call's buffers: the table and lengths keep their sizes")

    def refill(arena: _Arena, case: GatherCase) -> None:
        arena.refill("out key", case.out_k_init)
        arena.refill("out value", case.out_v_init)
        if len(case.table.indices):
            arena.refill("indices", case.table.encoded_indices())
        if case.table.encoded_indptr() is not None:
            arena.refill("indptr", case.table.encoded_indptr())
        if len(case.seq_lens.lengths):
            arena.refill("seq_lens", case.seq_lens.encoded())

    return _sequence(provider, cases, opts or CallOptions(), _place_gather, _call_gather, refill)