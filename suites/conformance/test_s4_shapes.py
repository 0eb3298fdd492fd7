"""Spec 4.1, 5.2, 6.10, 7 (R-WRITE, R-GATHER): the head shapes of real models.

A write stores, and a gather returns, every element of every head of a token: ``head_dim``
and ``num_kv_heads`` are any positive values (7.1 asks only that they are non-zero). The
other suites use small heads (``head_dim`` 1 to 64, a token row of at most 128 elements), so
the shapes of deployed models are written and gathered here, each through a small cache:

- ``head_dim`` 72, 80, 96, 112 (2 heads): larger than 32 and, but for 96, not a multiple of
  32 (Phi-2 80, Phi-3 96): a kernel that tiles dims by 32 and drops the remainder is seen;
- 32 heads x 128 (Llama-2-7B without tensor parallelism): a token row of 4096 elements, so a
  per-token stage of 1024 elements is seen;
- 1 head x 576 (DeepSeek's MLA latent cache, 512 + 64) and 1 head x 512: dims past 256 in one
  head, so a head tile of 256 is seen;
- 96 and 112 heads x 128 (multi-head attention without tensor parallelism: OPT-175B, BLOOM-176B):
  more than 64 KV heads, so a kernel with one thread row per head, launched with at most 64 rows
  (heads 64 and later neither written nor gathered), is seen.

Head counts that are not powers of two (``shapes.heads_not_pow2``: 5, 6, 7, 10, 12 and 25 heads
of 8): a kernel that handles heads in groups of 4 (or 8) and drops the remainder is seen.

Prefills into blocks past 256 tokens (``shapes.prefill_wide_blocks``: blocks of 512, 768, 1024 and 2048
tokens, ``block_size`` + 300 tokens a write): a prefill kernel whose tile holds 256 block offsets is seen
(the other tests' blocks past 256 tokens are of 528, no power of two).
"""
from __future__ import annotations

import pytest

from kvx_conformance.abi.descriptors import Geometry
from kvx_conformance.abi.header import DType
from kvx_conformance.cases import build as cb
from kvx_conformance.cases.checks import verify_gather, verify_write
from kvx_conformance.results.outcomes import REQUIRED, conformance

CL_SHAPES = ("spec 4.1, 5.2, 6.10, 7 (K and V of every head of a token, every element of the head); "
             "R-WRITE, R-GATHER")
#: id -> (num_kv_heads, head_dim)
MODEL_HEADS = {
    "h2_d72": (2, 72), "h2_d80": (2, 80), "h2_d96": (2, 96), "h2_d112": (2, 112),
    "h32_d128": (32, 128), "h1_d576": (1, 576), "h1_d512": (1, 512), "h96_d128": (96, 128), "h112_d128": (112, 128),
}


@conformance("shapes.model_heads", CL_SHAPES, REQUIRED, "core", ("write", "gather"))
@pytest.mark.parametrize("heads", list(MODEL_HEADS.values()), ids=list(MODEL_HEADS))
@pytest.mark.parametrize("op", ["write", "gather"])
def test_model_heads(kvx_provider, kvx_call_options, op, heads):
    """Write 10 tokens at random distinct slots, or gather 2 PACKED sequences (12 and 5 tokens of
    blocks of 4), in a cache of 6 blocks of 4 tokens with the model's heads (F16)."""
    _model_heads_call(kvx_provider, kvx_call_options(), op, *heads, DType.F16, 400)


def _model_heads_call(provider, opts, op: str, h: int, d: int, dtype: DType, seed: int) -> None:
    """The write of 10 tokens, or the PACKED gather of 2 sequences, of ``shapes.model_heads`` for ``h`` heads
    of ``d`` dims in a ``dtype`` cache (IO of its dtype) of 6 blocks of 4 tokens."""
    geom = Geometry(num_blocks=6, block_size=4, num_kv_heads=h, head_dim=d)
    cache = cb.simple_cache(geom, cb.core_layout(provider, opts.memory), dtype, seed=seed + d + h)
    label = f"{h} heads x head_dim {d}" + (f", {dtype.name} cache" if dtype != DType.F16 else "")
    if op == "write":
        case = cb.write_case(cache, cb.spread_slots(geom, 10, seed + 1), seed=seed + 2, label=label)
        verify_write(provider, case, opts, clause=CL_SHAPES)
    else:
        case = cb.packed_gather(cache, cb.distinct_table(geom, 2, 3, seed + 3), [12, 5], 12, seed=seed + 4, label=label)
        verify_gather(provider, case, opts, clause=CL_SHAPES)


#: the head dims of ``MODEL_HEADS`` that are not a power of two nor a multiple of 64, and a large one
DIMS_OTHER_DTYPES = ["h2_d72", "h2_d80", "h2_d96", "h2_d112", "h1_d576"]


@conformance("shapes.model_heads_dtypes", CL_SHAPES, REQUIRED, "core", ("write", "gather"))
@pytest.mark.parametrize("heads", DIMS_OTHER_DTYPES)
@pytest.mark.parametrize("dtype", [DType.BF16, DType.F32], ids=["bf16", "f32"])
@pytest.mark.parametrize("op", ["write", "gather"])
def test_model_heads_dtypes(kvx_provider, kvx_call_options, op, dtype, heads):
    """``shapes.model_heads`` in BF16 and F32 caches (with IO of the cache's dtype) for the head dims
    that no vector width divides evenly (72, 80, 96, 112) and 576: ``shapes.model_heads`` uses F16,
    so a kernel of another dtype that moves head_dim in whole tiles of 32 or 64 and drops the tail
    was never run on them."""
    _model_heads_call(kvx_provider, kvx_call_options(), op, *MODEL_HEADS[heads], dtype, 410)


#: id -> (num_blocks, block_size, num_kv_heads, head_dim): the extremes of the explicit shape tests, past
#: the sizes the generated tests draw (64 heads, 256 dims, blocks of 128 tokens)
SHAPE_EXTREMES = {"h96_d128": (6, 4, 96, 128), "h1_d576": (6, 4, 1, 576), "bs528_h2_d8": (3, 528, 2, 8)}
EXTREME_KINDS = ["nhd", "hnd", "hnd_packed"]
#: each layout meets each baseline dtype over the three shapes, and each shape each dtype over the layouts
_EXTREME_DTYPES = [DType.F16, DType.BF16, DType.F32]


@conformance("shapes.layouts", CL_SHAPES + "; R-CACHE (every layout: each element of every head, at every "
             "block offset)", REQUIRED, "core", ("write", "gather"))
@pytest.mark.parametrize("shape", list(SHAPE_EXTREMES))
@pytest.mark.parametrize("kind", EXTREME_KINDS)
@pytest.mark.parametrize("op", ["write", "gather"])
def test_shape_extremes_in_every_layout(kvx_provider, kvx_call_options, op, kind, shape):
    """96 heads of 128 dims, one head of 576 dims and blocks of 528 tokens, in NHD, HND and HND_PACKED
    caches of F16, BF16 or F32 (each layout in each dtype over the three shapes). ``shapes.model_heads``
    and the non-power-of-two block sizes run in the core layout's F16 caches only: a kernel of another
    layout that launches at most 64 head rows, or tiles block offsets by 128, was never run on them. A
    refusal of a layout other than the provider's core one is the layout's (R-REFUSAL)."""
    opts = kvx_call_options()
    nb, bs, h, d = SHAPE_EXTREMES[shape]
    i, j = EXTREME_KINDS.index(kind), list(SHAPE_EXTREMES).index(shape)
    dtype = _EXTREME_DTYPES[(i + j) % 3]
    seed = 420 + 10 * i + j
    geom = Geometry(num_blocks=nb, block_size=bs, num_kv_heads=h, head_dim=d)
    cache = cb.simple_cache(geom, kind, dtype, seed=seed)
    label = f"{kind.upper()} {dtype.name} cache of {nb} blocks of {bs} tokens, {h} heads x head_dim {d}"
    if op == "write":  # 24 tokens at random distinct slots (with blocks of 528: offsets past 128 among them), one -1
        slots = cb.spread_slots(geom, 24, seed + 1).tolist()
        slots[7] = -1
        case = cb.write_case(cache, slots, seed=seed + 2, label=label)
        verify_write(kvx_provider, case, opts, clause=CL_SHAPES, feature=())
        return
    lens, msl, mb = ([600, 301], 600, 2) if bs > 128 else ([12, 5], 12, 3)
    case = cb.packed_gather(cache, cb.distinct_table(geom, 2, mb, seed + 3), lens, msl, seed=seed + 4, label=label)
    verify_gather(kvx_provider, case, opts, clause=CL_SHAPES, feature=())


#: head counts that are not powers of two, past 4 (Phi-3-medium 10, GPT-2 XL 25, 5 / 6 / 7 / 12 after tensor
#: parallelism of odd head counts): the other suites use 1, 2, 3, 4, 8, 16 and 32 heads only
ODD_HEADS = [5, 6, 7, 10, 12, 25]
CL_HEADS = ("spec 4.1, 5.2, 6.10, 7 (K and V of every head of a token); R-WRITE, R-GATHER, R-CACHE (num_kv_heads "
            "any positive value)")


@conformance("shapes.heads_not_pow2", CL_HEADS, REQUIRED, "core", ("write", "gather"))
@pytest.mark.parametrize("heads", ODD_HEADS)
@pytest.mark.parametrize("op", ["write", "gather"])
def test_heads_not_pow2(kvx_provider, kvx_call_options, heads, op):
    """``num_kv_heads`` 5, 6, 7, 10, 12 and 25 (head_dim 8, F16, the core layout): write 12 tokens at
    random distinct slots (one invalid slot among them), or gather 2 PACKED sequences (12 and 7 tokens
    of blocks of 4). A kernel that handles heads in groups of 4 (or 8) and drops the remainder passes
    every other suite (their head counts are powers of two, or at most 4) and fails here."""
    opts = kvx_call_options()
    geom = Geometry(num_blocks=8, block_size=4, num_kv_heads=heads, head_dim=8)
    cache = cb.simple_cache(geom, cb.core_layout(kvx_provider, opts.memory), DType.F16, seed=410 + heads)
    label = f"{heads} heads x head_dim 8"
    if op == "write":
        slots = cb.spread_slots(geom, 12, 411 + heads).tolist()
        slots[3:3] = [-1]
        case = cb.write_case(cache, slots, seed=412 + heads, label=label)
        verify_write(kvx_provider, case, opts, clause=CL_HEADS)
    else:
        case = cb.packed_gather(cache, cb.distinct_table(geom, 2, 3, 413 + heads), [12, 7], 12, seed=414 + heads,
                                label=label)
        verify_gather(kvx_provider, case, opts, clause=CL_HEADS)


#: (layout kind, block_size, dtype) of ``shapes.prefill_wide_blocks``: blocks past 256 tokens (powers of two 512, 1024
#: and 2048, and 768, no power of two) in each layout, each layout in another baseline dtype
WIDE_BLOCK_PREFILLS = [pytest.param(k, bs, dt, id=f"{k}-bs{bs}-{dt.name.lower()}")
                       for k, bs, dt in (("nhd", 512, DType.F16), ("hnd", 1024, DType.BF16),
                                         ("hnd_packed", 2048, DType.F32), ("nhd", 768, DType.BF16))]
CL_WIDE_BLOCKS = ("spec 4.1 (block_idx = slot_idx / block_size, block_offset = slot_idx % block_size, any block_size), "
                  "5.2, 7 (every token of a write stored); R-WRITE, R-CACHE")


@conformance("shapes.prefill_wide_blocks", CL_WIDE_BLOCKS, REQUIRED, "core", "write")
@pytest.mark.parametrize("kind,block_size,dtype", WIDE_BLOCK_PREFILLS)
def test_prefill_wide_blocks(kvx_provider, kvx_call_options, kind, block_size, dtype):
    """A prefill into blocks past 256 tokens: write ``block_size`` + 300 tokens at random distinct slots (offsets past
    256 among them; one -1) into a cache of 3 blocks of 512, 768, 1024 or 2048 tokens (2 heads x 8, NHD, HND or
    HND_PACKED). The other writes into blocks past 256 tokens use blocks of 528 (``shapes.layouts``,
    ``write.slots.block_size_non_pow2*``), no power of two, and the generated tests draw blocks of at most 256: a
    prefill kernel of the power-of-two block sizes whose tile holds 256 block offsets (tokens at offsets of 256 and
    more not stored) is seen here. A refusal of a layout other than the provider's core one is the layout's
    (R-REFUSAL)."""
    opts = kvx_call_options()
    i = [p.id for p in WIDE_BLOCK_PREFILLS].index(f"{kind}-bs{block_size}-{dtype.name.lower()}")
    seed = 470 + 10 * i
    geom = Geometry(num_blocks=3, block_size=block_size, num_kv_heads=2, head_dim=8)
    cache = cb.simple_cache(geom, kind, dtype, seed=seed)
    slots = cb.spread_slots(geom, block_size + 300, seed + 1).tolist()
    slots[11] = -1
    label = f"{kind.upper()} {dtype.name} cache of 3 blocks of {block_size} tokens, 2 heads x head_dim 8"
    case = cb.write_case(cache, slots, seed=seed + 2, label=label)
    verify_write(kvx_provider, case, opts, clause=CL_WIDE_BLOCKS, feature=())
