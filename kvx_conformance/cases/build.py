"""Explicit, deterministic scenario builders for the conformance suites.

Where ``kvx_conformance.cases.generators`` draws random valid cases, these builders make the
exact scenario a test names: this geometry, these layouts, these slots, this table.
Every builder takes a ``seed`` and draws the tensor contents from
``numpy.random.default_rng(seed)``, so a case is fully reproducible from its
arguments; the seed is recorded in the case and printed on failure.

Contents:

- cache tensors hold finite random values of their dtype everywhere, padding
  included, so a stray write anywhere in the buffer changes a value;
- IO inputs hold finite random values (optionally with special values);
- gather outputs start as random bytes ("poison") that a correct gather overwrites
  only where rows are gathered.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..abi import header as abi
from ..abi.descriptors import (
    BlockTable,
    Geometry,
    IOLayout,
    ScaleSpec,
    SeqLens,
    SlotMapping,
    TensorLayout,
    cache_layout,
    canonical_shape,
    contiguous_strides,
)
from ..abi.dtypes import np_dtype
from ..abi.header import DType, Layout, ScaleGranularity
from .case import CacheCase, GatherCase, PoolCase, ValidateCase, WriteCase

#: Small geometry every scenario starts from (cases stay tiny: the suites must run fast).
GEOM = Geometry(num_blocks=6, block_size=4, num_kv_heads=2, head_dim=8)

LAYOUT_NAMES = {
    "nhd": Layout.BLOCK_NHD,
    "hnd": Layout.BLOCK_HND,
    "hnd_packed": Layout.BLOCK_HND_PACKED,
    "custom": Layout.BLOCK_CUSTOM,
}

_FINITE_MAX = {DType.F16: 60000.0, DType.BF16: 1e30, DType.F32: 1e30, DType.F8_E4M3: 448.0, DType.F8_E5M2: 57344.0}


def rng_for(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------- values


def finite_values(rng: np.random.Generator, dtype: DType, n: int, scale: float = 4.0) -> np.ndarray:
    """``n`` finite values of ``dtype`` (normal-ish, some large, some tiny, signed zeros)."""
    x = rng.standard_normal(n).astype(np.float32) * np.float32(scale)
    if n >= 8:
        pick = rng.choice(n, size=max(1, n // 16), replace=False)
        x[pick] *= np.float32(min(_FINITE_MAX[dtype] / 8.0, 1000.0))
        tiny = rng.choice(n, size=max(1, n // 16), replace=False)
        x[tiny] *= np.float32(1e-6)
    out = np.clip(x, -_FINITE_MAX[dtype], _FINITE_MAX[dtype]).astype(np_dtype(dtype))
    return out


def poison(rng: np.random.Generator, dtype: DType, n: int) -> np.ndarray:
    """``n`` elements of random bits (NaNs included): contents no correct call produces by chance."""
    nbytes = n * abi.DTYPE_SIZE[dtype]
    return rng.integers(0, 256, size=nbytes, dtype=np.uint8).view(np_dtype(dtype))


def with_specials(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Put infinities, quiet NaN, signed zeros and subnormals at the start of ``values`` (F16/BF16/F32)."""
    v = values.copy()
    f = np.float32
    tiny = {DType.F16: 2.0 ** -20, DType.BF16: 2.0 ** -130, DType.F32: 2.0 ** -140}[dtype]
    specials = [np.inf, -np.inf, np.nan, 0.0, -0.0, tiny, -tiny, 65504.0 if dtype == DType.F16 else 3e38]
    arr = np.array(specials, dtype=f).astype(np_dtype(dtype))
    k = min(len(arr), len(v))
    v[:k] = arr[:k]
    return v


#: NaNs with payloads and both signs, as storage bits (quiet and signalling patterns)
NAN_PAYLOADS = {
    DType.F16: [0x7E01, 0xFE21, 0x7C01, 0xFD55],
    DType.BF16: [0x7F81, 0xFFA0, 0x7FC1, 0xFF83],
    DType.F32: [0x7FC00001, 0xFFE00100, 0x7F800001, 0xFFA12345],
}


def with_nan_payloads(values: np.ndarray, dtype: DType) -> np.ndarray:
    """``with_specials`` plus NaNs carrying payloads right after them (F16/BF16/F32):
    a same-dtype move must keep their bits (R-CONVERT)."""
    v = with_specials(values, dtype)
    bits = np.array(NAN_PAYLOADS[dtype], dtype=np.uint32 if dtype == DType.F32 else np.uint16)
    k0 = 8
    k = max(0, min(len(bits), len(v) - k0))
    v[k0:k0 + k] = bits[:k].view(np_dtype(dtype))
    return v


# ---------------------------------------------------------------------------- layouts


def layout(
    geom: Geometry,
    kind: str | Layout = "nhd",
    dtype: DType = DType.F16,
    *,
    pack: int | None = None,
    pad: int = 0,
    order: tuple[int, ...] | None = None,
    stride: tuple[int, ...] | None = None,
) -> TensorLayout:
    """A cache tensor layout by name: canonical, padded (``pad``), permuted (``order``) or explicit."""
    lay = LAYOUT_NAMES[kind] if isinstance(kind, str) else Layout(kind)
    if lay == Layout.BLOCK_HND_PACKED and pack is None:
        pack = 2 if geom.head_dim % 2 == 0 else 1
    t = cache_layout(geom, lay, dtype, pack=pack, pad=pad, order=order)
    if stride is not None:
        t = t.with_(stride=tuple(stride))
    return t


def io_layout(
    dtype: DType, num_tokens: int, geom: Geometry, kind: str = "dense"
) -> IOLayout:
    """IO tensor ``[num_tokens, H, D]``: ``dense``, ``padded`` (rows and heads padded) or
    ``head_major`` (heads outermost: ``[H][tokens][D]`` in memory, described by strides) or
    ``dim_major`` (each token's row dense but transposed, ``[tokens][D][H]`` in memory: the token
    stride is the dense ``H * D``, the head and dim strides are not)."""
    h, d = geom.num_kv_heads, geom.head_dim
    if kind == "dense":
        return IOLayout.dense(dtype, num_tokens, h, d)
    if kind == "padded":
        return IOLayout(dtype, (num_tokens, h, d), (h * (d + 3) + 5, d + 3, 1))
    if kind == "head_major":
        return IOLayout(dtype, (num_tokens, h, d), (d, max(num_tokens, 1) * d, 1))
    if kind == "dim_major":
        return IOLayout(dtype, (num_tokens, h, d), (h * d, 1, h))
    raise ValueError(kind)


# ---------------------------------------------------------------------------- caches


def make_cache(
    geom: Geometry,
    k: TensorLayout,
    v: TensorLayout | None = None,
    *,
    seed: int,
    pool: PoolCase | None = None,
) -> CacheCase:
    """A cache of random finite contents (padding too)."""
    v = v or k
    rng = rng_for(seed)
    k_init = finite_values(rng, k.dtype, k.span_elements())
    v_init = finite_values(rng, v.dtype, v.span_elements())
    return CacheCase(geom, k, v, k_init, v_init, pool)


def simple_cache(
    geom: Geometry = GEOM, kind: str | Layout = "nhd", dtype: DType = DType.F16, *, seed: int, **layout_kw
) -> CacheCase:
    t = layout(geom, kind, dtype, **layout_kw)
    return make_cache(geom, t, t, seed=seed)


def validate_case(cache: CacheCase, *, label: str = "", overrides: dict | None = None, seed: int | None = None) -> ValidateCase:
    return ValidateCase(cache, seed=seed, label=label, c_overrides=dict(overrides or {}))


# ---------------------------------------------------------------------------- writes


def write_case(
    cache: CacheCase,
    slots,
    *,
    seed: int,
    io_dtype: DType | None = None,
    slot_dtype: DType = DType.S64,
    invalid_slot: int = -1,
    io_kind: str = "dense",
    key_layout: IOLayout | None = None,
    value_layout: IOLayout | None = None,
    specials: bool = False,
    nan_payloads: bool = False,
    k_scale: float | None = None,
    v_scale: float | None = None,
    k_scale_desc: ScaleSpec | None = None,
    v_scale_desc: ScaleSpec | None = None,
    label: str = "",
    overrides: dict | None = None,
) -> WriteCase:
    """Write ``len(slots)`` tokens of random values into ``cache`` at ``slots``."""
    g = cache.geom
    slots = np.asarray(slots, dtype=np.int64)
    n = len(slots)
    io_dt = io_dtype if io_dtype is not None else cache.k.dtype
    kl = key_layout or io_layout(io_dt, n, g, io_kind)
    vl = value_layout or io_layout(io_dt, n, g, io_kind)
    rng = rng_for(seed + 7919)
    key = finite_values(rng, kl.dtype, kl.span_elements())
    value = finite_values(rng, vl.dtype, vl.span_elements())
    if specials:
        key, value = with_specials(key, kl.dtype), with_specials(value, vl.dtype)
    if nan_payloads:
        key, value = with_nan_payloads(key, kl.dtype), with_nan_payloads(value, vl.dtype)
    return WriteCase(
        cache=cache, key_layout=kl, value_layout=vl, key=key, value=value,
        slots=SlotMapping(slots, dtype=slot_dtype, invalid_slot=invalid_slot), num_tokens=n,
        k_scale=k_scale, v_scale=v_scale, k_scale_desc=k_scale_desc, v_scale_desc=v_scale_desc,
        seed=seed, label=label, c_overrides=dict(overrides or {}),
    )


def with_slots(case: WriteCase, slots) -> WriteCase:
    """The same write with other slot values (same count)."""
    s = dataclasses.replace(case.slots, slots=np.asarray(slots, dtype=np.int64))
    return dataclasses.replace(case, slots=s)


def spread_slots(geom: Geometry, n: int, seed: int, exclude: set[int] | None = None) -> np.ndarray:
    """``n`` distinct valid slots in random order (a permutation prefix)."""
    rng = rng_for(seed + 104729)
    pool = [s for s in rng.permutation(geom.num_slots).tolist() if not exclude or s not in exclude]
    return np.array(pool[:n], dtype=np.int64)


def scale_spec(values, granularity: ScaleGranularity = ScaleGranularity.PER_TENSOR, dtype: DType = DType.F32,
               *, scalar: bool = False) -> ScaleSpec:
    """A scale descriptor of ``values``: ``ndim 1``, ``shape [len(values)]``; ``scalar``: one value
    described as a 0-d tensor (``ndim 0``, no shape: spec 6.6 gives ``shape`` / ``ndim`` "for
    non-scalar scales"), as a 0-d framework tensor (vLLM's ``k_scale``) is described."""
    vals = np.asarray(values, dtype=np.float32)
    if scalar:
        if vals.size != 1:
            raise ValueError(f"a scalar scale holds one value, not {vals.size}")
        return ScaleSpec(vals.reshape(()), granularity, dtype)
    return ScaleSpec(vals.reshape(-1), granularity, dtype)


# ---------------------------------------------------------------------------- gathers


def _out(case_dtype: DType, rows: int, geom: Geometry, out4d: tuple[int, int] | None, rng) -> tuple[IOLayout, np.ndarray, np.ndarray]:
    if out4d is not None:
        seqs, msl = out4d
        lay = IOLayout.padded4d(case_dtype, seqs, msl, geom.num_kv_heads, geom.head_dim)
    else:
        lay = IOLayout.dense(case_dtype, rows, geom.num_kv_heads, geom.head_dim)
    n = lay.span_elements()
    return lay, poison(rng, case_dtype, n), poison(rng, case_dtype, n)


def packed_gather(
    cache: CacheCase,
    table,
    lengths,
    max_seq_len: int,
    *,
    seed: int,
    io_dtype: DType | None = None,
    index_dtype: DType = DType.S32,
    lens_dtype: DType = DType.S32,
    out4d: bool = False,
    label: str = "",
    overrides: dict | None = None,
) -> GatherCase:
    """PACKED gather: ``table[seq, logical block]`` physical ids, ``lengths[seq]`` cached tokens."""
    table = np.asarray(table, dtype=np.int64)
    table = table.reshape(len(lengths), table.shape[-1] if table.ndim > 1 else -1)
    bt = BlockTable.packed(table, index_dtype=index_dtype)
    return _gather(cache, bt, lengths, max_seq_len, seed=seed, io_dtype=io_dtype, lens_dtype=lens_dtype,
                   out4d=out4d, label=label, overrides=overrides)


#: the geometry of the tiny valid calls that probe what a provider serves (4 blocks of 4 tokens, 2 heads of 8)
TINY = Geometry(num_blocks=4, block_size=4, num_kv_heads=2, head_dim=8)


def tiny_calls(kind: str | Layout, dtype: DType, *, seed: int, label: str) -> tuple[ValidateCase, WriteCase, GatherCase]:
    """A tiny valid validate, write (2 tokens) and PACKED gather (one sequence of 3 tokens) of a
    ``kind`` cache of ``dtype`` in ``TINY``: the calls that probe a provider before a run."""
    cache = simple_cache(TINY, kind, dtype, seed=seed)
    write = write_case(cache, spread_slots(TINY, 2, seed + 1), seed=seed + 1, label=label)
    gather = packed_gather(cache, [[1]], [3], 4, seed=seed + 2, label=label)
    return validate_case(cache, label=label), write, gather


def ragged_table(table, lengths, block_size: int, max_blocks_per_seq: int,
                 index_dtype: DType = DType.S32, indptr_dtype: DType = DType.S32, extra: int = 0) -> BlockTable:
    """RAGGED (spec 5.1) from a per-sequence block list: one index per cached token.

    ``extra`` appends that many more tokens' indices to every sequence's range (a
    range longer than the length is allowed; only ``min(L, max_seq_len)`` are read).
    """
    per_seq = []
    for s, L in enumerate(lengths):
        blocks = np.asarray(table[s], dtype=np.int64)
        n = max(int(L), 0) + extra
        per_seq.append(np.array([blocks[min(t // block_size, len(blocks) - 1)] for t in range(n)], dtype=np.int64))
    return BlockTable.ragged(per_seq, max_blocks_per_seq, index_dtype=index_dtype, indptr_dtype=indptr_dtype)


def ragged_gather(
    cache: CacheCase,
    table,
    lengths,
    max_seq_len: int,
    *,
    seed: int,
    io_dtype: DType | None = None,
    index_dtype: DType = DType.S32,
    indptr_dtype: DType = DType.S32,
    lens_dtype: DType = DType.S32,
    out4d: bool = False,
    extra: int = 0,
    block_table: BlockTable | None = None,
    label: str = "",
    overrides: dict | None = None,
) -> GatherCase:
    """RAGGED gather of the same logical content as :func:`packed_gather` of ``table``."""
    table = np.asarray(table, dtype=np.int64).reshape(len(lengths), -1)
    bt = block_table or ragged_table(table, lengths, cache.geom.block_size, table.shape[1],
                                     index_dtype, indptr_dtype, extra)
    return _gather(cache, bt, lengths, max_seq_len, seed=seed, io_dtype=io_dtype, lens_dtype=lens_dtype,
                   out4d=out4d, label=label, overrides=overrides)


def kv_offsets_cache(
    geom: Geometry,
    dtype: DType,
    *,
    primary_blocks: int,
    secondary_blocks: int = 0,
    seed: int,
    secondary_null: bool = False,
) -> CacheCase:
    """A cache for KV_OFFSETS gathers: small canonical HND k/v (validated, not read) plus pools."""
    rng = rng_for(seed)
    bpe = geom.num_kv_heads * geom.block_size * geom.head_dim
    t = layout(geom, "hnd", dtype)
    prim = finite_values(rng, dtype, bpe * primary_blocks)
    sec = finite_values(rng, dtype, bpe * secondary_blocks) if secondary_blocks else None
    pool = PoolCase(bytes_per_block=bpe * abi.DTYPE_SIZE[dtype], primary=prim, secondary=sec,
                    secondary_null=secondary_null)
    return CacheCase(geom, t, t, finite_values(rng, dtype, t.span_elements()),
                     finite_values(rng, dtype, t.span_elements()), pool)


SECONDARY = 0x80000000
NULL_INDEX = 0xFFFFFFFF


def kv_offsets_gather(
    cache: CacheCase,
    offsets,
    lengths,
    max_seq_len: int,
    *,
    seed: int,
    io_dtype: DType | None = None,
    lens_dtype: DType = DType.S32,
    out4d: bool = False,
    label: str = "",
    overrides: dict | None = None,
) -> GatherCase:
    """KV_OFFSETS gather: ``offsets[seq, beam, K|V, block]`` KVCacheIndex values
    (``SECONDARY | i`` selects the secondary pool, ``NULL_INDEX`` is TRT-LLM's null)."""
    off = np.asarray(offsets, dtype=np.int64)
    bt = BlockTable.kv_offsets(off)
    return _gather(cache, bt, lengths, max_seq_len, seed=seed, io_dtype=io_dtype, lens_dtype=lens_dtype,
                   out4d=out4d, label=label, overrides=overrides)


def _gather(cache, bt: BlockTable, lengths, max_seq_len, *, seed, io_dtype, lens_dtype, out4d, label, overrides):
    rng = rng_for(seed + 15485863)
    rows_per_seq = bt.beam_width * max_seq_len
    rows = bt.seq_count * rows_per_seq
    dt = io_dtype if io_dtype is not None else cache.k.dtype
    lay, ok, ov = _out(dt, rows, cache.geom, (bt.seq_count * bt.beam_width, max_seq_len) if out4d else None, rng)
    return GatherCase(
        cache=cache, table=bt, seq_lens=SeqLens(np.asarray(lengths, dtype=np.int64), dtype=lens_dtype),
        max_seq_len=max_seq_len, out_layout=lay, num_tokens=rows, out_k_init=ok, out_v_init=ov,
        seed=seed, label=label, c_overrides=dict(overrides or {}),
    )


def with_out_dtypes(case: GatherCase, *, key: DType | None = None, value: DType | None = None) -> GatherCase:
    """The gather with its key and / or value output in another dtype: key and value outputs are
    separate tensors (spec 6.8), each with its own dtype. The retyped output keeps its shape and
    strides and gets poison of its new dtype as initial contents; the value output's layout becomes
    its own (``GatherCase.value_out_layout``), so each output is described, compared and printed
    in its own dtype."""
    rng = rng_for((case.seed or 0) + 49979687)
    changes: dict = {"value_out_layout": case.value_out}
    if key is not None:
        changes["out_layout"] = dataclasses.replace(case.out_layout, dtype=key)
        changes["out_k_init"] = poison(rng, key, changes["out_layout"].span_elements())
    if value is not None:
        changes["value_out_layout"] = dataclasses.replace(case.value_out, dtype=value)
        changes["out_v_init"] = poison(rng, value, changes["value_out_layout"].span_elements())
    return dataclasses.replace(case, **changes)


def distinct_table(geom: Geometry, seqs: int, max_blocks: int, seed: int) -> np.ndarray:
    """``[seqs, max_blocks]`` physical ids, distinct where possible, in scrambled order."""
    rng = rng_for(seed + 32452843)
    n = seqs * max_blocks
    ids = np.concatenate([rng.permutation(geom.num_blocks) for _ in range(-(-n // geom.num_blocks))])[:n]
    return ids.reshape(seqs, max_blocks).astype(np.int64)


def _canonical(t: TensorLayout, geom: Geometry) -> bool:
    if t.layout == Layout.BLOCK_HND_PACKED:
        pack = int(t.shape[4]) if len(t.shape) > 4 and t.shape[4] else 1
        return tuple(t.stride) == contiguous_strides(canonical_shape(geom, t.layout, pack))
    if t.layout in (Layout.BLOCK_NHD, Layout.BLOCK_HND, Layout.BLOCK_CUSTOM):
        return tuple(t.stride) == contiguous_strides(canonical_shape(geom, t.layout))
    return True


def case_features(case) -> list[str]:
    """The optional features (``outcomes.OPTIONAL_FEATURES``) a case exercises, most specific first.

    A provider that answers UNSUPPORTED for a case may do so for any of them; the
    suites excuse it when at least one of them is not claimed.
    """
    from ..abi.header import FP8_DTYPES, TableFormat

    feats: list[str] = []
    table = getattr(case, "table", None)
    if table is not None and table.format == TableFormat.RAGGED:
        feats.append("ragged")
    if table is not None and table.format == TableFormat.KV_OFFSETS:
        feats.append("kv_offsets")
        pool = case.cache.pool
        if pool is not None and pool.secondary is not None and np.any(
                (np.asarray(table.indices, np.int64) & 0x80000000) != 0):
            feats.append("secondary_pool")
    c = case.cache
    if c.k.dtype in abi.FP8_DTYPES or c.v.dtype in abi.FP8_DTYPES:
        feats.append("fp8")
        if any(getattr(getattr(case, f"{side}_scale_desc", None), "stride", 1) not in (0, 1) for side in "kv"):
            feats.append("scale_strides")
    names = {Layout.BLOCK_HND_PACKED: "hnd_packed", Layout.BLOCK_CUSTOM: "custom_layout",
             Layout.BLOCK_NHD: "nhd", Layout.BLOCK_HND: "hnd"}
    for t in (c.k, c.v):
        try:
            f = names.get(Layout(t.layout))
        except ValueError:
            f = None
        if f and f not in feats:
            feats.append(f)
        if any(x < 0 for x in t.stride):
            if "negative_strides" not in feats:  # the feature of such a tensor, whatever else its strides do
                feats.append("negative_strides")
        # CUSTOM is described by its strides (spec 4.2): any stride pattern is the feature itself
        elif t.layout != Layout.BLOCK_CUSTOM and not _canonical(t, c.geom) and "noncanonical_strides" not in feats:
            feats.append("noncanonical_strides")
    if c.k.layout != c.v.layout or c.k.dtype != c.v.dtype or c.k.stride != c.v.stride:
        feats.append("mixed_layouts")
    ios = [case.out_layout, case.value_out] if hasattr(case, "out_layout") else (
        [case.key_layout, case.value_layout] if hasattr(case, "key_layout") else [])
    # an output retyped through the C descriptor's dtype field (c_overrides) counts with its own dtype
    fp8_cache = c.k.dtype in FP8_DTYPES or c.v.dtype in FP8_DTYPES
    overrides = getattr(case, "c_overrides", None) or {}
    for side in ("key", "value"):
        dt = overrides.get(f"desc.io.{side}.dtype") if hasattr(case, "out_layout") else None
        if (dt is not None and int(dt) in (DType.F16, DType.BF16, DType.F32) and int(dt) not in (c.k.dtype, c.v.dtype)
                and not fp8_cache and "mixed_io_dtype" not in feats):
            feats.append("mixed_io_dtype")
    for io in ios:
        if len(io.shape) == 4 and "gather_4d" not in feats:
            feats.append("gather_4d")
        dense = contiguous_strides(tuple(io.shape))
        if any(x < 0 for x in io.stride):
            if "negative_strides" not in feats:
                feats.append("negative_strides")
        elif tuple(io.stride) != dense and "io_strides" not in feats:
            feats.append("io_strides")
        # into or out of an FP8 cache a different IO dtype is the FP8 feature (quantization)
        if io.dtype not in (c.k.dtype, c.v.dtype) and not fp8_cache and "mixed_io_dtype" not in feats:
            feats.append("mixed_io_dtype")
    return feats


_CORE_LAYOUT: dict[tuple[str, int], str] = {}


def core_layout(provider, memory=abi.Memory.HOST) -> str:
    """"nhd" when the provider validates a canonical F16 NHD cache, else "hnd" -- unless the
    run's preflight saw which of the two a write serves (:func:`seed_core_layout`).

    The core profile needs one of NHD and HND (readings: core); tests of semantics
    that do not depend on the layout use the one the provider serves. Validation alone
    cannot say which: spec 7 has ``kvx_validate_cache_desc`` validate "layout, dtype, shape,
    stride, and required fields", so a provider may answer OK for a valid NHD cache that its
    writes refuse (docs/spec-readings.md, R-REFUSAL).
    """
    from .execute import CallOptions, run_validate

    key = (str(getattr(provider, "path", id(provider))), int(memory))
    if key not in _CORE_LAYOUT:
        case = validate_case(simple_cache(GEOM, "nhd", DType.F16, seed=0))
        st = run_validate(provider, case, CallOptions(memory=memory)).status
        _CORE_LAYOUT[key] = "nhd" if st == abi.Status.OK else "hnd"
    return _CORE_LAYOUT[key]


def seed_core_layout(provider, memory, write_layout: str | None) -> None:
    """Record the core layout from the preflight's write probe (``run-info.json``: the layout of
    the first of NHD, HND whose tiny write answered OK, probed in a subprocess), so that a
    provider whose validation accepts NHD but whose writes serve HND alone is held to HND."""
    kind = {"BLOCK_NHD": "nhd", "BLOCK_HND": "hnd"}.get(str(write_layout))
    if kind is not None:
        _CORE_LAYOUT[(str(getattr(provider, "path", id(provider))), int(memory))] = kind


def replace(case, **changes):
    """``dataclasses.replace`` for cases (keeps builders' outputs immutable in tests)."""
    return dataclasses.replace(case, **changes)


__all__ = [
    "GEOM", "SECONDARY", "NULL_INDEX", "rng_for", "finite_values", "poison", "with_specials", "with_nan_payloads", "layout",
    "io_layout", "make_cache", "simple_cache", "validate_case", "write_case", "with_slots", "spread_slots",
    "scale_spec", "packed_gather", "with_out_dtypes",
    "ragged_table", "ragged_gather", "kv_offsets_cache", "kv_offsets_gather",
    "distinct_table", "case_features", "core_layout", "seed_core_layout", "replace", "canonical_shape", "contiguous_strides",
]
