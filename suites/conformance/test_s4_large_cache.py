"""Spec 4.1, 4.2, 7 (R-CACHE): a cache of more than 2^32 elements and 2^24 slots (64-bit offsets).

Slot and element arithmetic done in 32 bits, or slot indices carried in float32, go wrong
only past 2^31 elements (signed offsets), 2^32 elements (unsigned offsets) or 2^24 slots
(float32 mantissa); the small caches of the other suites never get there. Here one F16 cache
of 2^20 + 64 blocks of 16 slots x 2 heads x 128 (2^32 + 2^18 elements, 8 GiB per tensor) is
written and gathered at the rows that cross those lines (and KV_OFFSETS pools read past them):

- ``large_cache.write_high_slots``: a write of a few tokens whose slots straddle 2^23 (element
  offset 2^31), 2^24 (element offset 2^32; float32 rounds odd slots above it), and the last
  slots, with one low slot for contrast. Each written row must hold exactly the IO bits at the
  element offsets of ``reference_impl.addressing.cache_offsets``, and no other byte of either
  cache may change (every non-zero word of the caches is accounted for).
- ``large_cache.gather_high_blocks``: a PACKED gather of blocks that straddle the same lines,
  filled by the harness (one block partly: its other slots read as zeros), compared bit-exactly
  with the oracle's gather of the same blocks in a compact cache; the cache is left unchanged.
- ``large_cache.kv_offsets_high_indices``: a KV_OFFSETS gather (2 sequences x 2 beams) from a
  primary and a secondary pool of 2^26 + 64 blocks of 128 bytes (8 GiB + 8 KiB each; F16, E4M3 and
  F32 blocks, one case each: a kernel per element size may compute offsets in 32 bits in one) whose
  K entries (primary) and V entries (secondary, four primary) name blocks whose byte offset
  ``index * bytes_per_block`` straddles 2^31, 2^32 (uint32 byte offsets wrap) and 2^33
  (element offset 2^32), and the last blocks; pool indices are not bounded by num_blocks
  (R-DATA). Compared bit-exactly with the oracle's gather of the same blocks in compact
  pools; the pools are left unchanged. A refusal is excused by ``large_cache``,
  ``kv_offsets`` or ``secondary_pool``.
- ``large_cache.write_slots_past_2_31``: S64 slot indices on each side of 2^31 and 2^32 in a cache
  of 2^32 + 1024 slots of one element (8 GiB per tensor): slots carried in 32 bits go negative or
  wrap, a capacity computed in uint32 wraps.
- ``large_cache.gather_output_rows_past_2_31`` / ``large_cache.write_input_rows_past_2_31``: IO
  tensors whose rows cross element offsets 2^31 and 2^32 (a gather output of 3 x (2^21 + 2^10) rows
  of 1024 elements, 12 GiB; a write of 2^22 + 2^10 tokens, 8 GiB of input, all but 8 of them with
  slot -1), read and written through sparse buffers like the caches.

The same write and gather run in a cache of the same slots with rows of 1 head x 64 dims (2^30 + 2^16
elements, 2 GiB + 128 KiB per tensor), where slot 2^24 and block 2^20 sit at byte offset 2^31:
``write.wide_cache_high_slots`` and ``gather.packed.wide_cache_high_blocks``, required (profile core).
Such a cache is within 2^31 elements, so it is not the feature ``large_cache``: a provider that refuses
the 8 GiB cache above, as it may, must still address every slot of this one, and byte offsets taken in
int32 or slots carried in float32 are seen there.

The write and the gather run in NHD, HND and HND_PACKED caches (HND_PACKED with 8-element, 16-byte
groups; a layout other than the provider's core one refusable as well): a kernel per layout may
compute offsets in 32 bits in one of them only.

The cache (and the pools) are never materialized: on HOST memory a private anonymous mapping
whose untouched pages read as the zero page, scanned only where the process touched it
(``buffers.SparseBuffer``); on DEVICE memory zeroed GPU memory (16 GiB) scanned on the GPU;
on UNIFIED memory zeroed managed memory scanned on the GPU. A provider may refuse a cache it
cannot address (UNSUPPORTED or INVALID_ARGUMENT, writing nothing): the optional feature
``large_cache``. It may never write, or read, the wrong elements.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from kvx_conformance.abi import buffers, health
from kvx_conformance.abi import descriptors as d
from kvx_conformance.abi import header as abi
from kvx_conformance.abi.descriptors import BlockTable, Geometry, IOLayout, SeqLens, SlotMapping, TensorLayout
from kvx_conformance.abi.dtypes import BITS_DTYPE, np_dtype
from kvx_conformance.abi.header import DType, Layout, Memory, Status
from kvx_conformance.abi.loader import status_name
from kvx_conformance.cases import build as cb
from kvx_conformance.cases import execute
from kvx_conformance.cases.case import PoolCase, Result
from kvx_conformance.cases.checks import check_arrays, check_guards, check_inputs, check_status, refusable_features
from kvx_conformance.reference_impl.addressing import cache_offsets
from kvx_conformance.results.outcomes import REQUIRED, ConformanceFailure, Unsupported, conformance, note_served_call

FEATURE = "large_cache"
BS, H, D = 16, 2, 128
#: 2^20 + 64 blocks: 2^24 + 1024 slots, 2^32 + 2^18 elements (8 GiB of F16) per tensor
GEOM = Geometry(num_blocks=(1 << 20) + 64, block_size=BS, num_kv_heads=H, head_dim=D)
#: the same blocks and slots with rows of 1 head x 64: 2^30 + 2^16 elements, 2^31 + 2^17 bytes (2 GiB of
#: F16) per tensor; slot 2^24 (block 2^20) sits at byte offset 2^31
WIDE_GEOM = Geometry(num_blocks=GEOM.num_blocks, block_size=BS, num_kv_heads=1, head_dim=64)
ITEM = 2  # bytes of an F16 element

CL_WRITE = ("spec 4.1 (block_idx = slot_idx / block_size, offset = slot_idx % block_size), 4.2 (strides in "
            "elements, int64), 7 (kvx_write_kv writes every token) - 64-bit offsets; R-CACHE")
CL_GATHER = ("spec 4.1, 4.2 (strides in elements, int64), 5.1 (PACKED block table), 6.10, 7 (kvx_gather_kv) - "
             "64-bit offsets; R-CACHE, R-GATHER")
REFUSALS = (Status.UNSUPPORTED, Status.INVALID_ARGUMENT)

S23, S24, LAST = 1 << 23, 1 << 24, GEOM.num_slots - 1
#: written slots: why each one is there
WRITE_SLOTS = {
    5: "a low slot (contrast)",
    S23 - 1: "the last slot below element offset 2^31",
    S23: "element offset 2^31 (int32 offsets overflow)",
    S23 + 1: "past element offset 2^31",
    S24 - 1: "the last slot below element offset 2^32",
    S24: "slot 2^24, element offset 2^32 (uint32 offsets wrap to 0)",
    S24 + 1: "slot 2^24 + 1 (float32 rounds it to 2^24)",
    S24 + 3: "slot 2^24 + 3 (float32 rounds it to 2^24 + 4)",
    S24 + 2 * BS + 7: "an odd slot two blocks past 2^24",
    S24 + 517: "an odd slot past 2^24",
    LAST - 1: "the last slot but one",
    LAST: "the last slot",
}
B19, B20, LAST_BLOCK = 1 << 19, 1 << 20, GEOM.num_blocks - 1
#: gathered blocks, three sequences of three blocks; LAST_BLOCK is filled only in its first 9 slots
GATHER_TABLE = [[B19 - 1, B19, 3], [B20 - 1, B20, B20 + 1], [B20 + 33, LAST_BLOCK - 1, LAST_BLOCK]]
GATHER_LENS = [40, 48, 48]
PARTIAL_BLOCK, PARTIAL_FILL = LAST_BLOCK, 9
SEED_WRITE, SEED_GATHER = 4_2024, 4_2031
SEED_WIDE_WRITE, SEED_WIDE_GATHER = 4_2111, 4_2117


@dataclass(frozen=True)
class BigCache:
    """A cache the write and the gather below run in: its geometry, the written slots (why each one is
    there), what it reaches past (failure titles), and whether it is the optional ``large_cache``
    feature's (more than 2^31 elements) or a cache every provider serves (R-LARGE)."""
    geom: Geometry
    slots: dict
    past: str
    large: bool
    seed_write: int
    seed_gather: int



def _pow2(n: int) -> str:
    """``n`` near a power of two, readably: 2147483648 -> "2^31", 4294967297 -> "2^32 + 1"."""
    n = int(n)
    if n < 1 << 20:
        return str(n)
    p = n.bit_length() - 1
    if n - (1 << p) > (1 << (p + 1)) - n:
        p += 1
    rest = n - (1 << p)
    if abs(rest) > 1 << (p - 6):
        return str(n)
    return f"2^{p}" + ("" if rest == 0 else f" {'+' if rest > 0 else '-'} {abs(rest)}")


def _slot_notes(g: Geometry) -> dict[int, str]:
    """WRITE_SLOTS' slots, each with what it reaches in a cache of ``g``: its element and byte offsets
    (rows of ``g``'s heads x head_dim F16 elements) and, past 2^24, the slot float32 rounds it to."""
    row = g.num_kv_heads * g.head_dim
    notes = {}
    for s in WRITE_SLOTS:
        f = int(np.float32(s))
        notes[s] = (f"element offset {_pow2(s * row)}, byte offset {_pow2(s * row * ITEM)}"
                    + (f"; float32 rounds it to {_pow2(f)}" if f != s else ""))
    return notes


#: 8 GiB per tensor: the feature ``large_cache``
LARGE = BigCache(GEOM, WRITE_SLOTS, "beyond 2^31 elements and 2^24 slots", True, SEED_WRITE, SEED_GATHER)
#: 2 GiB per tensor, within 2^31 elements: required of every provider in its core layout; the same slots (slot
#: 2^24 at byte offset 2^31)
WIDE = BigCache(WIDE_GEOM, _slot_notes(WIDE_GEOM), "past 2^31 bytes and 2^24 slots, within 2^31 elements", False,
                SEED_WIDE_WRITE, SEED_WIDE_GATHER)


#: the canonical layouts of the large-cache write and gather: offsets computed in 32 bits in one
#: layout's kernel alone go wrong there only. A layout other than the provider's core one is also
#: its own optional feature (R-REFUSAL).
KINDS = pytest.mark.parametrize("kind", ["nhd", "hnd", "hnd_packed"])
#: HND_PACKED's pack: 8 F16 elements, the 16-byte groups of the engines' packed caches (R-CACHE)
PACK = 8


def _layout(geom: Geometry, kind: str) -> TensorLayout:
    """The F16 cache tensor of ``geom`` in layout ``kind`` (HND_PACKED with PACK-element groups)."""
    return cb.layout(geom, kind, DType.F16, pack=PACK if kind == "hnd_packed" else None)


def _pack(t: TensorLayout) -> int:
    return t.shape[4] if t.layout == Layout.BLOCK_HND_PACKED else 1


def _kind_features(provider, memory: Memory, kind: str, big: BigCache = LARGE) -> tuple[str, ...]:
    """What excuses a refusal of ``big`` in layout ``kind``: ``large_cache`` where ``big`` is that
    feature's, and the layout unless it is the provider's core one (nothing, for a cache within
    2^31 elements in the core layout)."""
    own = (FEATURE,) if big.large else ()
    return own if kind == cb.core_layout(provider, memory) else own + (kind,)


def _locate(t: TensorLayout, off: int) -> tuple[int, int, int, int]:
    """(block, token, head, dim) of the element at element offset ``off`` of a canonical NHD / HND /
    HND_PACKED tensor."""
    s = t.stride
    b, r = divmod(int(off), s[0])
    if t.layout == Layout.BLOCK_HND_PACKED:
        h, r = divmod(r, s[1])
        group, r = divmod(r, s[2])
        tok, lane = divmod(r, s[3])
        dim = group * _pack(t) + lane
    elif t.layout == Layout.BLOCK_HND:
        h, r = divmod(r, s[1])
        tok, dim = divmod(r, s[2])
    else:
        tok, r = divmod(r, s[1])
        h, dim = divmod(r, s[2])
    return b, tok, h, dim


def _where(t: TensorLayout, off: int) -> str:
    """The cache element at element offset ``off``, by name."""
    b, tok, h, dim = _locate(t, off)
    return f"slot {b * BS + tok} (block {b}, token {tok}, head {h}, dim {dim}; element offset {_pow2(off)})"


def _row_offsets(t: TensorLayout, g: Geometry, slots: np.ndarray) -> np.ndarray:
    """``[tokens, H, D]`` element offsets of the rows of ``slots`` in a cache of ``g`` (R-CACHE
    addressing, int64)."""
    s = np.asarray(slots, np.int64)[:, None, None]
    h = np.arange(g.num_kv_heads, dtype=np.int64)[None, :, None]
    dd = np.arange(g.head_dim, dtype=np.int64)[None, None, :]
    return cache_offsets(t.layout, tuple(t.stride), _pack(t), s // BS, s % BS, h, dd)


def _f16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random normal F16 values (never zero, infinite or NaN) as uint16 bits: a stored one is
    told apart from the zero-filled cache, and any copy that is not bit-exact is seen."""
    sign = rng.integers(0, 2, n, dtype=np.uint16) << 15
    exp = rng.integers(1, 31, n, dtype=np.uint16) << 10
    return sign | exp | rng.integers(0, 1 << 10, n, dtype=np.uint16)


def _check_memory_available(memory: Memory, need: int, what: str = "the large cache") -> None:
    if memory == Memory.HOST:
        return
    import torch

    need = int(need) + (1 << 30)
    free, _ = torch.cuda.mem_get_info()
    if free < need:
        pytest.skip(f"{what} needs {need / 2**30:.1f} GiB of free GPU memory ({free / 2**30:.1f} GiB free)")


class _Caches:
    """The K and V caches of ``g`` in layout ``t``, zero-filled and sparse (``buffers.SparseBuffer``)."""

    def __init__(self, t: TensorLayout, g: Geometry, opts: execute.CallOptions):
        self.t, self.g = t, g
        self.nbytes = t.span_elements() * ITEM
        _check_memory_available(opts.memory, 2 * self.nbytes)
        dev = opts.device if opts.memory == Memory.DEVICE else None
        self.bufs: dict[str, buffers.SparseBuffer] = {}
        for i, side in enumerate(("k", "v")):
            self.bufs[side] = buffers.SparseBuffer(self.nbytes, opts.memory, f"{side} cache", salt=40 + i,
                                                   device=dev)

    def c_desc(self, memory: Memory) -> abi.kvx_cache_desc_t:
        return d.to_c_cache(self.g, self.t, self.bufs["k"].ptr, self.t, self.bufs["v"].ptr, memory)

    def store_rows(self, side: str, offsets: np.ndarray, bits: np.ndarray) -> None:
        """``bits[i, h, d]`` at element ``offsets[i, h, d]`` (harness writes, row by row)."""
        buf = self.bufs[side]
        for off, val in zip(offsets, bits):
            lo, hi = int(off.min()), int(off.max())
            span = np.frombuffer(buf.read(lo * ITEM, (hi - lo + 1) * ITEM).tobytes(), np.uint16).copy()
            span[(off - lo).reshape(-1)] = val.reshape(-1)
            buf.write(lo * ITEM, span)

    def load_rows(self, side: str, offsets: np.ndarray) -> np.ndarray:
        """The uint16 bits at ``offsets[i, h, d]``, same shape."""
        buf = self.bufs[side]
        out = np.empty(offsets.shape, np.uint16)
        for i, off in enumerate(offsets):
            lo, hi = int(off.min()), int(off.max())
            span = np.frombuffer(buf.read(lo * ITEM, (hi - lo + 1) * ITEM).tobytes(), np.uint16)
            out[i] = span[off - lo]
        return out

    def stray(self, side: str, expected_words: set[int], rows: np.ndarray | None = None,
              slots: np.ndarray | None = None, limit: int = 4) -> tuple[int, list[str]]:
        """Non-zero words of a cache outside ``expected_words`` (8-byte word indices): how many,
        and one line for each of the first ``limit`` slots they lie in, naming its first non-zero
        element and, where the slot holds one of ``rows`` (``[tokens, H, D]`` uint16 bits: the
        rows the call wrote), which."""
        buf = self.bufs[side]
        total, words = buf.nonzero_words(limit=len(expected_words) + 4096)
        extra = [int(w) for w in words if int(w) not in expected_words]
        n = total - self._nonzero_among(side, expected_words)
        lines, seen = [], set()
        for w in extra:
            vals = np.frombuffer(buf.read(w * 8, 8).tobytes(), np.uint16)
            j = int(np.flatnonzero(vals)[0]) if vals.any() else 0
            b, tok, _, _ = _locate(self.t, w * 4 + j)
            slot = b * BS + tok
            if slot in seen:
                continue
            seen.add(slot)
            line = f"{_where(self.t, w * 4 + j)} holds 0x{int(vals[j]):04x}"
            if rows is not None:
                have = self.load_rows(side, _row_offsets(self.t, self.g, np.array([slot], np.int64)))[0]
                line += _whose(have, rows, slots)
            lines.append(line)
            if len(lines) == limit:
                break
        return n, lines

    def _nonzero_among(self, side: str, words: set[int]) -> int:
        """How many of ``words`` (8-byte word indices) are non-zero, read in contiguous runs."""
        w = np.array(sorted(words), np.int64)
        n = 0
        for run in np.split(w, np.flatnonzero(np.diff(w) != 1) + 1) if w.size else []:
            raw = self.bufs[side].read(int(run[0]) * 8, int(run.size) * 8)
            n += int(np.count_nonzero(np.frombuffer(raw.tobytes(), np.uint64)))
        return n

    def violations(self) -> list[str]:
        return [v for b in self.bufs.values() for v in b.violations()]

    def seal(self, on: bool) -> None:
        for b in self.bufs.values():
            b.seal(on)

    def close(self) -> None:
        for b in self.bufs.values():
            b.close()


def _whose(have: np.ndarray, rows: np.ndarray, slots: np.ndarray | None = None) -> str:
    """", the row of token i" when ``have`` ([H, D] bits) is one of ``rows`` ([tokens, H, D])."""
    hit = np.flatnonzero((rows == have[None]).reshape(len(rows), -1).all(axis=1))
    if not hit.size:
        return ""
    i = int(hit[0])
    return f", the row of token {i}" + (f" (slot {int(slots[i])})" if slots is not None else "")


def _geom_text(t: TensorLayout, g: Geometry) -> str:
    n = t.span_elements()
    return (f"cache of {g.num_blocks} ({_pow2(g.num_blocks)}) blocks x {BS} slots x {g.num_kv_heads} heads x "
            f"{g.head_dim} ({t.layout.name}{f' pack {_pack(t)}' if _pack(t) > 1 else ''} F16, strides {t.stride}): "
            f"{g.num_slots} ({_pow2(g.num_slots)}) slots, {n} ({_pow2(n)}) elements, {_pow2(n * ITEM)} bytes "
            f"({n * ITEM / 2**30:.2f} GiB) per tensor")


def _refused(got: Result, label: str, clause: str, case: str, seed: int, changed: list[str],
             features: tuple[str, ...] = (FEATURE,)) -> None:
    """A refusal must have written nothing (``changed``: what it wrote, one line each; the guards);
    then it is the features' to excuse (any one of ``features`` unclaimed excuses it; none: a cache
    every provider serves)."""
    name = status_name(got.status)
    bad = changed + got.guard_violations
    if bad:
        raise ConformanceFailure(f"the provider answered {name} but modified memory",
                                 expected="a refusal writes nothing", got="; ".join(bad), clause=clause,
                                 case=case, seed=seed)
    if not features:
        raise ConformanceFailure(
            f"the provider refused {label}, a cache of at most 2^31 elements in its core layout",
            expected="OK and the call's effect: only caches of more than 2^31 elements are the optional feature "
                     "large_cache; strides are int64 and slot_idx / block_size integer arithmetic, so every slot "
                     "of num_blocks * block_size is addressed (R-LARGE)",
            got=name, clause=clause + "; R-LARGE", case=case, seed=seed)
    raise Unsupported(f"provider answered {name} for {label}", tuple(features), refused_with=name)


def _outputs_changed(got: Result, proxy) -> list[str]:
    """The gather outputs a refused call changed, one line each (against the proxy's initial outputs)."""
    return [f"{label}: changed" for label, g_, init in (("out key", got.arrays["k"], proxy.out_k_init),
                                                         ("out value", got.arrays["v"], proxy.out_v_init))
            if not np.array_equal(g_.view(np.uint16), init.view(np.uint16))]


def _answered(st, got: Result, label: str, clause: str, case: str, seed: int, changed, what: str,
              features: tuple[str, ...] = (FEATURE,)) -> None:
    """The call's status: a refusal (REFUSALS) must have written nothing (``changed()``: what it wrote,
    one line each; read only then) and is the features' to excuse (:func:`_refused`); any other status
    must be OK (``what``: the status check's wording), and the guards must hold."""
    if int(st) in (int(s) for s in REFUSALS):
        _refused(got, label, clause, case, seed, changed(), features)
    check_status(int(st), (Status.OK,) + REFUSALS, clause=clause, case=case, what=what)
    check_guards(got, clause=clause, case=case)


# ---------------------------------------------------------------------------- write


@conformance("large_cache.write_high_slots", CL_WRITE, REQUIRED, "robustness", "write", feature=FEATURE)
@pytest.mark.parametrize("slot_dtype", [DType.S64, DType.S32], ids=["s64", "s32"])
@KINDS
def test_write_high_slots(kvx_provider, kvx_call_options, kind, slot_dtype):
    _write_high_slots(kvx_provider, kvx_call_options(), LARGE, kind, slot_dtype)


def _write_high_slots(kvx_provider, opts: execute.CallOptions, big: BigCache, kind: str, slot_dtype: DType) -> None:
    """A write of a few tokens at ``big.slots`` (shuffled) into ``big``'s cache in layout ``kind``: each
    row bit-exact at its element offsets, no other element changed."""
    mem, g = opts.memory, big.geom
    H, D = g.num_kv_heads, g.head_dim
    ROW = H * D
    t = _layout(g, kind)
    seed = big.seed_write + int(slot_dtype)
    rng = cb.rng_for(seed)
    slots = np.array(list(big.slots), np.int64)
    slots = slots[rng.permutation(len(slots))]  # not in ascending order
    n = len(slots)
    key, value = _f16_bits(rng, n * ROW), _f16_bits(rng, n * ROW)
    io = IOLayout.dense(DType.F16, n, H, D)
    sm = SlotMapping(slots, dtype=slot_dtype)
    case = (f"write of {n} F16 tokens (IO dense [{n}, {H}, {D}], slots {slot_dtype.name}) into a {_geom_text(t, g)}; "
            f"slots {slots.tolist()}")
    health.set_case(case)
    caches = _Caches(t, g, opts)
    try:
        arena = execute._Arena(mem, 0, opts.device, opts.seal_inputs)
        kp = arena.put("key", key.view(np.float16), data=True, readonly=True)
        vp = arena.put("value", value.view(np.float16), data=True, readonly=True)
        sp = arena.put("slots", sm.encoded(), readonly=True)
        desc = abi.kvx_write_desc_t.new()
        desc.io = d.to_c_io(io, kp, io, vp, mem, n, H, D)
        desc.slots = d.to_c_slots(sm, sp)
        desc.k_scale_desc, desc.v_scale_desc = d.to_c_scale(None, 0), d.to_c_scale(None, 0)  # sized, no scale
        with arena.sealed({"cache": caches.c_desc(mem), "desc": desc}) as args:
            st = kvx_provider.write_kv(args["cache"], args["desc"], opts.stream)
        buffers.synchronize(mem, opts.device)
        got = Result(int(st), {}, arena.violations() + caches.violations(), input_changes=arena.input_changes())
        check_inputs(got, case=case)
        offsets = _row_offsets(t, g, slots)
        words = {int(w) for w in np.unique(offsets.reshape(-1) * ITEM // 8)}
        def written() -> list[str]:
            stray = []
            for side in ("k", "v"):
                k_n, lines = caches.stray(side, set())
                if k_n:
                    stray.append(f"{side.upper()} cache: {k_n} word(s) written; " + "; ".join(lines))
            return stray

        _answered(st, got, f"a write into a {_geom_text(t, g)}", CL_WRITE, case, seed, written,
                  "status (OK, or a refusal of the large cache)" if big.large else "status (OK: a cache within 2^31 elements)",
                  _kind_features(kvx_provider, mem, kind, big))
        bad: list[str] = []
        for side, io_bits in (("k", key), ("v", value)):
            want = io_bits.reshape(n, H, D)
            have = caches.load_rows(side, offsets)
            rows = [i for i in range(n) if not np.array_equal(have[i], want[i])]
            for i in rows[:6]:
                h, dd = (int(x) for x in np.argwhere(have[i] != want[i])[0])
                wrong = int(np.count_nonzero(have[i] != want[i]))
                bad.append(f"{side.upper()} cache, token {i} -> slot {int(slots[i])} ({big.slots[int(slots[i])]}): "
                           f"{wrong} of {ROW} elements wrong, first {_where(t, int(offsets[i, h, dd]))}: expected "
                           f"0x{int(want[i, h, dd]):04x}, got 0x{int(have[i, h, dd]):04x}"
                           + (" (never written)" if not have[i].any() else
                              f" (the slot holds{_whose(have[i], want, slots)[1:]})" if _whose(have[i], want) else ""))
            k_n, lines = caches.stray(side, words, want, slots)
            if k_n:
                bad.append(f"{side.upper()} cache: {k_n} word(s) outside every written row changed (the cache was "
                           f"zero-filled); " + "; ".join(lines))
        if bad:
            raise ConformanceFailure(
                f"a write into a cache {big.past} answered OK but misplaced or dropped tokens",
                expected="every token's K and V rows, bit-exact, at the element offsets of slot_idx / block_size, "
                         "slot_idx % block_size (64-bit arithmetic), and no other element changed",
                got="\n            ".join(bad), clause=CL_WRITE, case=case, seed=seed)
        note_served_call()
    finally:
        caches.close()


# ---------------------------------------------------------------------------- gather


def _gather_contents(rng: np.random.Generator, g: Geometry) -> dict[int, dict[str, np.ndarray]]:
    """Per gathered block: ``{"k", "v"}`` uint16 bits ``[BS, H, D]`` of ``g`` (zeros past PARTIAL_FILL
    in PARTIAL_BLOCK: slots never written read as zeros)."""
    out = {}
    for b in sorted({b for row in GATHER_TABLE for b in row}):
        blk = {}
        for side in ("k", "v"):
            bits = _f16_bits(rng, BS * g.num_kv_heads * g.head_dim).reshape(BS, g.num_kv_heads, g.head_dim)
            if b == PARTIAL_BLOCK:
                bits[PARTIAL_FILL:] = 0
            blk[side] = bits
        out[b] = blk
    return out


def _compact_case(t_kind: str, big_geom: Geometry, contents: dict[int, dict[str, np.ndarray]], seed: int):
    """The same gather from a compact cache holding only the gathered blocks (renumbered): the
    oracle's answer for it is the answer for the large cache."""
    ids = sorted(contents)
    g = Geometry(num_blocks=len(ids), block_size=BS, num_kv_heads=big_geom.num_kv_heads, head_dim=big_geom.head_dim)
    t = _layout(g, t_kind)
    bb, tt, hh, dd = np.indices((len(ids), BS, g.num_kv_heads, g.head_dim), dtype=np.int64)
    off = cache_offsets(t.layout, tuple(t.stride), _pack(t), bb, tt, hh, dd)
    init = {}
    for side in ("k", "v"):
        flat = np.zeros(t.span_elements(), np.uint16)
        flat[off] = np.stack([contents[b][side] for b in ids])
        init[side] = flat.view(np.float16)
    cache = cb.make_cache(g, t, t, seed=seed)
    cache = cb.replace(cache, k_init=init["k"], v_init=init["v"])
    table = [[ids.index(b) for b in row] for row in GATHER_TABLE]
    msl = len(GATHER_TABLE[0]) * BS
    return cb.packed_gather(cache, table, GATHER_LENS, msl, seed=seed, label="large cache (compact proxy)")


def _expected_gather(proxy, mem: Memory) -> Result:
    """The oracle's gather of the compact proxy; anything but OK is a harness fault."""
    from kvx_conformance import reference_impl

    exp = reference_impl.expected_gather(proxy, mem)
    if int(exp.status) != Status.OK:
        raise RuntimeError(f"harness: the oracle answers {status_name(int(exp.status))} (rule {exp.rule}) for "
                           f"{proxy.describe()}")
    return exp


def _gather_desc(arena: "execute._Arena", proxy, table: BlockTable, lens: SeqLens, mem: Memory):
    """The gather descriptor of the real call: the proxy's outputs (same rows and layout), the
    large table and the lengths, in ``arena``."""
    g = proxy.cache.geom
    kp = arena.put("out key", proxy.out_k_init, data=True)
    vp = arena.put("out value", proxy.out_v_init, data=True)
    ip = arena.put("indices", table.encoded_indices(), readonly=True)
    lp = arena.put("seq_lens", lens.encoded(), readonly=True)
    desc = abi.kvx_gather_desc_t.new(max_seq_len=proxy.max_seq_len)
    desc.io = d.to_c_io(proxy.out_layout, kp, proxy.out_layout, vp, mem, proxy.num_tokens, g.num_kv_heads, g.head_dim)
    desc.block_table = d.to_c_table(table, ip, 0)
    desc.seq_lens = d.to_c_seq_lens(lens, lp)
    return desc


@conformance("large_cache.gather_high_blocks", CL_GATHER, REQUIRED, "robustness", "gather", feature=FEATURE)
@KINDS
def test_gather_high_blocks(kvx_provider, kvx_call_options, kind):
    _gather_high_blocks(kvx_provider, kvx_call_options(), LARGE, kind)


def _gather_high_blocks(kvx_provider, opts: execute.CallOptions, big: BigCache, kind: str) -> None:
    """A PACKED gather of GATHER_TABLE's blocks from ``big``'s cache in layout ``kind``, bit-exact
    against the oracle's gather of the same blocks in a compact cache; the cache unchanged."""
    mem, g = opts.memory, big.geom
    H, D = g.num_kv_heads, g.head_dim
    t = _layout(g, kind)
    seed = big.seed_gather
    rng = cb.rng_for(seed)
    contents = _gather_contents(rng, g)
    proxy = _compact_case(kind, g, contents, seed)
    exp = _expected_gather(proxy, mem)
    msl = proxy.max_seq_len
    table = BlockTable.packed(np.array(GATHER_TABLE, np.int64))
    lens = SeqLens(np.array(GATHER_LENS, np.int64))
    case = (f"PACKED gather from a {_geom_text(t, g)}; table {GATHER_TABLE} (S32), lengths {GATHER_LENS} (S32), "
            f"max_seq_len {msl}; block {PARTIAL_BLOCK} holds its first {PARTIAL_FILL} slots, every other slot of "
            f"the gathered blocks is filled, the rest of the cache is zero")
    health.set_case(case)
    caches = _Caches(t, g, opts)
    try:
        ids = sorted(contents)
        blk_off = _row_offsets(t, g, np.array([b * BS + s for b in ids for s in range(BS)], np.int64))
        filled = {}
        for side in ("k", "v"):
            bits = np.concatenate([contents[b][side] for b in ids])  # [blocks * BS, H, D]
            caches.store_rows(side, blk_off, bits)
            filled[side] = bits
        words = {int(w) for w in np.unique(blk_off.reshape(-1) * ITEM // 8)}
        arena = execute._Arena(mem, 0, opts.device, opts.seal_inputs)
        desc = _gather_desc(arena, proxy, table, lens, mem)
        if opts.seal_inputs:
            caches.seal(True)  # the cache is an input of a gather: a store into it faults
        try:
            with arena.sealed({"cache": caches.c_desc(mem), "desc": desc}) as args:
                st = kvx_provider.gather_kv(args["cache"], args["desc"], opts.stream)
        finally:
            caches.seal(False)
        buffers.synchronize(mem, opts.device)
        got = Result(int(st), {"k": arena.get("out key", np.float16), "v": arena.get("out value", np.float16)},
                     arena.violations() + caches.violations(), input_changes=arena.input_changes())
        check_inputs(got, case=case)
        changed = []  # the cache is an input: unchanged
        for side in ("k", "v"):
            now = caches.load_rows(side, blk_off)
            diff = np.argwhere(now != filled[side])
            if diff.size:
                i, h, dd = (int(x) for x in diff[0])
                changed.append(f"{side.upper()} cache: {len(diff)} element(s) of the gathered blocks changed, first "
                               f"{_where(t, int(blk_off[i, h, dd]))}: 0x{int(filled[side][i, h, dd]):04x} before, "
                               f"0x{int(now[i, h, dd]):04x} after")
            k_n, lines = caches.stray(side, words)
            if k_n:
                changed.append(f"{side.upper()} cache: {k_n} word(s) of the zero-filled cache changed; "
                               + "; ".join(lines))
        if changed:
            raise ConformanceFailure("the provider modified an input it may only read", expected="the cache "
                                     "unchanged by a gather", got="; ".join(changed),
                                     clause="spec 7.2 (kvx_abi.h declares the inputs const); R-INPUTS",
                                     case=case, seed=seed)
        _answered(st, got, f"a gather from a {_geom_text(t, g)}", CL_GATHER, case, seed,
                  lambda: _outputs_changed(got, proxy),
                  "status (OK, or a refusal of the large cache)" if big.large else "status (OK: a cache within 2^31 elements)",
                  _kind_features(kvx_provider, mem, kind, big))
        bad = []
        slot_ids = np.array([b * BS + j for b in ids for j in range(BS)], np.int64)
        for side, label in (("k", "gathered keys"), ("v", "gathered values")):
            g_ = got.arrays[side].view(np.uint16).reshape(-1, H, D)
            e_ = exp.arrays[side].view(np.uint16).reshape(-1, H, D)
            rows = np.flatnonzero((g_ != e_).reshape(len(g_), -1).any(axis=1))
            if rows.size:
                bad.append(f"{label}: {rows.size} of {len(g_)} row(s) differ")
            groups: dict[tuple[int, int], list[int]] = {}  # (sequence, logical block or -1: past the length)
            for r in rows.tolist():
                s_, pos = divmod(r, msl)
                groups.setdefault((s_, pos // BS if pos < GATHER_LENS[s_] else -1), []).append(r)
            for (s_, lb), rs in list(groups.items())[:6]:
                r = rs[0]
                pos = r % msl
                h, dd = (int(x) for x in np.argwhere(g_[r] != e_[r])[0])
                if lb >= 0:
                    blk = GATHER_TABLE[s_][lb]
                    slot = blk * BS + pos % BS
                    src = (f"block {blk}; first row {r} from {_where(t, int(_row_offsets(t, g, np.array([slot]))[0, h, dd]))}")
                    hit = np.flatnonzero((filled[side] == g_[r][None]).reshape(len(slot_ids), -1).all(axis=1))
                    held = ("zeros (a part of the cache nothing was written to)" if not g_[r].any() else
                            f"the contents of slot {int(slot_ids[hit[0]])} (block {int(slot_ids[hit[0]]) // BS})"
                            if hit.size else "")
                else:
                    src = f"rows past the sequence's length {GATHER_LENS[s_]} (they keep their initial bytes); first row {r}"
                    held = ""
                bad.append(f"  sequence {s_}, {len(rs)} row(s) of {src}: head {h} dim {dd}: expected "
                           f"0x{int(e_[r, h, dd]):04x}, got 0x{int(g_[r, h, dd]):04x}" + (f"; the row holds {held}" if held else ""))
        if bad:
            raise ConformanceFailure(
                f"a gather from a cache {big.past} answered OK but read the wrong elements",
                expected="bit-exact equality with the reference (kvx_conformance.reference_impl) gathering the same "
                         "blocks, 64-bit offsets",
                got="\n            ".join(bad), clause=CL_GATHER, case=case, seed=seed)
        note_served_call()
    finally:
        caches.close()


# ---------------------------------------------------------------------------- 2 GiB caches (required)

CL_WIDE = "; R-LARGE: a cache of at most 2^31 elements is served at every slot, whatever its bytes"


@conformance("write.wide_cache_high_slots", CL_WRITE + CL_WIDE, REQUIRED, "core", "write")
@pytest.mark.parametrize("slot_dtype", [DType.S64, DType.S32], ids=["s64", "s32"])
@KINDS
def test_write_wide_cache_high_slots(kvx_provider, kvx_call_options, kind, slot_dtype):
    """``large_cache.write_high_slots`` in a cache of rows of 1 head x 64 (2^30 + 2^16 elements, 2 GiB
    per tensor): slot 2^24 sits at byte offset 2^31, so byte offsets taken in int32 and slots carried in
    float32 go wrong here, in a cache no provider may refuse in its core layout (the other layouts are
    their own features)."""
    _write_high_slots(kvx_provider, kvx_call_options(), WIDE, kind, slot_dtype)


@conformance("gather.packed.wide_cache_high_blocks", CL_GATHER + CL_WIDE, REQUIRED, "core", "gather")
@KINDS
def test_gather_wide_cache_high_blocks(kvx_provider, kvx_call_options, kind):
    """``large_cache.gather_high_blocks`` in the same 2 GiB cache: block 2^20 starts at byte offset 2^31."""
    _gather_high_blocks(kvx_provider, kvx_call_options(), WIDE, kind)


# ---------------------------------------------------------------------------- KV_OFFSETS pools

CL_KVO = ("spec 5.1 (KV_OFFSETS: block address = (bit 31 ? pool.secondary : pool.primary) + (index & 0x7fffffff) * "
          "bytes_per_block), 6.7, 6.10, 7 (kvx_gather_kv); kvx-abi-1.1; R-GATHER, R-DATA (pool indices are not "
          "bounded by num_blocks) - 64-bit offsets")
SEC = cb.SECONDARY
#: small blocks, so that few indices reach far: HND [2, 4, KD] of the pool dtype, 128 bytes a block
KBS, KH = 4, 2
#: the pools' dtypes: a provider may take a kernel per element size (bytes for FP8, words for F32), and
#: each one must address the pools in 64 bits
KVO_DTYPES = [DType.F16, DType.F8_E4M3, DType.F32]
BPB = 128


def _kgeom(dtype: DType) -> Geometry:
    """cache.k / cache.v of the KV_OFFSETS gather, head_dim filling a block of BPB bytes: validated, not read
    (pool indices are not bounded by num_blocks)."""
    return Geometry(num_blocks=4, block_size=KBS, num_kv_heads=KH,
                    head_dim=BPB // (KH * KBS * np_dtype(dtype).itemsize))


def _pool_bits(rng: np.random.Generator, dtype: DType, n: int) -> np.ndarray:
    """``n`` random finite nonzero values of ``dtype`` as raw bits (F16: :func:`_f16_bits`; E4M3: normal
    codes, never 0x7F / 0xFF (NaN); F32: normal values)."""
    if dtype == DType.F16:
        return _f16_bits(rng, n)
    if dtype == DType.F8_E4M3:
        return (rng.integers(0, 2, n, dtype=np.uint8) << 7) | rng.integers(0x08, 0x7F, n, dtype=np.uint8)
    sign = rng.integers(0, 2, n, dtype=np.uint32) << 31
    return sign | (rng.integers(1, 255, n, dtype=np.uint32) << 23) | rng.integers(0, 1 << 23, n, dtype=np.uint32)
P24, P25, P26 = 1 << 24, 1 << 25, 1 << 26  # byte offsets 2^31, 2^32, 2^33 (element offsets 2^30, 2^31, 2^32)
#: 2^26 + 64 blocks per pool: 8 GiB + 8 KiB (bytes and elements past 2^32)
POOL_BLOCKS = P26 + 64
POOL_LAST = POOL_BLOCKS - 1
#: pool indices read, by why each one is there (index * 128 is the byte offset)
POOL_INDICES = {
    3: "a low block (contrast)",
    P24 - 1: "the last block below byte offset 2^31",
    P24: "int32 byte offsets overflow",
    P24 + 1: "float32 rounds the index to 2^24",
    P24 + 3: "float32 rounds the index to 2^24 + 4",
    P25 - 1: "the last block below byte offset 2^32",
    P25: "uint32 byte offsets wrap to block 0",
    P25 + 1: "uint32 byte offsets wrap to block 1",
    P25 + 3: "uint32 byte offsets wrap to block 3",
    3 * P24: "index 3 x 2^24, byte offset 3 x 2^31",
    P26 - 1: "the last block below byte offset 2^33 (F16 element offset 2^32)",
    P26: "byte offset 2^33 (F16 element offset 2^32: uint32 F16 element offsets wrap to 0)",
    P26 + 1: "float32 rounds the index to 2^26",
    P26 + 3: "float32 rounds the index to 2^26 + 4",
    POOL_LAST - 1: "the last block but one",
    POOL_LAST: "the last block of the pool",
}
#: V entries in the primary pool (blocks no K entry reads)
V_PRIMARY = {P24 + 2: "a V entry in the primary pool, past byte offset 2^31",
             P25 + 2: "a V entry in the primary pool, uint32 byte offsets wrap to block 2",
             P26 + 2: "a V entry in the primary pool, past byte offset 2^33",
             POOL_LAST - 2: "a V entry in the primary pool, the last block but two"}
#: secondary pool blocks the V entries read
V_SECONDARY = [i for i in POOL_INDICES if i not in (P24 + 3, 3 * P24, P26 + 3, POOL_LAST - 1)]
KVO_SEQS, KVO_BEAMS, KVO_MB = 2, 2, 4
KVO_LENS = [16, 14]  # sequence 1 uses 2 tokens of its last block
SEED_KVO = 4_2047


def _kvo_offsets(rng: np.random.Generator) -> np.ndarray:
    """``[seq, beam, K|V, block]`` KVCacheIndex values: every K entry a primary block of
    POOL_INDICES, V entries the secondary blocks of V_SECONDARY and four primary blocks of
    V_PRIMARY, each in scrambled order (V is not K + 1)."""
    n = KVO_SEQS * KVO_BEAMS * KVO_MB
    k = np.array(list(POOL_INDICES), np.int64)[rng.permutation(n)]
    v = np.array([SEC | i for i in V_SECONDARY] + list(V_PRIMARY), np.int64)[rng.permutation(n)]
    off = np.empty((KVO_SEQS, KVO_BEAMS, 2, KVO_MB), np.int64)
    off[:, :, 0, :] = k.reshape(KVO_SEQS, KVO_BEAMS, KVO_MB)
    off[:, :, 1, :] = v.reshape(KVO_SEQS, KVO_BEAMS, KVO_MB)
    return off


def _kvo_entry_text(e: int) -> str:
    """A KVCacheIndex value by name: pool, index, byte offset, why it is there."""
    i = int(e) & 0x7FFFFFFF
    pool = "secondary" if int(e) & SEC else "primary"
    why = V_PRIMARY.get(i) if pool == "primary" and i in V_PRIMARY else POOL_INDICES.get(i, "")
    return (f"0x{int(e):08x}: {pool} pool block {_pow2(i)}, byte offset {_pow2(i * BPB)}"
            + (f" - {why}" if why else ""))


@conformance("large_cache.kv_offsets_high_indices", CL_KVO, REQUIRED, "robustness", "gather", feature=FEATURE)
@pytest.mark.parametrize("dtype", KVO_DTYPES, ids=["f16", "e4m3", "f32"])
def test_kv_offsets_high_indices(kvx_provider, kvx_call_options, dtype):
    """Pools of F16, E4M3 (raw bytes gathered) and F32 blocks of 128 bytes (a refusal of E4M3 is
    excused by ``fp8`` as well): a kernel per element size may compute the byte offset in 32 bits in
    one of them only."""
    opts = kvx_call_options()
    mem = opts.memory
    kind = cb.core_layout(kvx_provider, mem)
    kgeom = _kgeom(dtype)
    KD, bits_t = kgeom.head_dim, BITS_DTYPE[np_dtype(dtype).itemsize]
    t = cb.layout(kgeom, kind, dtype)
    seed = SEED_KVO + KVO_DTYPES.index(dtype)
    rng = cb.rng_for(seed)
    offsets = _kvo_offsets(rng)
    used = {"primary": sorted(int(e) for e in offsets.reshape(-1) if not int(e) & SEC),
            "secondary": sorted(int(e) & 0x7FFFFFFF for e in offsets.reshape(-1) if int(e) & SEC)}
    # per used block: its HND [H, block_size, D] bits, distinct random values
    contents = {pool: {i: _pool_bits(rng, dtype, KH * KBS * KD).reshape(KH, KBS, KD) for i in ids}
                for pool, ids in used.items()}
    # the oracle's gather of the same blocks in compact pools (renumbered)
    compact = np.array([(SEC | used["secondary"].index(int(e) & 0x7FFFFFFF)) if int(e) & SEC
                        else used["primary"].index(int(e)) for e in offsets.reshape(-1)],
                       np.int64).reshape(offsets.shape)
    pools = PoolCase(bytes_per_block=BPB,
                     primary=np.concatenate([contents["primary"][i].reshape(-1) for i in used["primary"]]).view(
                         np_dtype(dtype)),
                     secondary=np.concatenate([contents["secondary"][i].reshape(-1) for i in used["secondary"]]
                                              ).view(np_dtype(dtype)))
    cache = cb.make_cache(kgeom, t, t, seed=seed, pool=pools)
    msl = KVO_MB * KBS
    proxy = cb.kv_offsets_gather(cache, compact, KVO_LENS, msl, seed=seed, label="large pools (compact proxy)")
    exp = _expected_gather(proxy, mem)
    features = refusable_features(proxy, FEATURE, kind)  # large_cache, kv_offsets, secondary_pool
    table = BlockTable.kv_offsets(offsets)
    lens = SeqLens(np.array(KVO_LENS, np.int64))
    pool_bytes = POOL_BLOCKS * BPB
    k_text = [_pow2(int(e)) for e in offsets[:, :, 0].reshape(-1)]
    v_text = [f"S|{_pow2(int(e) & 0x7FFFFFFF)}" if int(e) & SEC else _pow2(int(e))
              for e in offsets[:, :, 1].reshape(-1)]
    case = (f"KV_OFFSETS gather (S32 KVCacheIndex, {KVO_SEQS} sequences x {KVO_BEAMS} beams x K|V x {KVO_MB} "
            f"blocks, lengths {KVO_LENS}, max_seq_len {msl}) from a primary and a secondary pool of {POOL_BLOCKS} "
            f"({_pow2(POOL_BLOCKS)}) blocks of {BPB} bytes (HND [{KH}, {KBS}, {KD}] {dtype.name}; {pool_bytes / 2**30:.2f} "
            f"GiB each; cache.k / cache.v {kind.upper()} of {kgeom.num_blocks} blocks); K entries (primary) "
            f"{k_text}, V entries (S|: secondary) {v_text}; the read blocks are filled, the rest of the pools is zero")
    health.set_case(case)
    _check_memory_available(mem, 2 * pool_bytes, "the large pools")
    dev = opts.device if mem == Memory.DEVICE else None
    bufs: dict[str, buffers.SparseBuffer] = {}
    try:
        for j, pool in enumerate(("primary", "secondary")):
            bufs[pool] = buffers.SparseBuffer(pool_bytes, mem, f"{pool} pool", salt=50 + j, device=dev)
            for i, bits in contents[pool].items():
                bufs[pool].write(i * BPB, bits)
        words = {pool: {w for i in ids for w in range(i * BPB // 8, (i + 1) * BPB // 8)} for pool, ids in used.items()}
        arena = execute._Arena(mem, 0, opts.device, opts.seal_inputs)
        kc = arena.put("k cache", cache.k_init, data=True, readonly=True)
        vc = arena.put("v cache", cache.v_init, data=True, readonly=True)
        c_cache = d.to_c_cache(kgeom, t, kc, t, vc, mem, pool_bytes_per_block=BPB,
                               pool_primary=bufs["primary"].ptr, pool_secondary=bufs["secondary"].ptr)
        desc = _gather_desc(arena, proxy, table, lens, mem)
        if opts.seal_inputs:
            for b in bufs.values():
                b.seal(True)  # the pools are inputs of a gather: a store into them faults
        try:
            with arena.sealed({"cache": c_cache, "desc": desc}) as args:
                st = kvx_provider.gather_kv(args["cache"], args["desc"], opts.stream)
        finally:
            for b in bufs.values():
                b.seal(False)
        buffers.synchronize(mem, opts.device)
        got = Result(int(st), {"k": arena.get("out key", bits_t), "v": arena.get("out value", bits_t)},
                     arena.violations() + [v for b in bufs.values() for v in b.violations()],
                     input_changes=arena.input_changes())
        check_inputs(got, case=case)
        changed = []  # the pools are inputs: unchanged
        for pool, buf in bufs.items():
            for i in used[pool]:
                now = np.frombuffer(buf.read(i * BPB, BPB).tobytes(), bits_t).reshape(KH, KBS, KD)
                diff = np.argwhere(now != contents[pool][i])
                if diff.size:
                    h, tok, dd = (int(x) for x in diff[0])
                    changed.append(f"{pool} pool block {_pow2(i)}: {len(diff)} element(s) changed, first head {h} "
                                   f"token {tok} dim {dd}: 0x{int(contents[pool][i][h, tok, dd]):04x} before, "
                                   f"0x{int(now[h, tok, dd]):04x} after")
            total, nz = buf.nonzero_words(limit=len(words[pool]) + 64)
            extra = [int(w) for w in nz if int(w) not in words[pool]]
            n_extra = total - sum(1 for w in nz if int(w) in words[pool])
            if n_extra:
                first = (f", first at byte offset {_pow2(extra[0] * 8)} (block {_pow2(extra[0] * 8 // BPB)})"
                         if extra else "")
                changed.append(f"{pool} pool: {n_extra} word(s) of the zero-filled pool changed{first}")
        if changed:
            raise ConformanceFailure("the provider modified an input it may only read", expected="the pools "
                                     "unchanged by a gather", got="; ".join(changed),
                                     clause="spec 7.2 (kvx_abi.h declares the inputs const); R-INPUTS",
                                     case=case, seed=seed)
        _answered(st, got, f"a KV_OFFSETS gather from pools of {pool_bytes / 2**30:.2f} GiB", CL_KVO, case, seed,
                  lambda: _outputs_changed(got, proxy),
                  "status (OK, or a refusal of the large pools; pool indices are not bounded by num_blocks)", features)
        # where a wrong row came from: (pool, block, token) of every filled row
        origin = {}
        for pool in ("primary", "secondary"):
            for i, blk in contents[pool].items():
                for tok in range(KBS):
                    origin.setdefault(blk[:, tok, :].tobytes(), f"token {tok} of {pool} pool block {_pow2(i)}")
        bad = []
        for kv, side, label in ((0, "k", "gathered keys"), (1, "v", "gathered values")):
            g_ = got.arrays[side].view(bits_t).reshape(-1, KH, KD)
            e_ = exp.arrays[side].view(bits_t).reshape(-1, KH, KD)
            rows = np.flatnonzero((g_ != e_).reshape(len(g_), -1).any(axis=1))
            if rows.size:
                bad.append(f"{label}: {rows.size} of {len(g_)} row(s) differ")
            groups: dict[tuple[int, int, int], list[int]] = {}  # (sequence, beam, logical block or -1)
            for r in rows.tolist():
                sb, tok = divmod(r, msl)
                s_, beam = divmod(sb, KVO_BEAMS)
                groups.setdefault((s_, beam, tok // KBS if tok < KVO_LENS[s_] else -1), []).append(r)
            for (s_, beam, j), rs in list(groups.items())[:8]:
                r = rs[0]
                tok = r % msl
                h, dd = (int(x) for x in np.argwhere(g_[r] != e_[r])[0])
                if j >= 0:
                    e = int(offsets[s_, beam, kv, j])
                    pos = ((s_ * KVO_BEAMS + beam) * 2 + kv) * KVO_MB + j
                    src = (f"{side.upper()} entry [sequence {s_}, beam {beam}, block {j}] (indices[{pos}] = "
                           f"{_kvo_entry_text(e)}), first row {r} (token {tok})")
                    held = ("zeros (pool memory nothing was written to)" if not g_[r].any()
                            else origin.get(g_[r].tobytes(), ""))
                else:
                    src = (f"sequence {s_} beam {beam}: rows past the sequence's length {KVO_LENS[s_]} (they keep "
                           f"their initial bytes), first row {r}")
                    held = ""
                bad.append(f"  {len(rs)} row(s) of {src}: head {h} dim {dd}: expected 0x{int(e_[r, h, dd]):04x}, "
                           f"got 0x{int(g_[r, h, dd]):04x}" + (f"; the row holds {held}" if held else ""))
        if bad:
            raise ConformanceFailure(
                "a KV_OFFSETS gather from pools beyond 2^32 bytes answered OK but read the wrong blocks",
                expected="bit-exact equality with the reference (kvx_conformance.reference_impl) gathering the same "
                         "blocks from compact pools: block address = pool base + (index & 0x7fffffff) * "
                         "bytes_per_block in 64 bits",
                got="\n            ".join(bad), clause=CL_KVO, case=case, seed=seed)
        note_served_call()
    finally:
        for b in bufs.values():
            b.close()


# ---------------------------------------------------------------------------- slot indices past 2^31

CL_SLOT_INDICES = ("spec 4.1 (block_idx = slot_idx / block_size on num_blocks * block_size slots), 5.2 (S64 "
                   "slots), 7 (kvx_write_kv writes every token) - slot indices past 2^31 and 2^32; R-CACHE, R-WRITE")
#: 2^28 + 64 blocks of 16 slots x 1 head x 1 dim: 2^32 + 1024 slots (and elements, 8 GiB of F16) per tensor
SGEOM = Geometry(num_blocks=(1 << 28) + 64, block_size=16, num_kv_heads=1, head_dim=1)
S31, S32_, SLAST = 1 << 31, 1 << 32, SGEOM.num_slots - 1
#: written slots (S64): why each one is there
SLOT_INDICES = {
    5: "a low slot (contrast)",
    S31 - 1: "the last slot an int32 holds",
    S31: "slot 2^31: negative as an int32 (a no-op to a kernel that skips negative slots)",
    S31 + 1: "past 2^31",
    S31 + 37: "an odd slot past 2^31",
    S32_ - 1: "slot 2^32 - 1: -1 as an int32 (vLLM's padding value)",
    S32_: "slot 2^32: 0 as a uint32 (capacity or slot in 32 bits wraps)",
    S32_ + 1: "slot 2^32 + 1: 1 as a uint32",
    SLAST - 1: "the last slot but one",
    SLAST: "the last slot",
}
SEED_SLOTS = 4_2053


def _sgeom_text(t: TensorLayout) -> str:
    n = t.span_elements()
    return (f"cache of {SGEOM.num_blocks} ({_pow2(SGEOM.num_blocks)}) blocks x {SGEOM.block_size} slots x 1 head x "
            f"1 dim ({t.layout.name} F16, strides {t.stride}): {SGEOM.num_slots} ({_pow2(SGEOM.num_slots)}) slots, "
            f"{n * ITEM / 2**30:.2f} GiB per tensor")


@conformance("large_cache.write_slots_past_2_31", CL_SLOT_INDICES, REQUIRED, "robustness", "write", feature=FEATURE)
def test_write_slots_past_2_31(kvx_provider, kvx_call_options):
    """A write of S64 slots past 2^31 and 2^32 into a cache of 2^32 + 1024 slots (one F16 element each,
    never materialized). ``large_cache.write_high_slots`` reaches element offsets past 2^32 with slots
    below 2^25; here the slot indices themselves need more than 31 and 32 bits: a provider that checks
    the range in 64 bits and hands its kernel int32 slots drops slot 2^31 as a negative (no-op) slot
    and writes slot 2^32 + 1 at slot 1; one that computes ``num_blocks * block_size`` in uint32 refuses
    valid slots as OUT_OF_RANGE. Every slot must hold its token's K and V, nothing else may change."""
    opts = kvx_call_options()
    mem = opts.memory
    t = cb.layout(SGEOM, cb.core_layout(kvx_provider, mem), DType.F16)
    seed = SEED_SLOTS
    rng = cb.rng_for(seed)
    slots = np.array(list(SLOT_INDICES), np.int64)[rng.permutation(len(SLOT_INDICES))]
    n = len(slots)
    bits = {"k": _f16_bits(rng, n), "v": _f16_bits(rng, n)}
    io = IOLayout.dense(DType.F16, n, 1, 1)
    sm = SlotMapping(slots, dtype=DType.S64)
    case = f"write of {n} F16 tokens (IO dense [{n}, 1, 1], slots S64) into a {_sgeom_text(t)}; slots {slots.tolist()}"
    health.set_case(case)
    nbytes = t.span_elements() * ITEM
    _check_memory_available(mem, 2 * nbytes, "the large cache")
    dev = opts.device if mem == Memory.DEVICE else None
    bufs = {side: buffers.SparseBuffer(nbytes, mem, f"{side} cache", salt=60 + i, device=dev)
            for i, side in enumerate(("k", "v"))}
    try:
        arena = execute._Arena(mem, 0, opts.device, opts.seal_inputs)
        kp = arena.put("key", bits["k"].view(np.float16), data=True, readonly=True)
        vp = arena.put("value", bits["v"].view(np.float16), data=True, readonly=True)
        sp = arena.put("slots", sm.encoded(), readonly=True)
        desc = abi.kvx_write_desc_t.new()
        desc.io = d.to_c_io(io, kp, io, vp, mem, n, 1, 1)
        desc.slots = d.to_c_slots(sm, sp)
        desc.k_scale_desc, desc.v_scale_desc = d.to_c_scale(None, 0), d.to_c_scale(None, 0)
        c_cache = d.to_c_cache(SGEOM, t, bufs["k"].ptr, t, bufs["v"].ptr, mem)
        with arena.sealed({"cache": c_cache, "desc": desc}) as args:
            st = kvx_provider.write_kv(args["cache"], args["desc"], opts.stream)
        buffers.synchronize(mem, opts.device)
        got = Result(int(st), {}, arena.violations() + [v for b in bufs.values() for v in b.violations()],
                     input_changes=arena.input_changes())
        check_inputs(got, case=case)
        zz = np.zeros(n, np.int64)
        offsets = cache_offsets(t.layout, tuple(t.stride), 1, slots // SGEOM.block_size, slots % SGEOM.block_size,
                                zz, zz)
        words = sorted({int(o) * ITEM // 8 for o in offsets})
        bad: list[str] = []
        stray: list[str] = []
        for side in ("k", "v"):
            lanes = {w: np.zeros(4, np.uint16) for w in words}
            for i, off in enumerate(offsets):
                lanes[int(off) * ITEM // 8][int(off) % 4] = bits[side][i]
            total, nz = bufs[side].nonzero_words(limit=len(words) + 64)
            extra = [int(w) for w in nz if int(w) not in lanes]
            n_extra = total - sum(1 for w in nz if int(w) in lanes)
            if n_extra:
                first = ""
                if extra:
                    lane = np.frombuffer(bufs[side].read(extra[0] * 8, 8).tobytes(), np.uint16)
                    at = extra[0] * 4 + int(np.flatnonzero(lane)[0])
                    hit = np.flatnonzero(bits[side] == lane[at % 4])
                    first = f", first at slot {at}" + (f" (token {int(hit[0])}'s row)" if hit.size else "")
                stray.append(f"{side.upper()} cache: {n_extra} word(s) of the zero-filled cache outside every "
                              f"written slot changed{first}")
            for i, off in enumerate(offsets):
                w = int(off) * ITEM // 8
                have = np.frombuffer(bufs[side].read(w * 8, 8).tobytes(), np.uint16)
                if not np.array_equal(have, lanes[w]):
                    lane = int(off) % 4
                    what = ("never written" if have[lane] == 0 else
                            f"holds token {int(np.flatnonzero(bits[side] == have[lane])[0])}'s row"
                            if (bits[side] == have[lane]).any() else "holds another value")
                    bad.append(f"{side.upper()} cache, token {i} -> slot {int(slots[i])} ({_pow2(int(slots[i]))}; "
                               f"{SLOT_INDICES[int(slots[i])]}): expected 0x{int(bits[side][i]):04x}, got "
                               f"0x{int(have[lane]):04x} ({what})")
        _answered(st, got, f"a write into a {_sgeom_text(t)}", CL_SLOT_INDICES, case, seed,
                  lambda: stray + [b for b in bad if "never written" not in b],
                  "status (OK, or a refusal of the large cache; every slot is valid)")
        if bad or stray:
            raise ConformanceFailure(
                "a write of slots past 2^31 and 2^32 answered OK but dropped or misplaced tokens",
                expected="every token's K and V at slot_idx / block_size, slot_idx % block_size (64-bit slot "
                         "indices), no other element changed",
                got="\n            ".join(bad[:8] + stray), clause=CL_SLOT_INDICES, case=case, seed=seed)
        note_served_call()
    finally:
        for b in bufs.values():
            b.close()


# ---------------------------------------------------------------------------- IO rows past 2^31 elements

CL_IO_ROWS = ("spec 6.8 (IO tensors [num_tokens, num_kv_heads, head_dim], dense row-major MUST be accepted), 4.2, "
              "6.2 (strides in elements, int64), 7 - IO element offsets past 2^31 and 2^32; R-IO, R-WRITE, R-GATHER")
#: 8 heads x 128: rows of 1024 elements, so row 2^21 is element offset 2^31 and row 2^22 is 2^32
IOGEOM = Geometry(num_blocks=8, block_size=16, num_kv_heads=8, head_dim=128)
IO_ROW = IOGEOM.num_kv_heads * IOGEOM.head_dim
#: gather: rows per sequence, so that sequence s starts at element offset s * (2^31 + 2^20): sequence 1
#: past 2^31 (int32 offsets negative), sequence 2 past 2^32 (uint32 offsets wrap into sequence 0's rows)
IO_MSL = (1 << 21) + (1 << 10)
IO_LENS = [40, 33, 24]
#: write: a batch of 2^22 + 2^10 tokens (input rows past element offset 2^32), S32 slot -1 but for these rows
IO_TOKENS = (1 << 22) + (1 << 10)
IO_WRITE_ROWS = {3: "a low row (contrast)", (1 << 21) - 1: "the last row below element offset 2^31",
                 1 << 21: "element offset 2^31 (int32 offsets overflow)", (1 << 21) + 1: "past 2^31",
                 (1 << 22) - 1: "the last row below element offset 2^32",
                 1 << 22: "element offset 2^32 (uint32 offsets wrap to row 0)", (1 << 22) + 5: "past 2^32",
                 IO_TOKENS - 1: "the last row of the batch"}
SEED_IO = 4_2061


@conformance("large_cache.gather_output_rows_past_2_31", CL_IO_ROWS, REQUIRED, "robustness", "gather",
             feature=FEATURE)
def test_gather_output_rows_past_2_31(kvx_provider, kvx_call_options):
    """A PACKED gather of 3 sequences from a small cache into a dense output of 3 x (2^21 + 2^10) rows of
    1024 elements (12 GiB per output, never materialized): sequence s's rows start at element offset
    s * (2^31 + 2^20). Output offsets computed in int32 (row * stride) land gigabytes before the
    buffer, in uint32 in sequence 0's rows. Every gathered row must equal the oracle's, the rest of
    the outputs stay untouched (zero)."""
    opts = kvx_call_options()
    mem = opts.memory
    kind = cb.core_layout(kvx_provider, mem)
    seed = SEED_IO
    cache = cb.simple_cache(IOGEOM, kind, DType.F16, seed=seed)
    mb = -(-max(IO_LENS) // IOGEOM.block_size)
    table = cb.distinct_table(IOGEOM, len(IO_LENS), mb, seed)
    proxy = cb.packed_gather(cache, table, IO_LENS, mb * IOGEOM.block_size, seed=seed,
                             label="the same gather with max_seq_len 48 (compact proxy)")
    exp = _expected_gather(proxy, mem)
    rows = len(IO_LENS) * IO_MSL
    nbytes = rows * IO_ROW * ITEM
    case = (f"PACKED gather of {len(IO_LENS)} sequences (table {table.tolist()}, lengths {IO_LENS}, max_seq_len "
            f"{IO_MSL} = {_pow2(IO_MSL)}) from a {kind.upper()} F16 cache of {IOGEOM.num_blocks} blocks x "
            f"{IOGEOM.block_size} x {IOGEOM.num_kv_heads} x {IOGEOM.head_dim} into dense outputs [{rows}, "
            f"{IOGEOM.num_kv_heads}, {IOGEOM.head_dim}] ({nbytes / 2**30:.2f} GiB each, zero-filled): sequence s "
            f"starts at element offset s x {_pow2(IO_MSL * IO_ROW)}")
    health.set_case(case)
    _check_memory_available(mem, 2 * nbytes, "the large outputs")
    dev = opts.device if mem == Memory.DEVICE else None
    outs = {side: buffers.SparseBuffer(nbytes, mem, f"out {name}", salt=70 + i, device=dev)
            for i, (side, name) in enumerate((("k", "key"), ("v", "value")))}
    try:
        arena = execute._Arena(mem, 0, opts.device, opts.seal_inputs)
        kc = arena.put("k cache", cache.k_init, data=True, readonly=True)
        vc = arena.put("v cache", cache.v_init, data=True, readonly=True)
        ip = arena.put("indices", proxy.table.encoded_indices(), readonly=True)
        lp = arena.put("seq_lens", proxy.seq_lens.encoded(), readonly=True)
        out = IOLayout.dense(DType.F16, rows, IOGEOM.num_kv_heads, IOGEOM.head_dim)
        desc = abi.kvx_gather_desc_t.new(max_seq_len=IO_MSL)
        desc.io = d.to_c_io(out, outs["k"].ptr, out, outs["v"].ptr, mem, rows, IOGEOM.num_kv_heads, IOGEOM.head_dim)
        desc.block_table = d.to_c_table(proxy.table, ip, 0)
        desc.seq_lens = d.to_c_seq_lens(proxy.seq_lens, lp)
        c_cache = d.to_c_cache(IOGEOM, cache.k, kc, cache.v, vc, mem)
        with arena.sealed({"cache": c_cache, "desc": desc}) as args:
            st = kvx_provider.gather_kv(args["cache"], args["desc"], opts.stream)
        buffers.synchronize(mem, opts.device)
        got = Result(int(st), {}, arena.violations() + [v for b in outs.values() for v in b.violations()],
                     input_changes=arena.input_changes())
        check_inputs(got, case=case)
        spans = [(s * IO_MSL * IO_ROW * ITEM // 8, (s * IO_MSL + n) * IO_ROW * ITEM // 8) for s, n in enumerate(IO_LENS)]
        bad: list[str] = []
        stray: list[str] = []
        for side, label in (("k", "gathered keys"), ("v", "gathered values")):
            e_ = exp.arrays[side].view(np.uint16).reshape(-1, IOGEOM.num_kv_heads, IOGEOM.head_dim)
            for s, n in enumerate(IO_LENS):
                g_ = np.frombuffer(outs[side].read(s * IO_MSL * IO_ROW * ITEM, n * IO_ROW * ITEM).tobytes(),
                                   np.uint16).reshape(n, IOGEOM.num_kv_heads, IOGEOM.head_dim)
                want = e_[s * proxy.max_seq_len: s * proxy.max_seq_len + n]
                wrong = np.flatnonzero((g_ != want).reshape(n, -1).any(axis=1))
                if wrong.size:
                    t = int(wrong[0])
                    r = s * IO_MSL + t
                    bad.append(f"{label}, sequence {s}: {wrong.size} of {n} row(s) differ, first token {t} (row {r}, "
                               f"element offset {_pow2(r * IO_ROW)})" + (": never written" if not g_[t].any() else ""))
            total, nz = outs[side].nonzero_words(limit=64)
            inside = sum(int(np.count_nonzero(np.frombuffer(outs[side].read(a * 8, (b - a) * 8).tobytes(), np.uint64)))
                         for a, b in spans)
            if total - inside:
                extra = [int(w) for w in nz if not any(a <= int(w) < b for a, b in spans)]
                first = (f", first at element offset {_pow2(extra[0] * 4)} (row {extra[0] * 4 // IO_ROW})"
                         if extra else "")
                stray.append(f"{label}: {total - inside} word(s) of the zero-filled output outside every gathered "
                             f"row changed{first}")
        _answered(st, got, f"a gather into outputs of {nbytes / 2**30:.2f} GiB", CL_IO_ROWS, case, seed,
                  lambda: stray + [b for b in bad if "never written" not in b],
                  "status (OK, or a refusal of the large outputs)")
        if bad or stray:
            raise ConformanceFailure(
                "a gather into outputs past 2^31 elements answered OK but misplaced or dropped rows",
                expected="each sequence's rows at row s * max_seq_len + t (64-bit element offsets), bit-exact with "
                         "the reference (kvx_conformance.reference_impl), every other output element untouched",
                got="\n            ".join(bad + stray), clause=CL_IO_ROWS, case=case, seed=seed)
        note_served_call()
    finally:
        for b in outs.values():
            b.close()


@conformance("large_cache.write_input_rows_past_2_31", CL_IO_ROWS, REQUIRED, "robustness", "write", feature=FEATURE)
def test_write_input_rows_past_2_31(kvx_provider, kvx_call_options):
    """A write of 2^22 + 2^10 tokens of 1024 elements (dense inputs of 8 GiB each, never
    materialized) into a small cache: every token's S32 slot is -1 but those of 8 rows on each side
    of element offsets 2^31 and 2^32. Input offsets computed in int32 read gigabytes before the
    buffer, in uint32 from row 0's neighbourhood. The cache must equal the oracle's write of those
    8 rows."""
    opts = kvx_call_options()
    mem = opts.memory
    kind = cb.core_layout(kvx_provider, mem)
    seed = SEED_IO + 1
    rng = cb.rng_for(seed)
    cache = cb.simple_cache(IOGEOM, kind, DType.F16, seed=seed)
    rows = np.array(sorted(IO_WRITE_ROWS), np.int64)
    k = len(rows)
    slots_of_rows = rng.permutation(IOGEOM.num_slots)[:k].astype(np.int64)
    bits = {"k": _f16_bits(rng, k * IO_ROW), "v": _f16_bits(rng, k * IO_ROW)}
    proxy = cb.write_case(cache, slots_of_rows, seed=seed, slot_dtype=DType.S32,
                          label=f"the same write of its {k} valid tokens only (compact proxy: input rows "
                                f"{rows.tolist()} of {IO_TOKENS} -> slots {slots_of_rows.tolist()})")
    proxy = cb.replace(proxy, key=bits["k"].view(np.float16), value=bits["v"].view(np.float16))
    from kvx_conformance import reference_impl

    exp = reference_impl.expected_write(proxy, mem)
    slots = np.full(IO_TOKENS, -1, np.int64)
    slots[rows] = slots_of_rows
    sm = SlotMapping(slots, dtype=DType.S32)
    nbytes = IO_TOKENS * IO_ROW * ITEM
    case = (f"write of {IO_TOKENS} F16 tokens (dense inputs [{IO_TOKENS}, {IOGEOM.num_kv_heads}, "
            f"{IOGEOM.head_dim}], {nbytes / 2**30:.2f} GiB each) into a {kind.upper()} F16 cache of "
            f"{IOGEOM.num_blocks} blocks x {IOGEOM.block_size}; S32 slots -1 but rows " +
            ", ".join(f"{int(r)} ({_pow2(int(r) * IO_ROW)}) -> slot {int(s)}" for r, s in zip(rows, slots_of_rows)))
    health.set_case(case)
    _check_memory_available(mem, 2 * nbytes, "the large inputs")
    dev = opts.device if mem == Memory.DEVICE else None
    ins = {side: buffers.SparseBuffer(nbytes, mem, name, salt=80 + i, device=dev)
           for i, (side, name) in enumerate((("k", "key"), ("v", "value")))}
    try:
        for side in ("k", "v"):
            for i, r in enumerate(rows):
                ins[side].write(int(r) * IO_ROW * ITEM, bits[side][i * IO_ROW:(i + 1) * IO_ROW])
        arena = execute._Arena(mem, 0, opts.device, opts.seal_inputs)
        kc = arena.put("k cache", cache.k_init, data=True)
        vc = arena.put("v cache", cache.v_init, data=True)
        sp = arena.put("slots", sm.encoded(), readonly=True)
        io = IOLayout.dense(DType.F16, IO_TOKENS, IOGEOM.num_kv_heads, IOGEOM.head_dim)
        desc = abi.kvx_write_desc_t.new()
        desc.io = d.to_c_io(io, ins["k"].ptr, io, ins["v"].ptr, mem, IO_TOKENS, IOGEOM.num_kv_heads,
                            IOGEOM.head_dim)
        desc.slots = d.to_c_slots(sm, sp)
        desc.k_scale_desc, desc.v_scale_desc = d.to_c_scale(None, 0), d.to_c_scale(None, 0)
        c_cache = d.to_c_cache(IOGEOM, cache.k, kc, cache.v, vc, mem)
        if opts.seal_inputs:
            for b in ins.values():
                b.seal(True)  # the inputs of a write: a store into them faults
        try:
            with arena.sealed({"cache": c_cache, "desc": desc}) as args:
                st = kvx_provider.write_kv(args["cache"], args["desc"], opts.stream)
        finally:
            for b in ins.values():
                b.seal(False)
        buffers.synchronize(mem, opts.device)
        got = Result(int(st), {"k": arena.get("k cache", np.float16), "v": arena.get("v cache", np.float16)},
                     arena.violations() + [v for b in ins.values() for v in b.violations()],
                     input_changes=arena.input_changes())
        check_inputs(got, case=case)
        changed = []  # the inputs: unchanged
        for side, name in (("k", "key"), ("v", "value")):
            now = np.concatenate([np.frombuffer(ins[side].read(int(r) * IO_ROW * ITEM, IO_ROW * ITEM).tobytes(),
                                                np.uint16) for r in rows])
            total, _ = ins[side].nonzero_words(limit=1)
            if not np.array_equal(now, bits[side]) or total > int(np.count_nonzero(now.view(np.uint64))):
                changed.append(f"{name}: the input changed")
        if changed:
            raise ConformanceFailure("the provider modified an input it may only read", expected="the inputs "
                                     "unchanged by a write", got="; ".join(changed),
                                     clause="spec 7.2 (kvx_abi.h declares the inputs const); R-INPUTS",
                                     case=case, seed=seed)
        def wrote() -> list[str]:
            return [f"{side.upper()} cache changed" for side, init in (("k", cache.k_init), ("v", cache.v_init))
                    if not np.array_equal(got.arrays[side].view(np.uint16), init.view(np.uint16))]

        _answered(st, got, f"a write from inputs of {nbytes / 2**30:.2f} GiB", CL_IO_ROWS, case, seed, wrote,
                  "status (OK, or a refusal of the large inputs)")
        check_arrays(got, exp, proxy, clause=CL_IO_ROWS,
                     what=f"a write whose valid tokens sit at input rows past element offsets 2^31 and 2^32 "
                          f"({case}) differs from the reference's write of those tokens")
        note_served_call()
    finally:
        for b in ins.values():
            b.close()
