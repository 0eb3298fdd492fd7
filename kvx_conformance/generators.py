"""Seeded random generators of KVX cases: valid ones, and ones that break exactly one rule.

- ``random_write_case(rng, **constraints)`` / ``random_gather_case(rng, **constraints)`` /
  ``random_validate_case(rng, **constraints)``: VALID cases over every layout (NHD, HND,
  HND_PACKED with pack in {1, 2, 4, 8, 16}, CUSTOM, padded and permuted strides, vLLM's
  V cache ``[blocks, H, D, block_size]`` as HND with order (0, 1, 3, 2)), K and V of
  different layouts and dtypes, every cache dtype (FP8 with and without scales,
  PER_TENSOR and PER_HEAD), S32/S64 metadata, invalid slots (-1, other negatives, a
  non-negative ``invalid_slot``), PACKED / RAGGED / KV_OFFSETS tables (beams, secondary
  pool, pools larger than ``num_blocks``), 3-D and 4-D gather outputs, ``max_seq_len``
  truncation and zero lengths. Caches start random (finite, never zero); gather
  outputs start poisoned with ``POISON_BYTE``.
- ``random_invalid_case(rng, rule)``: a case breaking exactly the named rule (ids of
  docs/spec-readings.md as listed in ``RULES``), with the status the readings expect.

Sizes stay small: every case runs in milliseconds. All randomness comes from the
``numpy.random.Generator`` passed in; ``seed`` is recorded in the case when given.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from . import abi
from .abi import BASELINE_DTYPES, CACHE_DTYPES, FP8_DTYPES, INDEX_DTYPES, DType, Layout, ScaleGranularity, Status, TableFormat
from .cases import CacheCase, GatherCase, PoolCase, ValidateCase, WriteCase
from .descriptors import BlockTable, Geometry, IOLayout, ScaleSpec, SeqLens, SlotMapping, TensorLayout, cache_layout
from .dtypes import BITS_DTYPE, np_dtype

#: Every byte of a gather output starts as this (finite in F16, BF16, F32, E4M3 and E5M2).
POISON_BYTE = 0x5A

PACKS = (1, 2, 4, 8, 16)
LAYOUT_KINDS = ("nhd", "hnd", "hnd_packed", "custom", "nhd_padded", "hnd_padded", "vllm_v", "permuted")
IO_KINDS = ("dense", "padded", "permuted")
VALUE_MODES = ("bits", "normal", "ties")

NULL_INDEX = 0xFFFFFFFF
SECONDARY_BIT = 0x80000000
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def _pick(rng: np.random.Generator, seq):
    return seq[int(rng.integers(len(seq)))]


@dataclass(frozen=True)
class Profile:
    """Which features unconstrained generator choices draw from."""

    layout_kinds: tuple[str, ...] = LAYOUT_KINDS
    io_kinds: tuple[str, ...] = IO_KINDS
    four_d: bool = True  # 4-D gather outputs
    cache_dtypes: tuple[DType, ...] = CACHE_DTYPES
    formats: tuple[TableFormat, ...] = (TableFormat.PACKED, TableFormat.RAGGED, TableFormat.KV_OFFSETS)
    scales: tuple[str, ...] = ("none", "tensor_ptr", "per_tensor", "per_head", "both")
    mixed_kv: bool = True  # K and V of different layouts, strides or dtypes (feature mixed_layouts)
    mixed_io: bool = True  # IO dtype different from the cache dtype (feature mixed_io_dtype)
    noncanonical: bool = True  # padded / permuted HND_PACKED and CUSTOM strides (noncanonical_strides)
    secondary: bool = True  # KV_OFFSETS secondary pool (feature secondary_pool)


#: Everything the generators know.
FULL = Profile()
#: The readings' minimum ("core") profile: canonical NHD/HND caches, dense 3-D IO, F16/BF16/F32,
#: PACKED tables, no scales. Single-rule cases start from it so that a provider's optional
#: UNSUPPORTED answers cannot hide the rule under test.
CORE = Profile(layout_kinds=("nhd", "hnd"), io_kinds=("dense",), four_d=False, cache_dtypes=BASELINE_DTYPES,
               formats=(TableFormat.PACKED,), scales=("none",))



def profile_for(features) -> Profile:
    """The profile of VALID cases that use only ``features`` (``outcomes.OPTIONAL_FEATURES``
    names; the provider's core layout "nhd" or "hnd" among them) beyond required behaviour:
    F16/BF16/F32 caches, IO of the cache's dtype, dense 3-D IO, canonical strides, PACKED
    tables, S32/S64 metadata, invalid slots. Scales are always drawn: a non-FP8 cache must
    ignore them (required)."""
    f = set(features)
    canon = [k for k in ("nhd", "hnd", "hnd_packed") if k in f]
    if "custom_layout" in f:
        canon.append("custom")
    kinds = list(canon)
    if "noncanonical_strides" in f:
        kinds += [k for k, need in (("nhd_padded", {"nhd"}), ("hnd_padded", {"hnd"}), ("vllm_v", {"hnd"}),
                                    ("permuted", {"nhd", "hnd"})) if need <= f]
    if not kinds:
        raise ValueError("profile_for needs at least one of the core layouts 'nhd' / 'hnd'")
    return Profile(
        layout_kinds=tuple(kinds),
        io_kinds=("dense", "padded", "permuted") if "io_strides" in f else ("dense",),
        four_d="gather_4d" in f,
        cache_dtypes=CACHE_DTYPES if "fp8" in f else BASELINE_DTYPES,
        formats=tuple(x for x, need in ((TableFormat.PACKED, None), (TableFormat.RAGGED, "ragged"),
                                        (TableFormat.KV_OFFSETS, "kv_offsets")) if need is None or need in f),
        mixed_kv="mixed_layouts" in f,
        mixed_io="mixed_io_dtype" in f,
        noncanonical="noncanonical_strides" in f,
        secondary="secondary_pool" in f,
    )


_profile: contextvars.ContextVar[Profile] = contextvars.ContextVar("kvx_generator_profile", default=FULL)


@contextlib.contextmanager
def using_profile(profile: Profile) -> Iterator[Profile]:
    """Unconstrained choices of the generators draw from ``profile`` inside the block."""
    token = _profile.set(profile)
    try:
        yield profile
    finally:
        _profile.reset(token)


# ----------------------------------------------------------------------------
# Values


def random_finite(rng: np.random.Generator, dtype: DType, n: int) -> np.ndarray:
    """``n`` random bit patterns of ``dtype`` that are finite and non-zero."""
    npdt = np_dtype(dtype)
    bits_dt = BITS_DTYPE[npdt.itemsize]
    out = rng.integers(0, 1 << (8 * npdt.itemsize), size=n, dtype=np.uint64).astype(bits_dt)
    for _ in range(64):
        f = out.view(npdt).astype(np.float32)
        bad = ~np.isfinite(f) | (f == 0)
        if not bad.any():
            break
        out[bad] = rng.integers(0, 1 << (8 * npdt.itemsize), size=int(bad.sum()), dtype=np.uint64).astype(bits_dt)
    else:  # pragma: no cover - probability ~0
        raise RuntimeError("could not draw finite values")
    return out.view(npdt)


def _from_f32(x32: np.ndarray, dtype: DType) -> np.ndarray:
    """FP32 values to ``dtype`` storage (RNE; FP8 clamped to its range first)."""
    if dtype in FP8_DTYPES:
        import ml_dtypes

        m = np.float32(ml_dtypes.finfo(np_dtype(dtype)).max)
        x32 = np.clip(x32, -m, m)
    with np.errstate(over="ignore"):
        return np.asarray(x32, np.float32).astype(np_dtype(dtype))


def tie_values(rng: np.random.Generator, target: DType, n: int) -> np.ndarray:
    """FP32 midpoints between adjacent finite values of ``target`` (round-to-even ties)."""
    npdt = np_dtype(target)
    bits_dt = BITS_DTYPE[npdt.itemsize]
    a = random_finite(rng, target, n).view(bits_dt).copy()
    sign_bit = bits_dt.type(1 << (8 * npdt.itemsize - 1))
    a &= ~sign_bit  # magnitude
    b = a + bits_dt.type(1)
    lo, hi = a.view(npdt).astype(np.float32), b.view(npdt).astype(np.float32)
    ok = np.isfinite(hi)
    mid = np.where(ok, lo + (hi - lo) / np.float32(2), lo).astype(np.float32)
    return np.where(rng.random(n) < 0.5, -mid, mid).astype(np.float32)


def random_values(
    rng: np.random.Generator, dtype: DType, n: int, mode: str = "bits", target: DType | None = None,
    scale: float = 1.0,
) -> np.ndarray:
    """Storage of ``dtype``: random bits, scaled normals, or ties of ``target`` (times ``scale``)."""
    if mode == "bits":
        return random_finite(rng, dtype, n)
    if mode == "normal":
        x = rng.standard_normal(n) * 2.0 ** rng.uniform(-6, 8)
        return _from_f32(x.astype(np.float32), dtype)
    if mode == "ties":
        with np.errstate(over="ignore"):
            t = tie_values(rng, target or dtype, n) * np.float32(scale)
        return _from_f32(t, dtype)
    raise ValueError(f"unknown value mode {mode!r}")


def poisoned(dtype: DType, n: int) -> np.ndarray:
    return np.full(n * np_dtype(dtype).itemsize, POISON_BYTE, np.uint8).view(np_dtype(dtype))


# ----------------------------------------------------------------------------
# Geometry and layouts


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


# ----------------------------------------------------------------------------
# Write cases


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
    scales: str | None = None,  # "none", "tensor_ptr", "per_tensor", "per_head", "both"
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


# ----------------------------------------------------------------------------
# Gather cases


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


# ----------------------------------------------------------------------------
# Single-rule violations


@dataclass
class Violation:
    """A case that breaks exactly ``rule``; the provider must answer ``status``."""

    case: WriteCase | GatherCase | ValidateCase
    rule: str
    status: Status
    clause: str


@dataclass(frozen=True)
class RuleCase:
    clause: str
    status: Status
    builder: Callable[[np.random.Generator], WriteCase | GatherCase | ValidateCase]


def _with(case, mapping: dict):
    """The case with these C overrides added (``cases.COverrides`` paths)."""
    new = dict(case.c_overrides)
    new.update(mapping)
    return dataclasses.replace(case, c_overrides=new)


def _any_call(rng, *, gather_formats=(TableFormat.PACKED, TableFormat.RAGGED, TableFormat.KV_OFFSETS), write_kw=None,
              gather_kw=None, calls=("validate", "write", "gather")):
    call = _pick(rng, calls)
    if call == "validate":
        return random_validate_case(rng)
    if call == "write":
        return random_write_case(rng, **(write_kw or {}))
    gather_kw = dict(gather_kw or {})
    if "fmt" not in gather_kw:
        fmts = [f for f in gather_formats if f in _profile.get().formats] or list(gather_formats)
        gather_kw["fmt"] = _pick(rng, fmts)
    return random_gather_case(rng, **gather_kw)


_TENSOR_DIM = {  # index of each logical dimension in the shape of a layout
    Layout.BLOCK_NHD: {"b": 0, "t": 1, "h": 2, "d": 3},
    Layout.BLOCK_CUSTOM: {"b": 0, "t": 1, "h": 2, "d": 3},
    Layout.BLOCK_HND: {"b": 0, "h": 1, "t": 2, "d": 3},
    Layout.BLOCK_HND_PACKED: {"b": 0, "h": 1, "d": 2, "t": 3},
}


def _zero_geometry(field: str, dim: str):
    def build(rng):
        calls = ("validate", "write", "gather")
        case = _any_call(rng, gather_formats=(TableFormat.PACKED, TableFormat.RAGGED),
                         write_kw={"scales": "none"}, calls=calls)
        ov = {f"cache.{field}": 0}
        for side in ("k", "v"):
            t = getattr(case.cache, side)
            ov[f"cache.{side}.shape[{_TENSOR_DIM[t.layout][dim]}]"] = 0
        if dim in ("h", "d") and not isinstance(case, ValidateCase):
            io_field = "num_kv_heads" if dim == "h" else "head_dim"
            ov[f"desc.io.{io_field}"] = 0
            for t_name in ("key", "value"):
                io_t = case.key_layout if isinstance(case, WriteCase) and t_name == "key" else (
                    case.value_layout if isinstance(case, WriteCase) else case.out_layout)
                idx = (len(io_t.shape) - 2) if dim == "h" else (len(io_t.shape) - 1)
                ov[f"desc.io.{t_name}.shape[{idx}]"] = 0
        return _with(case, ov)
    return build


def _size(path: str, calls):
    def build(rng):
        if path == "cache.pool":
            case = random_gather_case(rng, fmt=TableFormat.KV_OFFSETS)
        else:
            case = _any_call(rng, calls=calls)
        struct = {
            "cache": "kvx_cache_desc_t", "cache.k": "kvx_tensor_desc_t", "cache.v": "kvx_tensor_desc_t",
            "cache.pool": "kvx_pool_desc_t", "desc.io": "kvx_kv_io_desc_t", "desc.io.key": "kvx_tensor_desc_t",
            "desc.io.value": "kvx_tensor_desc_t", "desc.slots": "kvx_slot_mapping_t",
            "desc.k_scale_desc": "kvx_scale_desc_t", "desc.v_scale_desc": "kvx_scale_desc_t",
            "desc.block_table": "kvx_block_table_t", "desc.seq_lens": "kvx_seq_lens_t",
        }.get(path) or ("kvx_write_desc_t" if isinstance(case, WriteCase) else "kvx_gather_desc_t")
        full = abi.V1_1_SIZES[struct]
        small = _pick(rng, [0, full - 1, full // 2, 4, full - 8])
        return _with(case, {f"{path}.size": int(small)})
    return build


def _tensor_rule(mutate, calls=("validate", "write", "gather"), gather_formats=None, **gen_kw):
    """A cache-tensor rule: ``mutate(rng, case, side, tensor) -> overrides`` on k or v."""
    def build(rng):
        fmts = gather_formats or (TableFormat.PACKED, TableFormat.RAGGED, TableFormat.KV_OFFSETS)
        for _ in range(100):
            case = _any_call(rng, calls=calls, gather_formats=fmts, write_kw=gen_kw.get("write_kw"),
                             gather_kw=gen_kw.get("gather_kw"))
            side = _pick(rng, ("k", "v"))
            ov = mutate(rng, case, side, getattr(case.cache, side))
            if ov is not None:
                return _with(case, ov)
        raise RuntimeError("no case fits this rule")
    return build


def _m_dtype(rng, case, side, t):
    return {f"cache.{side}.dtype": int(_pick(rng, [0, 6, 7, 8, 9, 10, 99]))}


def _m_layout(rng, case, side, t):
    return {f"cache.{side}.layout": int(_pick(rng, [0, 4, 7, 14, 99]))}


def _m_ndim(rng, case, side, t):
    return {f"cache.{side}.ndim": int(_pick(rng, [n for n in range(0, 8) if n != len(t.shape)]))}


def _m_pack_zero(rng, case, side, t):
    if t.layout != Layout.BLOCK_HND_PACKED:
        return None
    return {f"cache.{side}.shape[4]": int(_pick(rng, [0, -1, -4]))}


def _m_pack_divides(rng, case, side, t):
    if t.layout != Layout.BLOCK_HND_PACKED:
        return None
    D = case.cache.geom.head_dim
    bad = int(_pick(rng, [p for p in (3, 5, 6, 7, 32, 64, D + 1) if D % p]))
    # shape[2] = D // pack as a provider skipping the divisibility rule would expect it
    return {f"cache.{side}.shape[4]": bad, f"cache.{side}.shape[2]": D // bad}


def _m_shape(rng, case, side, t):
    i = int(rng.integers(4))  # never shape[4] (the pack of HND_PACKED)
    return {f"cache.{side}.shape[{i}]": int(t.shape[i]) + int(rng.integers(1, 4))}


def _m_data_null(rng, case, side, t):
    return {f"cache.{side}.data": None}


def _m_memory_invalid(rng, case, side, t):
    bad = int(_pick(rng, [0, 4, 7, 99]))
    ov = {"cache.k.memory": bad, "cache.v.memory": bad}
    if not isinstance(case, ValidateCase):
        ov.update({"desc.io.key.memory": bad, "desc.io.value.memory": bad})
    return ov


def _m_memory_mismatch(rng, case, side, t):
    return {f"cache.{side}.memory": int(_pick(rng, [abi.Memory.DEVICE, abi.Memory.UNIFIED]))} if side == "v" else None


def _m_stride_zero(rng, case, side, t):
    dims = [i for i, n in enumerate(t.shape) if n > 1]
    if not dims:
        return None
    return {f"cache.{side}.stride[{int(_pick(rng, dims))}]": 0}


def _m_overflow(rng, case, side, t):
    dims = [i for i, n in enumerate(t.shape) if n >= 3]
    if not dims:
        return None
    return {f"cache.{side}.stride[{int(_pick(rng, dims))}]": 1 << 62}


def _m_stride_negative(rng, case, side, t):
    i = int(rng.integers(len(t.shape)))
    return {f"cache.{side}.stride[{i}]": -max(1, abs(int(t.stride[i])))}


def _io_rule(mutate, calls=("write", "gather"), **gen_kw):
    """An IO-tensor rule: ``mutate(rng, case, name, layout) -> overrides`` on io.key or io.value."""
    def build(rng):
        for _ in range(100):
            call = _pick(rng, calls)
            case = random_write_case(rng, **gen_kw.get("write_kw", {})) if call == "write" else \
                random_gather_case(rng, **gen_kw.get("gather_kw", {}))
            name = _pick(rng, ("key", "value"))
            layout = (case.key_layout if name == "key" else case.value_layout) if call == "write" else case.out_layout
            ov = mutate(rng, case, name, layout)
            if ov is not None:
                return _with(case, ov)
        raise RuntimeError("no case fits this rule")
    return build


def _m_io_heads(field: str, dim_from_end: int):
    def mutate(rng, case, name, layout):
        g = case.cache.geom
        new = getattr(g, field) + int(rng.integers(1, 3))
        ov = {f"desc.io.{field}": new}
        tensors = [("key", case.key_layout), ("value", case.value_layout)] if isinstance(case, WriteCase) else \
            [("key", case.out_layout), ("value", case.out_layout)]
        for nm, lay in tensors:
            ov[f"desc.io.{nm}.shape[{len(lay.shape) - dim_from_end}]"] = new
        return ov
    return mutate


def _m_io_dtype(rng, case, name, layout):
    return {f"desc.io.{name}.dtype": int(_pick(rng, [0, 6, 7, 8, 10, 77]))}


def _m_io_memory(rng, case, name, layout):
    return {f"desc.io.{name}.memory": int(_pick(rng, [0, abi.Memory.DEVICE, abi.Memory.UNIFIED, 9]))}


def _m_io_data_null(rng, case, name, layout):
    return {f"desc.io.{name}.data": None} if case.num_tokens > 0 else None


def _m_io_ndim(rng, case, name, layout):
    bad = [1, 2, 5] if isinstance(case, GatherCase) else [1, 2, 4, 5]
    return {f"desc.io.{name}.ndim": int(_pick(rng, bad))}


def _m_io_shape(rng, case, name, layout):
    i = int(rng.integers(len(layout.shape)))
    return {f"desc.io.{name}.shape[{i}]": int(layout.shape[i]) + int(rng.integers(1, 3))}


def _m_io_overflow(rng, case, name, layout):
    if min(layout.shape) <= 0:
        return None  # an empty tensor has no farthest element
    dims = [i for i, n in enumerate(layout.shape) if n >= 3]
    return {f"desc.io.{name}.stride[{int(_pick(rng, dims))}]": 1 << 62} if dims else None


def _m_io_stride_negative(rng, case, name, layout):
    dims = [i for i, n in enumerate(layout.shape) if n > 1] or [0]
    i = int(_pick(rng, dims))
    return {f"desc.io.{name}.stride[{i}]": -max(1, abs(int(layout.stride[i])))}


def _write(mutate, **gen_kw):
    def build(rng):
        for _ in range(100):
            case = random_write_case(rng, **gen_kw)
            ov = mutate(rng, case)
            if ov is not None:
                return _with(case, ov) if isinstance(ov, dict) else ov
        raise RuntimeError("no case fits this rule")
    return build


def _gather(mutate, **gen_kw):
    def build(rng):
        for _ in range(100):
            kw = {k: (v(rng) if callable(v) else v) for k, v in gen_kw.items()}
            case = random_gather_case(rng, **kw)
            ov = mutate(rng, case)
            if ov is not None:
                return _with(case, ov) if isinstance(ov, dict) else ov
        raise RuntimeError("no case fits this rule")
    return build


def _fp8_write(rng, scales):
    fp8 = _pick(rng, FP8_DTYPES)
    return random_write_case(rng, k_dtype=fp8, v_dtype=fp8, key_dtype=_pick(rng, BASELINE_DTYPES),
                             value_dtype=_pick(rng, BASELINE_DTYPES), scales=scales)


def _scale_rule(scales, mutate):
    def build(rng):
        case = _fp8_write(rng, scales)
        side = _pick(rng, ("k", "v"))
        return _with(case, mutate(rng, case, side))
    return build


def _slot_oor(rng, case):
    if case.num_tokens == 0:
        return None
    g = case.cache.geom
    slots = np.array(case.slots.slots, np.int64).copy()
    hi = INT32_MAX if case.slots.dtype == DType.S32 else (1 << 40)
    choices = [g.num_slots, g.num_slots + int(rng.integers(1, 100)), hi]
    bad = [c for c in choices if c != case.slots.invalid_slot]
    slots[int(rng.integers(len(slots)))] = int(_pick(rng, bad))
    return dataclasses.replace(case, slots=dataclasses.replace(case.slots, slots=slots))


def _used_entry(rng, case):
    """(s, j) of a logical block some sequence uses."""
    n = np.minimum(np.asarray(case.seq_lens.lengths, np.int64), case.max_seq_len)
    need = -(-n // case.cache.geom.block_size)
    s = int(_pick(rng, np.nonzero(need > 0)[0]))
    return s, int(rng.integers(need[s]))


def _packed_bad_id(rng, case):
    s, j = _used_entry(rng, case)
    t = case.table
    idx = np.array(t.indices, np.int64).copy()
    nb = case.cache.geom.num_blocks
    idx[s * t.max_blocks_per_seq + j] = int(_pick(rng, [-1, nb, nb + 7, INT32_MAX]))
    return dataclasses.replace(case, table=dataclasses.replace(t, indices=idx))


def _ragged_lists(t: BlockTable) -> list[np.ndarray]:
    ip = np.asarray(t.indptr, np.int64)
    return [np.asarray(t.indices[ip[s]:ip[s + 1]], np.int64) for s in range(t.seq_count)]


def _ragged_bad_id(rng, case):
    n = np.minimum(np.asarray(case.seq_lens.lengths, np.int64), case.max_seq_len)
    s = int(_pick(rng, np.nonzero(n > 0)[0]))
    t = case.table
    idx = np.array(t.indices, np.int64).copy()
    nb = case.cache.geom.num_blocks
    idx[int(t.indptr[s]) + int(rng.integers(n[s]))] = int(_pick(rng, [-1, nb, nb + 3, INT32_MAX]))
    return dataclasses.replace(case, table=dataclasses.replace(t, indices=idx))


def _ragged_short_range(rng, case):
    n = np.minimum(np.asarray(case.seq_lens.lengths, np.int64), case.max_seq_len)
    s = int(_pick(rng, np.nonzero(n > 0)[0]))
    t = case.table
    lists = _ragged_lists(t)
    lists[s] = lists[s][: int(n[s]) - 1]
    bt = BlockTable.ragged(lists, t.max_blocks_per_seq, index_dtype=t.index_dtype, indptr_dtype=t.indptr_dtype)
    return dataclasses.replace(case, table=bt)


def _ragged_indptr(kind):
    def mutate(rng, case):
        t = case.table
        ip = np.array(t.indptr, np.int64).copy()
        idx = np.asarray(t.indices, np.int64)
        if kind == "first":
            ip[0] = int(_pick(rng, [-1, -5, INT32_MIN]))
        elif kind == "monotonic":
            k = int(rng.integers(t.seq_count))
            ip[k] = ip[k + 1] + int(rng.integers(1, 4))
        else:  # last: the buffer holds one more (or one fewer) index than indptr[seq_count] says
            if rng.random() < 0.5 or len(idx) == 0 or ip[-1] == ip[-2]:
                idx = np.concatenate([idx, [0]])
            else:
                idx = idx[:-1]
        return dataclasses.replace(case, table=dataclasses.replace(t, indptr=ip, indices=idx))
    return mutate


def _negative_length(rng, case):
    lens = np.array(case.seq_lens.lengths, np.int64).copy()
    lo = INT32_MIN if case.seq_lens.dtype == DType.S32 else -(1 << 40)
    lens[int(rng.integers(len(lens)))] = int(_pick(rng, [-1, -2, lo]))
    return dataclasses.replace(case, seq_lens=dataclasses.replace(case.seq_lens, lengths=lens))


def _max_blocks(rng):
    fmt = _pick(rng, (TableFormat.PACKED, TableFormat.RAGGED, TableFormat.KV_OFFSETS))
    bs = int(_pick(rng, (1, 2, 4) if fmt == TableFormat.KV_OFFSETS else (1, 2, 3, 4)))
    mb = int(rng.integers(0, 4))
    msl = mb * bs + int(rng.integers(1, 6))
    S = int(rng.integers(1, 4))
    lens = [int(rng.integers(0, mb * bs + 1)) for _ in range(S)]
    lens[int(rng.integers(S))] = int(rng.integers(mb * bs + 1, msl + 50))
    geom = random_geometry(rng, block_size=bs)
    case = random_gather_case(rng, fmt=fmt, geom=geom, max_seq_len=msl, lengths=lens, max_blocks_per_seq=mb,
                              seq_count=S)
    return case


def _kvo_entry(rng, case, value):
    s, j = _used_entry(rng, case)
    t = case.table
    beam, kv = int(rng.integers(t.beam_width)), int(rng.integers(2))
    idx = np.array(t.indices, np.int64).copy()
    idx[((s * t.beam_width + beam) * 2 + kv) * t.max_blocks_per_seq + j] = value
    return dataclasses.replace(case, table=dataclasses.replace(t, indices=idx))


def _kvo_secondary_null(rng, case):
    case = _kvo_entry(rng, case, SECONDARY_BIT | int(rng.integers(0, 2)))
    pool = case.cache.pool
    pool = dataclasses.replace(pool, secondary_null=True) if pool.secondary is not None and rng.random() < 0.5 else \
        dataclasses.replace(pool, secondary=None)
    return dataclasses.replace(case, cache=dataclasses.replace(case.cache, pool=pool))


def _kvo_pow2(rng):
    geom = random_geometry(rng, block_size=int(_pick(rng, (3, 5, 6, 7, 12))))
    return random_gather_case(rng, fmt=TableFormat.KV_OFFSETS, geom=geom)


def _kv_dtype_mismatch(rng):
    k, v = rng.permutation(np.array([int(x) for x in BASELINE_DTYPES]))[:2]
    return random_gather_case(rng, fmt=TableFormat.KV_OFFSETS, k_dtype=DType(int(k)), v_dtype=DType(int(v)))


def _fp8_io_case(rng):
    if rng.random() < 0.5:
        k = _pick(rng, BASELINE_DTYPES)
        return random_write_case(rng, k_dtype=k, key_dtype=_pick(rng, FP8_DTYPES), value_dtype=None,
                                 v_dtype=_pick(rng, BASELINE_DTYPES))
    return random_gather_case(rng, k_dtype=_pick(rng, BASELINE_DTYPES), v_dtype=None, out_dtype=_pick(rng, FP8_DTYPES))


def _fp8_cache_gather(rng):
    fp8 = _pick(rng, FP8_DTYPES)
    return random_gather_case(rng, k_dtype=fp8, v_dtype=fp8, out_dtype=_pick(rng, BASELINE_DTYPES))


_ANY = ("validate", "write", "gather")
_CALL = ("write", "gather")
_PACKED = {"fmt": TableFormat.PACKED}
_RAGGED = {"fmt": TableFormat.RAGGED}
_KVO = {"fmt": TableFormat.KV_OFFSETS}
_INV, _UNS, _OOR = Status.INVALID_ARGUMENT, Status.UNSUPPORTED, Status.OUT_OF_RANGE

#: rule id -> (clause, expected status, builder). The statuses restate docs/spec-readings.md
#: independently of the oracle's catalog (tests hold the two against each other).
RULES: dict[str, RuleCase] = {
    # step 1
    "R-SIZE.null_cache": RuleCase("spec 7; R-ORDER", _INV, lambda rng: _with(_any_call(rng), {"cache": None})),
    "R-SIZE.null_desc": RuleCase("spec 7; R-ORDER", _INV, lambda rng: _with(_any_call(rng, calls=_CALL), {"desc": None})),
    **{
        f"R-SIZE.{p}": RuleCase("spec 3, 6; R-SIZE", _INV, _size(p, calls))
        for p, calls in (
            ("cache", _ANY), ("cache.k", _ANY), ("cache.v", _ANY), ("cache.pool", ("gather",)), ("desc", _CALL),
            ("desc.io", _CALL), ("desc.io.key", _CALL), ("desc.io.value", _CALL), ("desc.slots", ("write",)),
            ("desc.k_scale_desc", ("write",)), ("desc.v_scale_desc", ("write",)), ("desc.block_table", ("gather",)),
            ("desc.seq_lens", ("gather",)),
        )
    },
    # step 2
    "7.1.num_blocks_zero": RuleCase("spec 7.1", _INV, _zero_geometry("num_blocks", "b")),
    "7.1.block_size_zero": RuleCase("spec 7.1", _INV, _zero_geometry("block_size", "t")),
    "7.1.num_kv_heads_zero": RuleCase("spec 7.1", _INV, _zero_geometry("num_kv_heads", "h")),
    "7.1.head_dim_zero": RuleCase("spec 7.1", _INV, _zero_geometry("head_dim", "d")),
    "R-CACHE.dtype": RuleCase("spec 4.3; R-CACHE", _INV,
                              _tensor_rule(_m_dtype, gather_formats=(TableFormat.PACKED, TableFormat.RAGGED),
                                           write_kw={"scales": "none"})),
    "R-CACHE.layout": RuleCase("spec 4.2; R-CACHE", _INV, _tensor_rule(_m_layout)),
    "R-CACHE.ndim": RuleCase("spec 4.2; R-CACHE", _INV, _tensor_rule(_m_ndim)),
    "R-CACHE.pack_zero": RuleCase("spec 4.2; R-CACHE", _INV, _tensor_rule(
        _m_pack_zero, write_kw={"k_kind": "hnd_packed", "v_kind": "hnd_packed"},
        gather_kw={"k_kind": "hnd_packed", "v_kind": "hnd_packed"})),
    "7.1.hnd_packed_pack_divides": RuleCase("spec 7.1", _INV, _tensor_rule(
        _m_pack_divides, write_kw={"k_kind": "hnd_packed", "v_kind": "hnd_packed"},
        gather_kw={"k_kind": "hnd_packed", "v_kind": "hnd_packed"})),
    "R-CACHE.shape": RuleCase("spec 4.2; R-CACHE", _INV, _tensor_rule(_m_shape)),
    "R-CACHE.data_null": RuleCase("spec 6.2; R-CACHE", _INV, _tensor_rule(_m_data_null)),
    "R-CACHE.memory_invalid": RuleCase("spec 6.2; R-CACHE", _INV, _tensor_rule(_m_memory_invalid)),
    "R-CACHE.memory_mismatch": RuleCase("spec 6.2; R-CACHE", _INV, _tensor_rule(_m_memory_mismatch)),
    "R-CACHE.stride_zero": RuleCase("spec 4.2; R-CACHE", _INV, _tensor_rule(_m_stride_zero)),
    "R-CACHE.offset_overflow": RuleCase("spec 4.2; R-CACHE", _INV, _tensor_rule(_m_overflow)),
    "R-CACHE.stride_negative": RuleCase("spec 4.2; R-STRIDE-NEG", _UNS, _tensor_rule(_m_stride_negative)),
    # step 3: io
    "R-IO.num_kv_heads": RuleCase("spec 6.8, 7; R-IO", _INV, _io_rule(
        _m_io_heads("num_kv_heads", 2), write_kw={"scales": "none"}, gather_kw={"fmt": TableFormat.PACKED})),
    "R-IO.head_dim": RuleCase("spec 6.8, 7; R-IO", _INV, _io_rule(_m_io_heads("head_dim", 1))),
    "R-IO.dtype": RuleCase("spec 6.8; R-IO", _INV, _io_rule(_m_io_dtype)),
    "R-IO.memory": RuleCase("spec 6.8; R-IO", _INV, _io_rule(_m_io_memory)),
    "R-IO.data_null": RuleCase("spec 6.8; R-IO", _INV, _io_rule(_m_io_data_null)),
    "R-IO.ndim": RuleCase("spec 6.8; R-IO", _INV, _io_rule(_m_io_ndim)),
    "R-IO.shape": RuleCase("spec 6.8; R-IO", _INV, _io_rule(_m_io_shape)),
    "R-IO.offset_overflow": RuleCase("spec 6.8; R-IO", _INV, _io_rule(_m_io_overflow)),
    "R-IO.stride_negative": RuleCase("spec 6.8; R-IO", _UNS, _io_rule(_m_io_stride_negative)),
    "R-CONVERT.fp8_io": RuleCase("spec 4.3; R-CONVERT", _UNS, _fp8_io_case),
    "R-CONVERT.fp8_cache_gather": RuleCase("spec 4.3; R-CONVERT", _UNS, _fp8_cache_gather),
    # step 3: write
    "R-WRITE.token_count": RuleCase("spec 5.2, 7; R-WRITE", _INV, _write(
        lambda rng, c: {"desc.slots.token_count": c.num_tokens + 1 if c.num_tokens == 0 or rng.random() < 0.5
                        else c.num_tokens - 1})),
    "R-WRITE.slot_dtype": RuleCase("spec 5.2; R-WRITE", _INV, _write(
        lambda rng, c: {"desc.slots.dtype": int(_pick(rng, [0, 1, 3, 8, 9, 10, 42]))})),
    "R-WRITE.slots_null": RuleCase("spec 6.4; R-WRITE", _INV, _write(
        lambda rng, c: {"desc.slots.slots": None} if c.num_tokens else None)),
    "R-FP8.scale_dtype": RuleCase("spec 6.9; R-FP8", _INV, _scale_rule(
        "per_tensor", lambda rng, c, s: {f"desc.{s}_scale_desc.dtype": int(_pick(rng, [0, 1, 2, 6, 7]))})),
    "R-FP8.scale_granularity": RuleCase("spec 6.6; R-FP8", _INV, _scale_rule(
        "per_tensor", lambda rng, c, s: {f"desc.{s}_scale_desc.granularity": int(_pick(rng, [0, 5, 99]))})),
    "R-FP8.per_head_shape": RuleCase("spec 6.6; R-FP8", _INV, _scale_rule(
        "per_head", lambda rng, c, s: _pick(rng, [
            {f"desc.{s}_scale_desc.shape[0]": c.cache.geom.num_kv_heads + 1},
            {f"desc.{s}_scale_desc.ndim": 2, f"desc.{s}_scale_desc.shape[1]": 1},
            {f"desc.{s}_scale_desc.ndim": 0}]))),
    "R-FP8.per_block_unsupported": RuleCase("spec 6.6; R-FP8", _UNS, _scale_rule(
        "per_tensor",
        lambda rng, c, s: {f"desc.{s}_scale_desc.granularity": int(_pick(rng, [2, 4]))})),
    # step 3: gather
    "R-GATHER.format": RuleCase("spec 5.1; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.block_table.format": int(_pick(rng, [0, 4, 99]))})),
    "R-GATHER.num_tokens": RuleCase("spec 6.10; R-GATHER", _INV, _gather(
        lambda rng, c: _num_tokens_off(rng, c))),
    "R-GATHER.seq_count_match": RuleCase("spec 5.3, 7", _INV, _gather(
        lambda rng, c: {"desc.seq_lens.seq_count": c.table.seq_count + int(rng.integers(1, 3))},
        seq_count=lambda rng: int(rng.integers(1, 4)))),
    "R-GATHER.seq_lens_dtype": RuleCase("spec 5.3; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.seq_lens.dtype": int(_pick(rng, [0, 1, 3, 8, 9, 10]))})),
    "R-GATHER.lengths_null": RuleCase("spec 6.5; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.seq_lens.lengths": None}, seq_count=lambda rng: int(rng.integers(1, 4)))),
    "R-GATHER.indices_null": RuleCase("spec 6.3; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.block_table.indices": None} if c.table.n_indices else None)),
    "7.1.index_dtype": RuleCase("spec 7.1", _INV, _gather(
        lambda rng, c: {"desc.block_table.index_dtype": int(_pick(rng, [0, 1, 3, 8, 9, 10]))},
        fmt=lambda rng: _pick(rng, (TableFormat.PACKED, TableFormat.RAGGED)))),
    "7.1.packed_indices_count": RuleCase("spec 5.1, 7.1", _INV, _gather(
        lambda rng, c: {"desc.block_table.indices_count": c.table.n_indices + int(_pick(rng, [1, 2, -1]))}
        if c.table.n_indices else None, **_PACKED)),
    "R-GATHER.packed_indptr_count": RuleCase("spec 5.1, 7.1", _INV, _gather(
        lambda rng, c: {"desc.block_table.indptr_count": c.table.seq_count + 1}, **_PACKED)),
    "R-GATHER.packed_beam_width": RuleCase("spec 5.1; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.block_table.beam_width": int(_pick(rng, [0, 2, 4]))}, **_PACKED)),
    "R-GATHER.ragged_indptr_dtype": RuleCase("spec 6.3; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.block_table.indptr_dtype": int(_pick(rng, [0, 1, 3, 8, 9]))}, **_RAGGED)),
    "R-GATHER.ragged_indptr_null": RuleCase("spec 5.1; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.block_table.indptr": None}, **_RAGGED)),
    "R-GATHER.ragged_indptr_count": RuleCase("spec 5.1, 7.1", _INV, _gather(
        lambda rng, c: {"desc.block_table.indptr_count": int(_pick(rng, [0, c.table.seq_count, c.table.seq_count + 2]))},
        **_RAGGED)),
    "R-GATHER.ragged_beam_width": RuleCase("spec 5.1; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.block_table.beam_width": int(_pick(rng, [0, 2, 3]))}, **_RAGGED)),
    "7.1.kv_offsets_index_dtype": RuleCase("spec 5.1, 7.1", _INV, _gather(
        lambda rng, c: {"desc.block_table.index_dtype": int(_pick(rng, [0, 7, 8, 9]))}, **_KVO)),
    "R-GATHER.kv_offsets_flag": RuleCase("spec 5.1; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.block_table.flags": int(_pick(rng, [0, 2, 6]))}, **_KVO)),
    "7.1.kv_offsets_pow2": RuleCase("spec 5.1, 7.1", _INV, _kvo_pow2),
    "R-GATHER.kv_offsets_beam_width": RuleCase("spec 5.1; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.block_table.beam_width": 0}, seq_count=0, **_KVO)),
    "7.1.kv_offsets_indices_count": RuleCase("spec 5.1, 7.1", _INV, _gather(
        lambda rng, c: {"desc.block_table.indices_count": c.table.n_indices + int(_pick(rng, [1, 2, -1]))}
        if c.table.n_indices else None, **_KVO)),
    "R-GATHER.kv_offsets_indptr_count": RuleCase("spec 5.1, 7.1", _INV, _gather(
        lambda rng, c: {"desc.block_table.indptr_count": int(_pick(rng, [1, c.table.seq_count + 1]))}, **_KVO)),
    "R-GATHER.pool_primary_null": RuleCase("spec 6.7; R-GATHER", _INV, _gather(
        lambda rng, c: {"cache.pool.primary": None}, **_KVO)),
    "R-GATHER.pool_bytes_per_block": RuleCase("spec 6.7; R-GATHER", _INV, _gather(
        lambda rng, c: {"cache.pool.bytes_per_block": int(_pick(rng, [0, c.cache.pool.bytes_per_block + 1,
                                                                      2 * c.cache.pool.bytes_per_block]))}, **_KVO)),
    "R-GATHER.kv_offsets_kv_dtype": RuleCase("spec 5.1; R-GATHER", _UNS, _kv_dtype_mismatch),
    # step 5
    "R-WRITE.slot_out_of_range": RuleCase("spec 5.2, 8; R-WRITE", _OOR, _write(_slot_oor)),
    "R-DATA.ragged_indptr_first": RuleCase("spec 5.1; R-DATA", _INV, _gather(
        _ragged_indptr("first"), seq_count=lambda rng: int(rng.integers(1, 4)), **_RAGGED)),
    "R-DATA.ragged_indptr_monotonic": RuleCase("spec 5.1; R-DATA", _INV, _gather(
        _ragged_indptr("monotonic"), seq_count=lambda rng: int(rng.integers(1, 4)), **_RAGGED)),
    "R-DATA.ragged_indptr_last": RuleCase("spec 5.1, 7.1; R-DATA", _INV, _gather(
        _ragged_indptr("last"), seq_count=lambda rng: int(rng.integers(1, 4)), **_RAGGED)),
    "R-DATA.negative_length": RuleCase("spec 5.3; R-DATA", _INV, _gather(
        _negative_length, seq_count=lambda rng: int(rng.integers(1, 4)))),
    "R-DATA.max_blocks": RuleCase("spec 5.1, 6.10; R-DATA", _OOR, _max_blocks),
    "R-DATA.packed_block_id": RuleCase("spec 5.1, 8; R-DATA", _OOR, _gather(_packed_bad_id, min_tokens=1, **_PACKED)),
    "R-DATA.ragged_seq_range": RuleCase("spec 5.1; R-DATA", _OOR, _gather(_ragged_short_range, min_tokens=1, **_RAGGED)),
    "R-DATA.ragged_block_id": RuleCase("spec 5.1, 8; R-DATA", _OOR, _gather(_ragged_bad_id, min_tokens=1, **_RAGGED)),
    "R-DATA.kv_offsets_null_index": RuleCase("spec 5.1; R-DATA", _OOR, _gather(
        lambda rng, c: _kvo_entry(rng, c, NULL_INDEX), min_tokens=1, **_KVO)),
    "R-DATA.kv_offsets_secondary_null": RuleCase("spec 5.1, 10; R-DATA", _OOR, _gather(
        _kvo_secondary_null, min_tokens=1, **_KVO)),
}


def _num_tokens_off(rng, case: GatherCase) -> dict:
    new = case.num_tokens + int(rng.integers(1, 4))
    ov = {"desc.io.num_tokens": new}
    if len(case.out_layout.shape) == 3:
        ov["desc.io.key.shape[0]"] = new
        ov["desc.io.value.shape[0]"] = new
    return ov


def random_invalid_case(
    rng: np.random.Generator, rule: str, *, seed: int | None = None, profile: Profile = CORE
) -> Violation:
    """A case breaking exactly ``rule`` (a key of ``RULES``), with its expected status.

    The case is built from ``profile`` (default: the core features) plus whatever the
    rule itself needs (an FP8 cache for the scale rules, a KV_OFFSETS table, ...).
    """
    rc = RULES[rule]
    with using_profile(profile):
        case = rc.builder(rng)
    case = dataclasses.replace(case, seed=seed, label=f"violates {rule}")
    return Violation(case, rule, rc.status, rc.clause)
