"""Spec 4.2, 6.8 (R-CACHE, R-CUSTOM, R-IO): layouts and strides.

"Implementations MUST honor provided strides": for a non-canonical stride pattern
the only acceptable answers are the correct result or UNSUPPORTED (the optional
feature ``noncanonical_strides``); writing with canonical strides is a failure (the
padding elements of every cache hold random values, so a write that lands in them is
seen). Each layout is exercised by a write (random valid and invalid slots) and by a
PACKED gather, both compared bit-exactly with the oracle.

An IO tensor's ``layout`` field is ignored (spec 6.8): any value there, 0 and values
outside the enum included, gives the normal result.
"""
from __future__ import annotations

import pytest

from kvx_conformance.abi.descriptors import Geometry, IOLayout, TensorLayout
from kvx_conformance.abi.header import DType, Layout, ScaleGranularity
from kvx_conformance.cases import build as cb
from kvx_conformance.cases.checks import verify_gather, verify_write
from kvx_conformance.results.outcomes import RECOMMENDED, REQUIRED, conformance

G = cb.GEOM
OPS = pytest.mark.parametrize("op", ["write", "gather"])
CL_STRIDES = "spec 4.2 (implementations MUST honor provided strides); R-CACHE"


def _exercise(provider, opts, k: TensorLayout, v: TensorLayout, op: str, *, clause: str, feature: str | None,
              seed: int, label: str, geom=G):
    cache = cb.make_cache(geom, k, v, seed=seed)
    if op == "write":
        slots = cb.spread_slots(geom, min(geom.num_slots - 2, 14), seed).tolist()
        slots[3:3] = [-1]
        case = cb.write_case(cache, slots, seed=seed + 1, label=label)
        verify_write(provider, case, opts, clause=clause, feature=feature)
    else:
        mb = min(3, geom.num_blocks)
        lens = [mb * geom.block_size, geom.block_size + 1, 2]
        case = cb.packed_gather(cache, cb.distinct_table(geom, 3, mb, seed), lens, mb * geom.block_size,
                                seed=seed + 1, label=label)
        verify_gather(provider, case, opts, clause=clause, feature=feature)


# ---------------------------------------------------------------------------- canonical


@conformance("layout.nhd", "spec 4.2 (BLOCK_NHD, canonical strides)", REQUIRED, "core", ("write", "gather"),
             feature="nhd")
@OPS
def test_nhd(kvx_provider, kvx_call_options, op):
    t = cb.layout(G, "nhd", DType.F16)
    _exercise(kvx_provider, kvx_call_options(), t, t, op, clause="spec 4.2", feature="nhd", seed=1, label="NHD")


@conformance("layout.hnd", "spec 4.2 (BLOCK_HND, canonical strides)", REQUIRED, "core", ("write", "gather"),
             feature="hnd")
@OPS
def test_hnd(kvx_provider, kvx_call_options, op):
    t = cb.layout(G, "hnd", DType.F16)
    _exercise(kvx_provider, kvx_call_options(), t, t, op, clause="spec 4.2", feature="hnd", seed=2, label="HND")


@conformance("layout.hnd_packed", "spec 4.2 (BLOCK_HND_PACKED, pack = shape[4])", REQUIRED, "layouts",
             ("write", "gather"), feature="hnd_packed")
@pytest.mark.parametrize("pack", [1, 2, 4, 8])
@OPS
def test_hnd_packed(kvx_provider, kvx_call_options, pack, op):
    t = cb.layout(G, "hnd_packed", DType.F16, pack=pack)
    _exercise(kvx_provider, kvx_call_options(), t, t, op, clause="spec 4.2", feature="hnd_packed", seed=3 + pack,
              label=f"HND_PACKED pack {pack}")


#: head_dim 16 (one pack group) and 32 (two): pack 16 needs head_dim a multiple of 16
PACK16_GEOMS = {"d16": Geometry(num_blocks=6, block_size=4, num_kv_heads=2, head_dim=16),
                "d32": Geometry(num_blocks=6, block_size=4, num_kv_heads=2, head_dim=32)}


@conformance("layout.hnd_packed_pack16", "spec 4.2 (BLOCK_HND_PACKED, pack = shape[4]: pack 16)", REQUIRED, "layouts",
             ("write", "gather"), feature="hnd_packed")
@pytest.mark.parametrize("geom", list(PACK16_GEOMS))
@OPS
def test_hnd_packed_pack16(kvx_provider, kvx_call_options, geom, op):
    """HND_PACKED with pack 16 (vLLM's x is 16 bytes / element size: 16 for 1-byte FP8 caches, 8 for
    F16), here in an F16 cache: a provider whose kernels stop at pack 8 (and address pack 16 with
    pack 8's offsets) fails here; ``layout.hnd_packed`` uses packs 1 to 8."""
    g = PACK16_GEOMS[geom]
    t = cb.layout(g, "hnd_packed", DType.F16, pack=16)
    _exercise(kvx_provider, kvx_call_options(), t, t, op, clause="spec 4.2", feature="hnd_packed", seed=19,
              label=f"HND_PACKED pack 16, head_dim {g.head_dim}", geom=g)


CL_PACK16_FP8 = "spec 4.2 (BLOCK_HND_PACKED, pack 16), 4.3, 6.9 (FP8 caches, scales); R-FP8"


@conformance("layout.hnd_packed_pack16_fp8", CL_PACK16_FP8, REQUIRED, "layouts", ("write", "gather"),
             feature="hnd_packed")
@pytest.mark.parametrize("dtype", [DType.F8_E4M3, DType.F8_E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("geom", list(PACK16_GEOMS))
@OPS
def test_hnd_packed_pack16_fp8(kvx_provider, kvx_call_options, geom, dtype, op):
    """vLLM's FP8 cache: HND_PACKED with pack 16 (x = 16 bytes of 1-byte elements). Writes quantize
    BF16 rows with a PER_TENSOR K scale and PER_HEAD V scales; gathers copy the FP8 bytes. The case
    uses two optional features (``hnd_packed``, ``fp8``): a refusal is excused unless both are
    claimed."""
    g = PACK16_GEOMS[geom]
    t = cb.layout(g, "hnd_packed", dtype, pack=16)
    cache = cb.make_cache(g, t, t, seed=21)
    label = f"{dtype.name} HND_PACKED pack 16, head_dim {g.head_dim}"
    opts = kvx_call_options()
    if op == "write":
        slots = cb.spread_slots(g, min(g.num_slots - 2, 14), 22).tolist()
        slots[3:3] = [-1]
        case = cb.write_case(cache, slots, seed=23, io_dtype=DType.BF16, k_scale_desc=cb.scale_spec([0.043]),
                             v_scale_desc=cb.scale_spec([0.5, 0.021], ScaleGranularity.PER_HEAD),
                             label=label + ", BF16 rows quantized with scales")
        verify_write(kvx_provider, case, opts, clause=CL_PACK16_FP8, feature=("hnd_packed", "fp8"))
    else:
        mb = min(3, g.num_blocks)
        case = cb.packed_gather(cache, cb.distinct_table(g, 3, mb, 24), [mb * g.block_size, g.block_size + 1, 2],
                                mb * g.block_size, seed=25, label=label + ", raw FP8 gather")
        verify_gather(kvx_provider, case, opts, clause=CL_PACK16_FP8, feature=("hnd_packed", "fp8"))


#: a batch of >= 32 tokens (``layout.hnd_packed`` writes 14): head_dim 16 for pack 16, 96 slots
PACKED_BATCH = Geometry(num_blocks=24, block_size=4, num_kv_heads=2, head_dim=16)
CL_PACKED_BATCH = "spec 4.2 (BLOCK_HND_PACKED, pack = shape[4]; MUST honor provided strides)"


@conformance("layout.hnd_packed_batch", CL_PACKED_BATCH + " (batches of 32+ tokens)", REQUIRED, "layouts",
             ("write", "gather"), feature="hnd_packed")
@pytest.mark.parametrize("pack", [2, 4, 8, 16])
@pytest.mark.parametrize("tokens", [32, 64, 77])
@OPS
def test_hnd_packed_batch(kvx_provider, kvx_call_options, pack, tokens, op):
    """HND_PACKED caches written and gathered ``tokens`` at a time (32, 64, 77: one invalid slot among a
    write's): a batched (vector) path that ignores the pack, addressing the cache as HND, fails here;
    ``layout.hnd_packed`` and ``layout.hnd_packed_pack16`` write 14 tokens."""
    g = PACKED_BATCH
    t = cb.layout(g, "hnd_packed", DType.F16, pack=pack)
    cache = cb.make_cache(g, t, t, seed=90 + pack)
    label = f"HND_PACKED pack {pack}, {tokens} tokens"
    opts = kvx_call_options()
    if op == "write":
        slots = cb.spread_slots(g, tokens - 1, 91 + pack).tolist()
        slots[3:3] = [-1]
        case = cb.write_case(cache, slots, seed=92 + pack, label=label)
        verify_write(kvx_provider, case, opts, clause=CL_PACKED_BATCH, feature="hnd_packed")
    else:
        mb = -(-tokens // g.block_size)
        case = cb.packed_gather(cache, cb.distinct_table(g, 2, mb, 93 + pack), [tokens, tokens // 2 + 1], tokens,
                                seed=94 + pack, label=label)
        verify_gather(kvx_provider, case, opts, clause=CL_PACKED_BATCH, feature="hnd_packed")


# ---------------------------------------------------------------------------- padded


PADDED = {
    "nhd_pad3": ("nhd", {"pad": 3}),
    "hnd_pad5": ("hnd", {"pad": 5}),
    "hnd_packed_pad2": ("hnd_packed", {"pack": 4, "pad": 2}),
    # packs of 16 bytes (F16 pack 8: one vector per pack), two per head row, token rows padded
    "hnd_packed8_pad2": ("hnd_packed", {"pack": 8, "pad": 2}),
}
#: the geometry of an entry where it is not G
PADDED_GEOM = {"hnd_packed8_pad2": Geometry(num_blocks=6, block_size=4, num_kv_heads=2, head_dim=16)}


@conformance("layout.padded_rows", CL_STRIDES, REQUIRED, "layouts", ("write", "gather"),
             feature="noncanonical_strides")
@pytest.mark.parametrize("which", list(PADDED))
@OPS
def test_padded_rows(kvx_provider, kvx_call_options, which, op):
    """Canonical strides plus padding after each innermost row. ``hnd_packed8_pad2``: packs of 16
    bytes, the unit a vectorized HND_PACKED kernel moves at once; a fast path that takes the pack
    and token strides as canonical (``stride[2] = block_size * pack``, ``stride[3] = pack``) for
    such packs writes between the padded rows."""
    kind, kw = PADDED[which]
    geom = PADDED_GEOM.get(which, G)
    t = cb.layout(geom, kind, DType.F16, **kw)
    _exercise(kvx_provider, kvx_call_options(), t, t, op, clause=CL_STRIDES, feature="noncanonical_strides",
              seed=20, label=f"{which} strides {t.stride}", geom=geom)


def _nhd_strides(token: int, block_tokens: int | None = None, head: int | None = None, g: Geometry = G):
    head = head if head is not None else g.head_dim
    block = (block_tokens or g.block_size) * token
    return (block, token, head, 1)


# ppl.nn dynamic_batching.KeyValueCache cache_layout 0-3 (seed 001), one layer of L=2,
# the K part: cache(MaxT, L, 2, H, Dh) / (L, MaxT, 2, H, Dh) / (L, 2, MaxT, H, Dh) / (L, 2, H, MaxT, Dh).
_HD = G.num_kv_heads * G.head_dim
_MAXT = G.num_slots
PPLNN = {
    "cache_layout0": (Layout.BLOCK_NHD, _nhd_strides(2 * 2 * _HD)),
    "cache_layout1": (Layout.BLOCK_NHD, _nhd_strides(2 * _HD)),
    "cache_layout2": (Layout.BLOCK_NHD, _nhd_strides(_HD)),
    "cache_layout3": (Layout.BLOCK_HND, (G.block_size * G.head_dim, _MAXT * G.head_dim, G.head_dim, 1)),
}


@conformance("layout.pplnn_views", CL_STRIDES + " (seed 001 cache_layout 0-3 views)", REQUIRED, "layouts",
             ("write", "gather"), feature="noncanonical_strides")
@pytest.mark.parametrize("which", list(PPLNN))
@OPS
def test_pplnn_views(kvx_provider, kvx_call_options, which, op):
    lay, stride = PPLNN[which]
    base = cb.layout(G, "nhd" if lay == Layout.BLOCK_NHD else "hnd", DType.F16)
    t = base.with_(stride=stride)
    _exercise(kvx_provider, kvx_call_options(), t, t, op, clause=CL_STRIDES, feature="noncanonical_strides",
              seed=30, label=f"ppl.nn {which}: {lay.name} strides {stride}")


TRANSPOSED = {
    # vLLM's V cache [blocks, H, D, block_size] described as HND
    "hnd_dim_before_token": ("hnd", (0, 1, 3, 2)),
    # NHD with heads outside tokens in memory
    "nhd_heads_outer": ("nhd", (0, 2, 1, 3)),
    # blocks innermost but one
    "nhd_blocks_inner": ("nhd", (1, 2, 0, 3)),
    # head_dim outermost
    "hnd_dim_outer": ("hnd", (3, 0, 1, 2)),
}


@conformance("layout.transposed", CL_STRIDES + " (transposed strides)", REQUIRED, "layouts", ("write", "gather"),
             feature="noncanonical_strides")
@pytest.mark.parametrize("which", list(TRANSPOSED))
@OPS
def test_transposed(kvx_provider, kvx_call_options, which, op):
    kind, order = TRANSPOSED[which]
    t = cb.layout(G, kind, DType.F16, order=order)
    _exercise(kvx_provider, kvx_call_options(), t, t, op, clause=CL_STRIDES, feature="noncanonical_strides",
              seed=40, label=f"{which} strides {t.stride}")


# A tensor walked backwards along some dimensions: those strides negative, the data pointer at their
# last index, every element inside the buffer. The reference refuses them (R-STRIDE-NEG); a provider
# that serves them must honour them (spec 4.2), so the answer is the correct result or a refusal.
NEGATIVE = {  # cache kind, dimensions of the cache walked backwards, dimensions of the IO rows
    "nhd_blocks": ("nhd", (0,), ()),
    "nhd_dim": ("nhd", (3,), ()),
    "hnd_heads_tokens": ("hnd", (1, 2), ()),
    "io_rows": ("nhd", (), (0,)),
    "hnd_io_heads_dim": ("hnd", (), (1, 2)),
    "nhd_all": ("nhd", (0, 1, 2, 3), (0, 1, 2)),
}
CL_NEGATIVE = CL_STRIDES + " (negative strides; R-STRIDE-NEG: a correct result or UNSUPPORTED)"


@conformance("layout.negative_strides", CL_NEGATIVE, REQUIRED, "layouts", ("write", "gather"),
             feature="negative_strides")
@pytest.mark.parametrize("which", list(NEGATIVE))
@OPS
def test_negative_strides(kvx_provider, kvx_call_options, which, op):
    kind, cache_dims, io_dims = NEGATIVE[which]
    t = cb.layout(G, kind, DType.F16)
    for dim in cache_dims:
        t = t.reversed(dim)
    cache = cb.make_cache(G, t, t, seed=47)
    served = ("R-CACHE.stride_negative",) * bool(cache_dims) + ("R-IO.stride_negative",) * bool(io_dims)

    def flip(io):
        for dim in io_dims:
            io = io.reversed(dim)
        return io

    label = f"{which}: cache strides {t.stride}"
    if op == "write":
        slots = cb.spread_slots(G, 14, 48).tolist()
        slots[3:3] = [-1]
        case = cb.write_case(cache, slots, seed=49, label=label)
        key = flip(case.key_layout)
        case = cb.replace(case, key_layout=key, value_layout=flip(case.value_layout),
                          label=f"{label}, io strides {key.stride}")
        verify_write(kvx_provider, case, kvx_call_options(), clause=CL_NEGATIVE, feature="negative_strides",
                     served=served)
    else:
        case = cb.packed_gather(cache, cb.distinct_table(G, 3, 3, 50), [3 * G.block_size, G.block_size + 1, 2],
                                3 * G.block_size, seed=51, label=label)
        out = flip(case.out_layout)
        case = cb.replace(case, out_layout=out, label=f"{label}, output strides {out.stride}")
        verify_gather(kvx_provider, case, kvx_call_options(), clause=CL_NEGATIVE, feature="negative_strides",
                      served=served)


@conformance("layout.stride_zero_extent_one", CL_STRIDES + " (stride 0 on an extent-1 dimension)", RECOMMENDED,
             "layouts", ("write", "gather"), feature="noncanonical_strides")
@OPS
def test_stride_zero_extent_one(kvx_provider, kvx_call_options, op):
    geom = Geometry(4, 4, 1, 8)
    t = cb.layout(geom, "nhd", DType.F16)
    t = t.with_(stride=(t.stride[0], t.stride[1], 0, 1))
    _exercise(kvx_provider, kvx_call_options(), t, t, op, clause=CL_STRIDES, feature="noncanonical_strides",
              seed=45, label="one head, head stride 0", geom=geom)


# ---------------------------------------------------------------------------- CUSTOM

CUSTOM = {
    "canonical": {},
    "permuted": {"order": (2, 0, 3, 1)},
    "permuted_padded": {"order": (1, 3, 0, 2), "pad": 3},
    # the contiguous HND memory order [blocks][H][block_size][D], described in CUSTOM's logical
    # order: a provider that sends it to its HND kernel must pass the strides permuted
    "hnd_order": {"order": (0, 2, 1, 3)},
}


@conformance("layout.custom", "spec 4.2 (BLOCK_CUSTOM: explicit shape and stride); R-CUSTOM", REQUIRED, "layouts",
             ("write", "gather"), feature="custom_layout")
@pytest.mark.parametrize("which", list(CUSTOM))
@OPS
def test_custom(kvx_provider, kvx_call_options, which, op):
    t = cb.layout(G, "custom", DType.F16, **CUSTOM[which])
    _exercise(kvx_provider, kvx_call_options(), t, t, op, clause="spec 4.2; R-CUSTOM", feature="custom_layout",
              seed=50, label=f"CUSTOM {which} strides {t.stride}")


# ---------------------------------------------------------------------------- K and V differ

MIXED = {
    # vLLM reshape_and_cache: packed K + V [blocks, H, D, block_size]
    "vllm_packed_k_transposed_v": (("hnd_packed", DType.F16, {"pack": 4}), ("hnd", DType.F16, {"order": (0, 1, 3, 2)})),
    "nhd_k_hnd_v": (("nhd", DType.BF16, {}), ("hnd", DType.BF16, {})),
    "f16_k_f32_v": (("nhd", DType.F16, {}), ("nhd", DType.F32, {})),
}


def _mixed_k_v(provider, opts, which, op, io_dtype, feature):
    (kk, kd, kkw), (vk, vd, vkw) = MIXED[which]
    k, v = cb.layout(G, kk, kd, **kkw), cb.layout(G, vk, vd, **vkw)
    cache = cb.make_cache(G, k, v, seed=60)
    if op == "write":
        # IO of each side's own cache dtype (io_dtype None), or io_dtype for both
        kl = cb.io_layout(io_dtype or kd, 12, G)
        vl = cb.io_layout(io_dtype or vd, 12, G)
        case = cb.write_case(cache, cb.spread_slots(G, 12, 61), key_layout=kl, value_layout=vl, seed=62, label=which)
        verify_write(provider, case, opts, clause="spec 4.2; R-CACHE", feature=feature)
    else:
        # one output dtype for K and V: K's dtype (io_dtype None), or io_dtype
        case = cb.packed_gather(cache, cb.distinct_table(G, 2, 3, 63), [12, 5], 12, io_dtype=io_dtype, seed=64,
                                label=which)
        verify_gather(provider, case, opts, clause="spec 4.2; R-CACHE", feature=feature)


@conformance("layout.mixed_k_v", "spec 4.2; R-CACHE (K and V may differ in layout, strides and dtype)", REQUIRED,
             "layouts", ("write", "gather"), feature="mixed_layouts")
@pytest.mark.parametrize("which", list(MIXED))
@OPS
def test_mixed_k_v(kvx_provider, kvx_call_options, which, op):
    """K and V in different layouts / dtypes; IO in the caches' own dtypes (no conversion
    beyond what a K/V dtype difference implies for a gather's single output dtype)."""
    _mixed_k_v(kvx_provider, kvx_call_options(), which, op, None, "mixed_layouts")


@conformance("layout.mixed_k_v.io_convert", "spec 4.2, 4.3; R-CACHE, R-CONVERT (K and V differ, F32 IO converted)",
             REQUIRED, "layouts", ("write", "gather"), feature="mixed_io_dtype")
@pytest.mark.parametrize("which", list(MIXED))
@OPS
def test_mixed_k_v_io_convert(kvx_provider, kvx_call_options, which, op):
    """The mixed K/V caches with F32 IO: K/V layouts combined with an IO dtype conversion
    (features mixed_layouts and mixed_io_dtype; refused, it is excused unless both are claimed)."""
    _mixed_k_v(kvx_provider, kvx_call_options(), which, op, DType.F32, ("mixed_io_dtype", "mixed_layouts"))


#: K and V of the same dtype in different layouts or strides (no feature beyond ``mixed_layouts``),
#: and of different dtypes and layouts
MIXED_BATCH = {
    "nhd_k_hnd_v": (("nhd", DType.BF16), ("hnd", DType.BF16)),
    "hnd_k_nhd_v": (("hnd", DType.F16), ("nhd", DType.F16)),
    "f16_nhd_k_f32_hnd_v": (("nhd", DType.F16), ("hnd", DType.F32)),
}
MIXED_BATCH_GEOM = Geometry(num_blocks=24, block_size=4, num_kv_heads=2, head_dim=8)  # 96 slots


@conformance("layout.mixed_k_v_batch", "spec 4.2 (MUST honor provided strides); R-CACHE (K and V may differ in "
             "layout, strides and dtype; batches of 32+ tokens)", REQUIRED, "layouts", ("write", "gather"),
             feature="mixed_layouts")
@pytest.mark.parametrize("which", list(MIXED_BATCH))
@pytest.mark.parametrize("tokens", [32, 64, 77])
@OPS
def test_mixed_k_v_batch(kvx_provider, kvx_call_options, which, tokens, op):
    """``layout.mixed_k_v`` with batches of 32, 64 and 77 tokens (that test writes 12): a batched path
    that addresses V with K's layout and strides fails here. IO in each cache's own dtype (a gather's
    single output dtype is K's), one invalid slot among a write's."""
    g = MIXED_BATCH_GEOM
    (kk, kd), (vk, vd) = MIXED_BATCH[which]
    cache = cb.make_cache(g, cb.layout(g, kk, kd), cb.layout(g, vk, vd), seed=65)
    label = f"{which}, {tokens} tokens"
    opts = kvx_call_options()
    clause = "spec 4.2; R-CACHE"
    if op == "write":
        slots = cb.spread_slots(g, tokens - 1, 66).tolist()
        slots[3:3] = [-1]
        case = cb.write_case(cache, slots, key_layout=cb.io_layout(kd, tokens, g),
                             value_layout=cb.io_layout(vd, tokens, g), seed=67, label=label)
        verify_write(kvx_provider, case, opts, clause=clause, feature="mixed_layouts")
    else:
        mb = -(-tokens // g.block_size)
        case = cb.packed_gather(cache, cb.distinct_table(g, 2, mb, 68), [tokens, tokens // 2 + 1], tokens, seed=69,
                                label=label)
        verify_gather(kvx_provider, case, opts, clause=clause, feature="mixed_layouts")


# ---------------------------------------------------------------------------- IO strides


@conformance("io.strided", "spec 6.8; R-IO (other IO strides: correct or UNSUPPORTED)", REQUIRED, "layouts",
             ("write", "gather"), feature="io_strides")
@pytest.mark.parametrize("io_kind", ["padded", "head_major", "dim_major"])
@OPS
def test_io_strides(kvx_provider, kvx_call_options, io_kind, op):
    """IO tensors described by strides: ``padded`` rows and heads, ``head_major`` (``[H][tokens][D]``
    in memory) and ``dim_major`` (each token's row dense but stored ``[D][H]``, a view of a transposed
    tensor: the token stride is the dense ``H * D``, so a path that moves a row as dense once the token
    stride is ``H * D``, never reading the head and dim strides, is seen)."""
    opts = kvx_call_options()
    cache = cb.simple_cache(G, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=70)
    if op == "write":
        case = cb.write_case(cache, cb.spread_slots(G, 9, 71), io_kind=io_kind, seed=72, label=f"IO {io_kind}")
        verify_write(kvx_provider, case, opts, clause="spec 6.8; R-IO", feature="io_strides")
    else:
        base = cb.packed_gather(cache, cb.distinct_table(G, 2, 2, 73), [7, 3], 8, seed=74, label=f"IO {io_kind}")
        lay = cb.io_layout(DType.F16, base.num_tokens, G, io_kind)
        rng = cb.rng_for(75)
        n = lay.span_elements()
        case = cb.replace(base, out_layout=lay, out_k_init=cb.poison(rng, DType.F16, n),
                          out_v_init=cb.poison(rng, DType.F16, n))
        verify_gather(kvx_provider, case, opts, clause="spec 6.8; R-IO", feature="io_strides")


CL_WIDE_IO = ("spec 4.2 (implementations MUST honor provided strides), 6.8 (IO tensors: shape and strides); R-IO "
              "(any non-negative strides: the correct result or UNSUPPORTED, whatever the head shape)")
#: id -> (num_kv_heads, head_dim, IO kind): ``latent_view`` is MLA's 512-element latent read as a view
#: of its 576-element projection row (token stride 576: kv_c beside k_pe); the others cb.io_layout's kinds
WIDE_IO = {"h1_d512-latent_view": (1, 512, "latent_view"), "h1_d576-padded": (1, 576, "padded"),
           "h2_d256-head_major": (2, 256, "head_major")}


def _wide_io_layout(kind: str, n: int, geom: Geometry):
    if kind == "latent_view":
        return IOLayout(DType.F16, (n, 1, geom.head_dim), (geom.head_dim + 64, geom.head_dim, 1))
    return cb.io_layout(DType.F16, n, geom, kind)


@conformance("io.strided_wide_heads", CL_WIDE_IO, REQUIRED, "layouts", ("write", "gather"), feature="io_strides")
@pytest.mark.parametrize("which", list(WIDE_IO))
@OPS
def test_io_strided_wide_heads(kvx_provider, kvx_call_options, which, op):
    """``io.strided`` with heads of 256 elements and more (MLA's 512 / 576, Gemma's 256): the IO
    tensors of a write and a gather are strided views, MLA's latent a view of the wider projection
    row as vLLM passes it. A wide-head path that takes the IO as dense rows (strides unread) fails;
    ``io.strided`` uses heads of 8 elements and ``shapes.model_heads`` dense IO."""
    opts = kvx_call_options()
    h, d, kind = WIDE_IO[which]
    geom = Geometry(num_blocks=6, block_size=4, num_kv_heads=h, head_dim=d)
    cache = cb.simple_cache(geom, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=76 + d)
    if op == "write":
        n = 10
        lay = _wide_io_layout(kind, n, geom)
        case = cb.write_case(cache, cb.spread_slots(geom, n, 77), key_layout=lay, value_layout=lay, seed=78,
                             label=f"{h} heads x head_dim {d}, {kind} inputs (strides {lay.stride})")
        verify_write(kvx_provider, case, opts, clause=CL_WIDE_IO, feature="io_strides")
    else:
        base = cb.packed_gather(cache, cb.distinct_table(geom, 2, 3, 79), [12, 5], 12, seed=80)
        lay = _wide_io_layout(kind, base.num_tokens, geom)
        rng = cb.rng_for(81)
        n = lay.span_elements()
        case = cb.replace(base, out_layout=lay, out_k_init=cb.poison(rng, DType.F16, n),
                          out_v_init=cb.poison(rng, DType.F16, n),
                          label=f"{h} heads x head_dim {d}, {kind} outputs (strides {lay.stride})")
        verify_gather(kvx_provider, case, opts, clause=CL_WIDE_IO, feature="io_strides")


CL_FULL_BLOCKS = ("spec 4.2 (implementations MUST honor provided strides), 6.8 (IO tensors: shape and strides); "
                  "R-IO, R-WRITE")
#: the slots of a prefill-shaped write into 6 blocks of 4: blocks 2, 0 and 4 filled in order, then two
#: tokens of a partial block and a token of block 3
FULL_BLOCK_SLOTS = [8, 9, 10, 11, 0, 1, 2, 3, 16, 17, 18, 19, 21, 22, 13]


@conformance("write.full_blocks_strided_io", CL_FULL_BLOCKS, REQUIRED, "layouts", "write", feature="io_strides")
@pytest.mark.parametrize("io_kind", ["padded", "head_major"])
@pytest.mark.parametrize("kind", ["nhd", "hnd"])
def test_write_full_blocks_strided_io(kvx_provider, kvx_call_options, kind, io_kind):
    """A prefill-shaped write: runs of block_size tokens whose slots fill whole blocks in order, then
    a partial block, from key / value inputs that are strided views (``padded``: a token stride
    larger than H * D, as a row of vLLM's fused QKV projection; ``head_major``: ``[H][tokens][D]``).
    A provider whose whole-block path copies block_size * H * D contiguous input elements into the
    block, as if the input were dense, fails here; ``io.strided`` writes random slots, which seldom
    fill a block. The cache is NHD or HND (core needs one): a refusal is excused unless both
    ``io_strides`` and that layout are claimed."""
    opts = kvx_call_options()
    cache = cb.simple_cache(G, kind, DType.F16, seed=87)
    n = len(FULL_BLOCK_SLOTS)
    lay = cb.io_layout(DType.F16, n, G, io_kind)
    case = cb.write_case(cache, FULL_BLOCK_SLOTS, key_layout=lay, value_layout=lay, seed=88,
                         label=f"{kind.upper()} cache, blocks 2, 0, 4 written whole, {io_kind} inputs "
                               f"(strides {lay.stride})")
    verify_write(kvx_provider, case, opts, clause=CL_FULL_BLOCKS, feature=("io_strides", kind))


CL_PREFILL_IO = ("spec 4.2 (implementations MUST honor provided strides), 6.8 (IO tensors: shape and strides); R-IO "
                 "(any non-negative strides, in a write of any size)")
#: the prefill of ``write.prefill_strided_io``: 4096 tokens (a prefill chunk) into 1100 blocks of 4 tokens, 2 heads x 8
PREFILL_IO_GEOM = Geometry(num_blocks=1100, block_size=4, num_kv_heads=2, head_dim=8)
PREFILL_IO_TOKENS = 4096
#: query heads per KV head of the fused QKV rows that ``qkv_view`` inputs are views of (grouped-query attention)
QKV_GROUP = 4
#: id -> (key input kind, value input kind): ``qkv_view`` is the K (or V) part of a row of a fused QKV projection
#: ``[tokens][q | k | v]`` (heads contiguous, token stride (QKV_GROUP + 2) * H * D), as vLLM passes key and value;
#: the others cb.io_layout's kinds
PREFILL_IO = {"qkv_view": ("qkv_view", "qkv_view"), "value_qkv_view": ("dense", "qkv_view"),
              "padded": ("padded", "padded"), "head_major": ("head_major", "head_major")}


def _prefill_io_layout(kind: str, n: int, geom: Geometry) -> IOLayout:
    if kind == "qkv_view":
        h, d = geom.num_kv_heads, geom.head_dim
        return IOLayout(DType.F16, (n, h, d), ((QKV_GROUP + 2) * h * d, d, 1))
    return cb.io_layout(DType.F16, n, geom, kind)


@conformance("write.prefill_strided_io", CL_PREFILL_IO, REQUIRED, "layouts", "write", feature="io_strides")
@pytest.mark.parametrize("which", list(PREFILL_IO))
def test_write_prefill_strided_io(kvx_provider, kvx_call_options, which):
    """A prefill chunk of 4096 tokens (every 97th slot -1) from strided key / value inputs: views of a fused QKV
    projection's rows (heads contiguous, the token stride six times a dense row's; both inputs, or the value's
    alone beside a dense key), padded rows and heads, head-major ``[H][tokens][D]``. The other writes from strided
    inputs hold at most 15 tokens (``io.strided``, ``write.kv_in_strides``, ``write.full_blocks_strided_io``) or
    a few hundred (``pairwise.write``), and every write past them (``write.prefill_batch``, ``matrix.write``,
    ``dtype.write.convert_batch``, the engines' prefills) reads dense rows, so a prefill path that copies each
    token's contiguous row from ``token * H * D`` (the token stride unread) was never reached; the elements between
    the rows hold other values, so such a copy stores them."""
    opts = kvx_call_options()
    g = PREFILL_IO_GEOM
    cache = cb.simple_cache(g, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=396)
    n = PREFILL_IO_TOKENS
    slots = cb.spread_slots(g, n, 397)
    slots[::97] = -1
    kk, vk = PREFILL_IO[which]
    kl, vl = _prefill_io_layout(kk, n, g), _prefill_io_layout(vk, n, g)
    case = cb.write_case(cache, slots, key_layout=kl, value_layout=vl, seed=398,
                         label=f"{n}-token prefill, key input strides {kl.stride}, value input strides {vl.stride}")
    verify_write(kvx_provider, case, opts, clause=CL_PREFILL_IO, feature="io_strides")


CL_KV_IN_STRIDES = ("spec 4.2 (implementations MUST honor provided strides), 6.8 (io.key and io.value are tensor "
                    "descriptors of their own: each input read through its own strides); R-IO")
#: (key IO kind, value IO kind)
KV_IN_STRIDES = {"value_head_major": ("dense", "head_major"), "key_head_major": ("head_major", "dense"),
                 "value_padded": ("dense", "padded"), "key_padded": ("padded", "dense")}


@conformance("write.kv_in_strides", CL_KV_IN_STRIDES, REQUIRED, "layouts", "write", feature="io_strides")
@pytest.mark.parametrize("which", list(KV_IN_STRIDES))
def test_write_kv_in_strides(kvx_provider, kvx_call_options, which):
    """A write whose key input is dense and whose value input is head-major ``[H][tokens][D]`` or
    padded (and the other way round): each input is read through its own strides, never the
    other's (``io.strided`` gives both inputs the same strides; ``gather.kv_out_strides`` is the
    gather's side)."""
    opts = kvx_call_options()
    cache = cb.simple_cache(G, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=84)
    n = 12
    kk, vk = KV_IN_STRIDES[which]
    kl, vl = cb.io_layout(DType.F16, n, G, kk), cb.io_layout(DType.F16, n, G, vk)
    case = cb.write_case(cache, cb.spread_slots(G, n, 85), key_layout=kl, value_layout=vl, seed=86,
                         label=f"key input strides {kl.stride}, value input strides {vl.stride}")
    verify_write(kvx_provider, case, opts, clause=CL_KV_IN_STRIDES, feature="io_strides")


CL_KV_OUT_STRIDES = ("spec 4.2 (implementations MUST honor provided strides), 6.8 (io.key and io.value are tensor "
                     "descriptors of their own: each output through its own strides); R-IO")


def _outputs_apart(case, which: str, seed: int):
    """``case`` with one output head-major ``[H][rows][D]`` (the value's for ``value_head_major``, else the
    key's) beside the other's dense layout, the head-major one poisoned from ``seed``."""
    dense = case.out_layout
    major = cb.io_layout(dense.dtype, case.num_tokens, G, "head_major")
    init = cb.poison(cb.rng_for(seed), major.dtype, major.span_elements())
    if which == "value_head_major":
        case = cb.replace(case, value_out_layout=major, out_v_init=init)
    else:
        case = cb.replace(case, out_layout=major, value_out_layout=dense, out_k_init=init)
    side = "value" if which == "value_head_major" else "key"
    return cb.replace(case, label=f"{case.label}: {side} output strides {major.stride}, the other {dense.stride}")


@conformance("gather.kv_out_strides", CL_KV_OUT_STRIDES, REQUIRED, "layouts", "gather", feature="io_strides")
@pytest.mark.parametrize("which", ["value_head_major", "key_head_major"])
def test_gather_kv_out_strides(kvx_provider, kvx_call_options, which):
    """A gather whose key output is dense and whose value output is head-major ``[H][rows][D]``
    (and the other way round): each output is written through its own strides, never the
    other's. Each output has its own layout in the case (``GatherCase.value_out_layout``), so the
    oracle, the comparison and the failure message read each output through its own strides; every
    element of both, gathered or not, is compared (the rows past a sequence's length stay poison)."""
    opts = kvx_call_options()
    cache = cb.simple_cache(G, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=81)
    case = cb.packed_gather(cache, cb.distinct_table(G, 2, 3, 82), [12, 7], 12, seed=83,
                            label=f"dense and head-major outputs ({which})")
    case = _outputs_apart(case, which, 84)
    verify_gather(kvx_provider, case, opts, clause=CL_KV_OUT_STRIDES, feature="io_strides")


#: the decode batch of ``gather.kv_out_strides_batch``: sequences, max_seq_len (G: blocks of 4 tokens)
KV_OUT_BATCH_SEQS, KV_OUT_BATCH_MSL = 260, 12


@conformance("gather.kv_out_strides_batch", CL_KV_OUT_STRIDES + " - in a decode-sized gather", REQUIRED, "layouts",
             "gather", feature="io_strides")
@pytest.mark.parametrize("which", ["value_head_major", "key_head_major"])
def test_gather_kv_out_strides_batch(kvx_provider, kvx_call_options, which):
    """``gather.kv_out_strides`` in a decode batch: 260 sequences (lengths 0 to 15, a fifth past
    max_seq_len 12) gathered into a dense key output beside a head-major value output, and the other
    way round. ``gather.kv_out_strides`` gathers 2 sequences, and every engine-sized gather of the
    suite (decode batches, ``matrix.*``, ``pairwise.gather``, the generated batches) gives its key
    and value outputs one layout, so a batch kernel that addresses both outputs through the key
    output's strides was never reached."""
    opts = kvx_call_options()
    cache = cb.simple_cache(G, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=389)
    rng = cb.rng_for(390)
    mb = KV_OUT_BATCH_MSL // G.block_size
    table = rng.integers(0, G.num_blocks, size=(KV_OUT_BATCH_SEQS, mb))
    lens = rng.integers(0, KV_OUT_BATCH_MSL + 4, size=KV_OUT_BATCH_SEQS).tolist()
    case = cb.packed_gather(cache, table, lens, KV_OUT_BATCH_MSL, seed=391,
                            label=f"{KV_OUT_BATCH_SEQS}-sequence gather, dense and head-major outputs ({which})")
    case = _outputs_apart(case, which, 392)
    verify_gather(kvx_provider, case, opts, clause=CL_KV_OUT_STRIDES, feature="io_strides")


# ---------------------------------------------------------------------------- IO layout field

#: values of an IO tensor's ``layout`` field: 0, cache layouts, CUSTOM and one outside the enum
IO_LAYOUT_FIELDS = {"invalid_0": int(Layout.INVALID), "nhd": int(Layout.BLOCK_NHD),
                    "hnd_packed": int(Layout.BLOCK_HND_PACKED), "custom": int(Layout.BLOCK_CUSTOM), "not_enum_99": 99}
CL_IO_LAYOUT = ("spec 6.8 (the layout field MAY be set to KVX_LAYOUT_BLOCK_CUSTOM and is otherwise ignored for IO "
                "tensors); R-IO")


@conformance("io.layout_field_ignored", CL_IO_LAYOUT, REQUIRED, "core", ("write", "gather"))
@pytest.mark.parametrize("io_layout", list(IO_LAYOUT_FIELDS.values()), ids=list(IO_LAYOUT_FIELDS))
@OPS
def test_io_layout_field_ignored(kvx_provider, kvx_call_options, io_layout, op):
    """Dense IO tensors whose ``layout`` field holds 0, a cache layout, CUSTOM or 99: the field is
    ignored, so the call gives the normal result (not INVALID_ARGUMENT)."""
    opts = kvx_call_options()
    cache = cb.simple_cache(G, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=76)
    ov = {"desc.io.key.layout": io_layout, "desc.io.value.layout": io_layout}
    label = f"IO key/value layout field {io_layout}"
    if op == "write":
        case = cb.write_case(cache, cb.spread_slots(G, 9, 77), seed=78, label=label, overrides=ov)
        verify_write(kvx_provider, case, opts, clause=CL_IO_LAYOUT)
    else:
        case = cb.packed_gather(cache, cb.distinct_table(G, 2, 2, 79), [7, 3], 8, seed=80, label=label, overrides=ov)
        verify_gather(kvx_provider, case, opts, clause=CL_IO_LAYOUT)
