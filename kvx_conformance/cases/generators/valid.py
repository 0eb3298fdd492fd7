"""Random VALID cases.

Geometry, cache and IO layouts, validate, write and gather cases with their slots and tables.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ...abi import header as abi
from ...abi.descriptors import (
    BlockTable,
    Geometry,
    IOLayout,
    ScaleSpec,
    SeqLens,
    SlotMapping,
    TensorLayout,
    cache_layout,
)
from ...abi.header import BASELINE_DTYPES, FP8_DTYPES, INDEX_DTYPES, DType, Layout, ScaleGranularity, TableFormat
from ..case import CacheCase, GatherCase, PoolCase, ValidateCase, WriteCase
from .values import (
    INT32_MAX,
    INT32_MIN,
    NULL_INDEX,
    PACKS,
    SECONDARY_BIT,
    VALUE_MODES,
    _pick,
    _profile,
    poisoned,
    random_finite,
    random_values,
)


def random_geometry(rng: np.random.Generator, *, pow2_block: bool = False, **fixed) -> Geometry:
    bs_choices = (1, 2, 4, 8, 16) if pow2_block else (1, 2, 3, 4, 5, 8, 16)
    g = dict(
        num_blocks=int(rng.integers(1, 9)),
        block_size=int(_pick(rng, bs_choices)),
        num_kv_heads=int(rng.integers(1, 4)),
        head_dim=int(_pick(rng, (1, 2, 3, 4, 6, 8, 16, 32))),
    )
    g.update(fixed)
    return Geometry(**g)


def strides_for(shape: tuple[int, ...], order: tuple[int, ...], pad: int = 0, gap: int = 0) -> tuple[int, ...]:
    """Strides for ``shape`` stored outermost-to-innermost in ``order``; ``pad`` elements after each
    innermost row, ``gap`` after each outermost item."""
    stride = [0] * len(shape)
    acc = 1
    for pos, dim in enumerate(reversed(order)):
        stride[dim] = acc
        acc *= shape[dim]
        if pos == 0:
            acc += pad
    if gap:
        stride[order[0]] += gap
    return tuple(stride)


def random_tensor_layout(rng: np.random.Generator, geom: Geometry, dtype: DType, kind: str | None = None) -> TensorLayout:
    kind = kind or _pick(rng, _profile.get().layout_kinds)
    if kind == "nhd":
        return cache_layout(geom, Layout.BLOCK_NHD, dtype)
    if kind == "hnd":
        return cache_layout(geom, Layout.BLOCK_HND, dtype)
    if kind == "nhd_padded":
        return cache_layout(geom, Layout.BLOCK_NHD, dtype, pad=int(rng.integers(1, 6)))
    if kind == "hnd_padded":
        return cache_layout(geom, Layout.BLOCK_HND, dtype, pad=int(rng.integers(1, 6)))
    if kind == "vllm_v":
        return cache_layout(geom, Layout.BLOCK_HND, dtype, pad=int(rng.integers(0, 3)), order=(0, 1, 3, 2))
    canon = not _profile.get().noncanonical  # draw as always (same random stream), then drop pad / order
    if kind == "hnd_packed":
        pack = int(_pick(rng, [p for p in PACKS if geom.head_dim % p == 0]))
        order = tuple(rng.permutation(5)) if rng.random() < 0.3 else None
        pad = int(rng.integers(0, 3))
        return cache_layout(geom, Layout.BLOCK_HND_PACKED, dtype, pack=pack, pad=0 if canon else pad,
                            order=None if canon else order)
    if kind == "custom":
        pad, order = int(rng.integers(0, 4)), tuple(rng.permutation(4))
        return cache_layout(geom, Layout.BLOCK_CUSTOM, dtype, pad=0 if canon else pad, order=None if canon else order)
    if kind == "permuted":
        layout = _pick(rng, (Layout.BLOCK_NHD, Layout.BLOCK_HND))
        base = cache_layout(geom, layout, dtype)
        stride = strides_for(base.shape, tuple(int(x) for x in rng.permutation(4)), int(rng.integers(0, 4)),
                             int(rng.integers(0, 3)))
        return base.with_(stride=stride)
    raise ValueError(f"unknown layout kind {kind!r}")


def random_io_layout(
    rng: np.random.Generator, dtype: DType, shape: tuple[int, ...], kind: str | None = None
) -> IOLayout:
    """An IO tensor of ``shape`` (3-D or 4-D): dense, padded rows, or permuted dimensions."""
    kind = kind or _pick(rng, _profile.get().io_kinds)
    nd = len(shape)
    order = tuple(range(nd))
    pad = gap = 0
    if kind == "padded":
        pad, gap = int(rng.integers(1, 5)), int(rng.integers(0, 3))
    elif kind == "permuted":
        order = tuple(int(x) for x in rng.permutation(nd))
        pad = int(rng.integers(0, 3))
    elif kind != "dense":
        raise ValueError(f"unknown io kind {kind!r}")
    layout = _pick(rng, (Layout.BLOCK_CUSTOM, Layout.BLOCK_CUSTOM, Layout.BLOCK_NHD, Layout.BLOCK_HND))
    return IOLayout(dtype, tuple(shape), strides_for(tuple(shape), order, pad, gap), layout=layout)


def _cache_case(rng, geom, k_dtype, v_dtype, k_kind=None, v_kind=None, pool=None) -> CacheCase:
    k = random_tensor_layout(rng, geom, k_dtype, k_kind)
    v = random_tensor_layout(rng, geom, v_dtype, v_kind)
    if not _profile.get().mixed_kv:  # V in K's layout and strides (and dtype)
        v = k.with_(dtype=k_dtype)
        v_dtype = k_dtype
    return CacheCase(geom, k, v, random_finite(rng, k_dtype, k.span_elements()),
                     random_finite(rng, v_dtype, v.span_elements()), pool)


def random_validate_case(rng: np.random.Generator, *, seed: int | None = None, **constraints) -> ValidateCase:
    geom = constraints.get("geom") or random_geometry(rng)
    k_dtype = constraints.get("k_dtype") or _pick(rng, _profile.get().cache_dtypes)
    v_dtype = constraints.get("v_dtype") or _pick(rng, _profile.get().cache_dtypes)
    cache = _cache_case(rng, geom, k_dtype, v_dtype, constraints.get("k_kind"), constraints.get("v_kind"))
    return ValidateCase(cache, seed=seed, label="random")


def _random_slots(rng, num_slots: int, T: int, dtype: DType, invalid_slot: int, n_valid: int) -> np.ndarray:
    pool = np.arange(num_slots, dtype=np.int64)
    pool = pool[pool != invalid_slot]
    n_valid = min(n_valid, len(pool), T)
    valid = rng.choice(pool, size=n_valid, replace=False) if n_valid else np.zeros(0, np.int64)
    lo = INT32_MIN if dtype == DType.S32 else -(1 << 62)
    invalid_choices = [-1, int(rng.integers(lo, 0)), -2, invalid_slot]
    if invalid_slot >= 0 and dtype == DType.S32 and invalid_slot > INT32_MAX:
        invalid_choices.remove(invalid_slot)
    invalid = np.array([_pick(rng, invalid_choices) for _ in range(T - n_valid)], dtype=np.int64)
    slots = np.concatenate([valid.astype(np.int64), invalid])
    return slots[rng.permutation(T)]


def _random_scale_value(rng, exact: bool) -> float:
    if exact:
        return float(2.0 ** int(rng.integers(-4, 5)))
    return float(np.float32(2.0 ** rng.uniform(-6, 6)))


def random_write_case(
    rng: np.random.Generator,
    *,
    seed: int | None = None,
    geom: Geometry | None = None,
    k_dtype: DType | None = None,
    v_dtype: DType | None = None,
    key_dtype: DType | None = None,
    value_dtype: DType | None = None,
    k_kind: str | None = None,
    v_kind: str | None = None,
    io_kind: str | None = None,
    num_tokens: int | None = None,
    slot_dtype: DType | None = None,
    value_mode: str | None = None,
    scales: str | None = None,  # "none", "tensor_ptr" (pointer + scalar descriptor), "per_tensor", "per_head", "both"
) -> WriteCase:
    geom = geom or random_geometry(rng)
    k_dtype = k_dtype or _pick(rng, _profile.get().cache_dtypes)
    v_dtype = v_dtype or (k_dtype if rng.random() < 0.5 else _pick(rng, _profile.get().cache_dtypes))
    cache = _cache_case(rng, geom, k_dtype, v_dtype, k_kind, v_kind)
    H, D = geom.num_kv_heads, geom.head_dim
    T = int(rng.integers(0, min(geom.num_slots + 4, 24) + 1)) if num_tokens is None else num_tokens
    mode = value_mode or _pick(rng, VALUE_MODES)

    if not _profile.get().mixed_kv:
        v_dtype = k_dtype

    def io_dtype_for(cache_dt: DType) -> DType:
        if cache_dt in FP8_DTYPES and rng.random() < 0.3:
            return cache_dt
        picked = _pick(rng, BASELINE_DTYPES)
        # into an FP8 cache a baseline IO dtype quantizes: that is the FP8 feature itself
        return picked if _profile.get().mixed_io or cache_dt in FP8_DTYPES else cache_dt

    key_dtype = key_dtype or io_dtype_for(k_dtype)
    value_dtype = value_dtype or io_dtype_for(v_dtype)
    key_layout = random_io_layout(rng, key_dtype, (T, H, D), io_kind)
    value_layout = random_io_layout(rng, value_dtype, (T, H, D), io_kind)

    # scales (R-FP8): only FP8 caches use them; others must ignore whatever is passed
    scales = scales or _pick(rng, _profile.get().scales)
    exact = mode == "ties"
    kw: dict = {}
    scale_of = {}
    for side in ("k", "v"):
        if scales in ("tensor_ptr", "both"):
            kw[f"{side}_scale"] = _random_scale_value(rng, exact)
            scale_of[side] = kw[f"{side}_scale"]
            if scales == "tensor_ptr":
                # the same value as a scalar descriptor (ndim 0): a pointer alone is the MAY fallback of
                # spec 6.9 ("implementations MAY fall back to k_scale/v_scale"), which no required test
                # depends on (readings R-FP8); a provider must still ignore the pointer beside it
                kw[f"{side}_scale_desc"] = ScaleSpec(np.array(kw[f"{side}_scale"], np.float32).reshape(()),
                                                     ScaleGranularity.PER_TENSOR)
        if scales in ("per_tensor", "both"):
            val = _random_scale_value(rng, exact)
            kw[f"{side}_scale_desc"] = ScaleSpec(np.array([val], np.float32), ScaleGranularity.PER_TENSOR)
            scale_of[side] = val
        elif scales == "per_head":
            vals = np.array([_random_scale_value(rng, exact) for _ in range(H)], np.float32)
            kw[f"{side}_scale_desc"] = ScaleSpec(vals, ScaleGranularity.PER_HEAD)
            scale_of[side] = float(vals[0])

    key = random_values(rng, key_dtype, key_layout.span_elements(), mode, target=k_dtype, scale=scale_of.get("k", 1.0))
    value = random_values(rng, value_dtype, value_layout.span_elements(), mode, target=v_dtype,
                          scale=scale_of.get("v", 1.0))

    slot_dtype = slot_dtype or _pick(rng, INDEX_DTYPES)
    r = rng.random()
    if r < 0.6:
        invalid_slot = -1
    elif r < 0.75:
        invalid_slot = int(rng.integers(-1000, -1))
    elif r < 0.9:
        invalid_slot = int(rng.integers(0, geom.num_slots))  # a real slot made a no-op
    else:
        invalid_slot = int(rng.integers(geom.num_slots, geom.num_slots + 1000))
    n_valid = int(rng.integers(0, T + 1)) if rng.random() < 0.3 else T
    slots = SlotMapping(_random_slots(rng, geom.num_slots, T, slot_dtype, invalid_slot, n_valid), slot_dtype, invalid_slot)
    return WriteCase(cache, key_layout, value_layout, key, value, slots, T, seed=seed, label=f"random/{mode}/{scales}",
                     **kw)


def _garbage_index(rng, num_blocks: int, dtype: DType) -> int:
    hi = INT32_MAX if dtype == DType.S32 else (1 << 40)
    return int(_pick(rng, [-1, num_blocks, hi, int(rng.integers(INT32_MIN if dtype == DType.S32 else -(1 << 40), 0)),
                           int(rng.integers(0, num_blocks))]))


def random_gather_case(
    rng: np.random.Generator,
    *,
    seed: int | None = None,
    fmt: TableFormat | None = None,
    geom: Geometry | None = None,
    k_dtype: DType | None = None,
    v_dtype: DType | None = None,
    out_dtype: DType | None = None,
    k_kind: str | None = None,
    v_kind: str | None = None,
    io_kind: str | None = None,
    four_d: bool | None = None,
    seq_count: int | None = None,
    max_seq_len: int | None = None,
    lengths: list[int] | None = None,
    beam_width: int | None = None,
    max_blocks_per_seq: int | None = None,
    index_dtype: DType | None = None,
    secondary: bool | None = None,
    min_tokens: int = 0,
    lens_dtype: DType | None = None,
) -> GatherCase:
    """A valid gather. ``min_tokens`` > 0 makes sure some sequence gathers at least that many tokens."""
    prof = _profile.get()
    fmt = fmt or _pick(rng, prof.formats)
    kvo = fmt == TableFormat.KV_OFFSETS
    geom = geom or random_geometry(rng, pow2_block=kvo)
    H, D, bs, nb = geom.num_kv_heads, geom.head_dim, geom.block_size, geom.num_blocks

    fp8_choices = [d for d in prof.cache_dtypes if d in FP8_DTYPES]
    fp8 = (k_dtype in FP8_DTYPES) if k_dtype else (bool(fp8_choices) and rng.random() < 0.2)
    if fp8:
        k_dtype = k_dtype or _pick(rng, fp8_choices)
        v_dtype = v_dtype or k_dtype
        out_dtype = out_dtype or k_dtype
    else:
        k_dtype = k_dtype or _pick(rng, BASELINE_DTYPES)
        v_dtype = v_dtype or (k_dtype if kvo or rng.random() < 0.5 else _pick(rng, BASELINE_DTYPES))
        out_dtype = out_dtype or _pick(rng, BASELINE_DTYPES)
        if not prof.mixed_kv:
            v_dtype = k_dtype
        if not prof.mixed_io and out_dtype not in (k_dtype, v_dtype):
            out_dtype = k_dtype

    S = (int(rng.integers(0, 5)) if rng.random() < 0.1 else int(rng.integers(1, 5))) if seq_count is None else seq_count
    if min_tokens:
        S = max(S, 1)
    msl = (int(rng.integers(0, 21)) if rng.random() < 0.1 else int(rng.integers(1, 21))) if max_seq_len is None else max_seq_len
    if min_tokens:
        msl = max(msl, min_tokens)
    bw = (int(rng.integers(1, 4)) if kvo else 1) if beam_width is None else beam_width
    if lengths is None:
        lens = []
        for _ in range(S):
            r = rng.random()
            if r < 0.15:
                lens.append(0)
            elif r < 0.3:
                lens.append(int(rng.integers(msl, msl + 1000)))  # truncated by max_seq_len
            else:
                lens.append(int(rng.integers(0, msl + 1)))
        if min_tokens and S and max(min(x, msl) for x in lens) < min_tokens:
            lens[int(rng.integers(S))] = int(rng.integers(min_tokens, msl + 1))
    else:
        lens = list(lengths)
    n = np.minimum(np.array(lens, np.int64), msl) if S else np.zeros(0, np.int64)
    need = -(-n // bs)
    mb = (int(need.max(initial=0)) + int(rng.integers(0, 3))) if max_blocks_per_seq is None else max_blocks_per_seq
    used = np.minimum(need, mb)
    seq_lens_dtype = _pick(rng, INDEX_DTYPES)
    if lens_dtype is not None:
        seq_lens_dtype = lens_dtype
    if seq_lens_dtype == DType.S32 and any(x > INT32_MAX for x in lens):
        seq_lens_dtype = DType.S64

    pool = None
    if fmt == TableFormat.PACKED:
        idx_dt = index_dtype or _pick(rng, INDEX_DTYPES)
        table = np.array([[int(rng.integers(0, nb)) if j < used[s] else
                           (_garbage_index(rng, nb, idx_dt) if rng.random() < 0.5 else int(rng.integers(0, nb)))
                           for j in range(mb)] for s in range(S)], np.int64).reshape(S, mb)
        bt = BlockTable.packed(table, idx_dt)
    elif fmt == TableFormat.RAGGED:
        idx_dt = index_dtype or _pick(rng, INDEX_DTYPES)
        per_seq = []
        for s in range(S):
            extra = int(rng.integers(0, 4)) if rng.random() < 0.5 else 0
            ids = [int(rng.integers(0, nb)) for _ in range(int(n[s]))]
            ids += [_garbage_index(rng, nb, idx_dt) if rng.random() < 0.5 else int(rng.integers(0, nb)) for _ in range(extra)]
            per_seq.append(np.array(ids, np.int64))
        bt = BlockTable.ragged(per_seq, mb, index_dtype=idx_dt, indptr_dtype=_pick(rng, INDEX_DTYPES))
        lead = int(rng.integers(1, 4)) if rng.random() < 0.2 else 0  # indptr[0] > 0: leading entries unused
        if lead:
            garbage = [_garbage_index(rng, nb, idx_dt) for _ in range(lead)]
            bt = dataclasses.replace(bt, indices=np.concatenate([np.array(garbage, np.int64), bt.indices]),
                                     indptr=bt.indptr + lead)
    else:
        elem = abi.DTYPE_SIZE[k_dtype]
        per_block = H * bs * D
        p_blocks = nb + int(rng.integers(0, 5))  # pools may hold more blocks than num_blocks
        has_sec = ((rng.random() < 0.4) if secondary is None else secondary) and prof.secondary
        s_blocks = int(rng.integers(1, 6)) if has_sec else 0
        prim = random_finite(rng, k_dtype, p_blocks * per_block)
        sec = random_finite(rng, k_dtype, s_blocks * per_block) if has_sec else None
        pool = PoolCase(per_block * elem, prim, sec)
        offsets = np.zeros((S, bw, 2, mb), np.int64)
        for s in range(S):
            for b in range(bw):
                for kv in range(2):
                    for j in range(mb):
                        if j < used[s]:
                            if has_sec and rng.random() < 0.4:
                                offsets[s, b, kv, j] = SECONDARY_BIT | int(rng.integers(0, s_blocks))
                            else:
                                offsets[s, b, kv, j] = int(rng.integers(0, p_blocks))
                        else:
                            offsets[s, b, kv, j] = _pick(rng, [NULL_INDEX, int(rng.integers(0, p_blocks)),
                                                               SECONDARY_BIT | 12345])
        bt = BlockTable.kv_offsets(offsets)

    cache = _cache_case(rng, geom, k_dtype, v_dtype, k_kind, v_kind, pool)
    num_tokens = S * bw * msl
    if four_d is None:
        four_d = prof.four_d and rng.random() < 0.4
    shape = (S * bw, msl, H, D) if four_d else (num_tokens, H, D)
    out_layout = random_io_layout(rng, out_dtype, shape, io_kind)
    span = out_layout.span_elements()
    return GatherCase(
        cache, bt, SeqLens(np.array(lens, np.int64), seq_lens_dtype), msl, out_layout, num_tokens,
        out_k_init=poisoned(out_dtype, span), out_v_init=poisoned(out_dtype, span), seed=seed,
        label=f"random/{fmt.name}",
    )
