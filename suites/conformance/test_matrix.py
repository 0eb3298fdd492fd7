"""The structure of a call crossed at engine size (spec 4.1, 4.3, 5.1-5.3, 6.5, 7; R-CACHE, R-WRITE,
R-GATHER, R-DATA, R-WIDE-IDS, R-CONVERT, R-FP8): every cache layout with every cache dtype, and
every table format with them, in calls past any tile size.

The explicit tests each fix all but the parameter they are about (most run in the core layout's
F16 caches), and the engine-sized ones (``write.prefill_batch``, ``gather.decode_batch``) cross the
layouts with F16 only; a provider whose path for one (layout, dtype) pair, or (table, layout) pair,
is broken past some size certified with every one of them passing. Here each pair gets one call of
the size engines make:

- writes of 1237 tokens (no multiple of any tile; 5 tokens -1 and 4 a non-negative
  ``invalid_slot``) into NHD, HND and HND_PACKED (16 bytes a pack) caches of F16, BF16, F32
  (``matrix.write``) and E4M3 / E5M2, raw bytes and quantized from BF16 rows with PER_HEAD scales
  (``matrix.fp8.write``); S32 and S64 slots in turn;
- gathers of 300 sequences (0 to 40 tokens of blocks of 16, some past ``max_seq_len``) from each
  layout and dtype through PACKED tables (``matrix.gather``, ``matrix.fp8.gather``: S32 ids, S64
  lengths) and RAGGED ones (``matrix.ragged.gather``: S64 ids, indptr and lengths), and through
  KV_OFFSETS tables of 2 beams from F16 / BF16 / F32 pools (``matrix.kv_offsets.gather``, S64
  lengths).

Caches hold 4 heads of 80 dims (no power of two) in 100 blocks of 16 tokens. A refusal of a case is
excused by its own optional features (its layout unless the core one, ``hnd_packed``, ``fp8``,
``ragged``, ``kv_offsets``) while they are unclaimed (R-REFUSAL).
"""
from __future__ import annotations

import numpy as np
import pytest

from kvx_conformance.abi.descriptors import Geometry
from kvx_conformance.abi.header import DTYPE_SIZE, DType, ScaleGranularity
from kvx_conformance.cases import build as cb
from kvx_conformance.cases.checks import verify_gather, verify_write
from kvx_conformance.results.outcomes import REQUIRED, conformance

CL = ("spec 4.1, 4.3, 5.1-5.3, 6.5, 7 (every layout with every cache dtype and table format, in a call of "
      "engine size); R-CACHE, R-WRITE, R-GATHER, R-DATA, R-WIDE-IDS")
CL_FP8 = CL + "; R-FP8, R-CONVERT (an FP8 IO dtype copies raw bytes)"
GEOM = Geometry(num_blocks=100, block_size=16, num_kv_heads=4, head_dim=80)
KINDS = ["nhd", "hnd", "hnd_packed"]
BASELINE = {"f16": DType.F16, "bf16": DType.BF16, "f32": DType.F32}
FP8 = {"e4m3": DType.F8_E4M3, "e5m2": DType.F8_E5M2}
WRITE_TOKENS = 1237
#: the non-negative invalid_slot of the writes: the last slot, which no other token writes
SENTINEL = GEOM.num_slots - 1
SEQS, MAX_SEQ_LEN = 300, 24


def _seed(*parts) -> int:
    """A fixed seed per case, from its parameters' positions."""
    out = 500
    for p in parts:
        out = out * 7 + p
    return out


def _cache(kind: str, dtype: DType, seed: int):
    """A cache of GEOM in layout ``kind`` (HND_PACKED: a pack of 16 bytes)."""
    kw = {"pack": 16 // DTYPE_SIZE[dtype]} if kind == "hnd_packed" else {}
    return cb.simple_cache(GEOM, kind, dtype, seed=seed, **kw)


def _write(provider, opts, kind: str, dtype: DType, seed: int, clause: str, **kw) -> None:
    slots = cb.spread_slots(GEOM, WRITE_TOKENS, seed, exclude={SENTINEL}).tolist()
    for i in (0, 300, 611, 1000, WRITE_TOKENS - 1):
        slots[i] = -1
    for i in (5, 128, 640, WRITE_TOKENS - 2):
        slots[i] = SENTINEL
    slot_dtype = DType.S64 if seed % 2 else DType.S32
    label = (f"{WRITE_TOKENS}-token write into a {kind.upper()} {dtype.name} cache of {GEOM.num_blocks} blocks of "
             f"{GEOM.block_size}, {GEOM.num_kv_heads} heads x {GEOM.head_dim}, {slot_dtype.name} slots, 5 tokens -1 "
             f"and 4 invalid_slot {SENTINEL}")
    if kw.get("io_dtype") is not None:
        label += f", {kw['io_dtype'].name} rows"
    case = cb.write_case(_cache(kind, dtype, seed), slots, seed=seed + 1, slot_dtype=slot_dtype, invalid_slot=SENTINEL,
                         label=label, **kw)
    verify_write(provider, case, opts, clause=clause, feature=())


def _lengths(seed: int) -> list[int]:
    """SEQS lengths of 0 to 40 tokens: some empty, some past MAX_SEQ_LEN (read up to it)."""
    lens = cb.rng_for(seed).integers(0, 41, SEQS)
    lens[[0, 7, 150]] = 0
    lens[[1, 8, 299]] = MAX_SEQ_LEN
    return lens.tolist()


def _gather(provider, opts, kind: str, dtype: DType, seed: int, clause: str, ragged: bool = False) -> None:
    cache = _cache(kind, dtype, seed)
    lens = _lengths(seed + 1)
    mb = -(-MAX_SEQ_LEN // GEOM.block_size)
    table = cb.distinct_table(GEOM, SEQS, mb, seed + 2)
    label = (f"gather of {SEQS} sequences (max_seq_len {MAX_SEQ_LEN}) from a {kind.upper()} {dtype.name} cache, "
             f"{GEOM.num_kv_heads} heads x {GEOM.head_dim}, blocks of {GEOM.block_size}")
    if ragged:
        case = cb.ragged_gather(cache, table, lens, MAX_SEQ_LEN, seed=seed + 3, index_dtype=DType.S64,
                                indptr_dtype=DType.S64, lens_dtype=DType.S64,
                                label=label + ", RAGGED table of S64 ids, indptr and lengths")
    else:
        case = cb.packed_gather(cache, table, lens, MAX_SEQ_LEN, seed=seed + 3, lens_dtype=DType.S64,
                                label=label + ", PACKED table of S32 ids, S64 lengths")
    verify_gather(provider, case, opts, clause=clause, feature=())


@conformance("matrix.write", CL, REQUIRED, "core", "write")
@pytest.mark.parametrize("dtype", list(BASELINE))
@pytest.mark.parametrize("kind", KINDS)
def test_write(kvx_provider, kvx_call_options, kind, dtype):
    """A 1237-token write into each layout of each baseline dtype (spec 4.3: baseline kernels MUST
    support F16, BF16 and F32)."""
    _write(kvx_provider, kvx_call_options(), kind, BASELINE[dtype], _seed(KINDS.index(kind), list(BASELINE).index(dtype)),
           CL)


@conformance("matrix.fp8.write", CL_FP8, REQUIRED, "fp8", "write", feature="fp8")
@pytest.mark.parametrize("io", ["raw", "bf16_per_head"])
@pytest.mark.parametrize("dtype", list(FP8))
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_write(kvx_provider, kvx_call_options, kind, dtype, io):
    """A 1237-token write into each layout of an E4M3 / E5M2 cache: raw bytes (IO of the cache's dtype),
    or quantized from BF16 rows with PER_HEAD scales of K and V."""
    seed = _seed(KINDS.index(kind), list(FP8).index(dtype), io == "raw", 3)
    kw = {}
    if io != "raw":
        kw = dict(io_dtype=DType.BF16,
                  k_scale_desc=cb.scale_spec([0.031, 0.52, 0.0047, 1.9], ScaleGranularity.PER_HEAD),
                  v_scale_desc=cb.scale_spec([0.77, 0.012, 0.26, 0.0033], ScaleGranularity.PER_HEAD))
    _write(kvx_provider, kvx_call_options(), kind, FP8[dtype], seed, CL_FP8, **kw)


@conformance("matrix.gather", CL, REQUIRED, "core", "gather")
@pytest.mark.parametrize("dtype", list(BASELINE))
@pytest.mark.parametrize("kind", KINDS)
def test_gather(kvx_provider, kvx_call_options, kind, dtype):
    """A PACKED gather of 300 sequences from each layout of each baseline dtype."""
    _gather(kvx_provider, kvx_call_options(), kind, BASELINE[dtype],
            _seed(KINDS.index(kind), list(BASELINE).index(dtype), 5), CL)


@conformance("matrix.fp8.gather", CL_FP8, REQUIRED, "fp8", "gather", feature="fp8")
@pytest.mark.parametrize("dtype", list(FP8))
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_gather(kvx_provider, kvx_call_options, kind, dtype):
    """A PACKED gather of 300 sequences from each layout of an E4M3 / E5M2 cache into outputs of its dtype
    (raw bytes)."""
    _gather(kvx_provider, kvx_call_options(), kind, FP8[dtype], _seed(KINDS.index(kind), list(FP8).index(dtype), 6),
            CL_FP8)


@conformance("matrix.ragged.gather", CL, REQUIRED, "tables", "gather", feature="ragged")
@pytest.mark.parametrize("dtype", list(BASELINE) + list(FP8))
@pytest.mark.parametrize("kind", KINDS)
def test_ragged_gather(kvx_provider, kvx_call_options, kind, dtype):
    """A RAGGED gather of 300 sequences (S64 ids, indptr and lengths) from each layout of each cache dtype:
    token t of sequence s from block ``indices[indptr[s] + t]`` (R-DATA), every array at its own width."""
    dt = {**BASELINE, **FP8}[dtype]
    _gather(kvx_provider, kvx_call_options(), kind, dt, _seed(KINDS.index(kind), list({**BASELINE, **FP8}).index(dtype),
                                                              7), CL if dtype in BASELINE else CL_FP8, ragged=True)


@conformance("matrix.kv_offsets.gather", CL, REQUIRED, "tables", "gather", feature="kv_offsets")
@pytest.mark.parametrize("dtype", list(BASELINE))
def test_kv_offsets_gather(kvx_provider, kvx_call_options, dtype):
    """A KV_OFFSETS gather of 300 sequences of 2 beams (S64 lengths) from F16, BF16 and F32 pools: the
    entries of (sequence, beam) rows, K's and V's apart."""
    dt = BASELINE[dtype]
    seed = _seed(list(BASELINE).index(dtype), 8)
    primary = 64
    cache = cb.kv_offsets_cache(GEOM, dt, primary_blocks=primary, seed=seed)
    mb = -(-MAX_SEQ_LEN // GEOM.block_size)
    offsets = cb.rng_for(seed + 1).integers(0, primary, size=(SEQS, 2, 2, mb)).astype(np.int64)
    case = cb.kv_offsets_gather(cache, offsets, _lengths(seed + 2), MAX_SEQ_LEN, seed=seed + 3, lens_dtype=DType.S64,
                                label=f"KV_OFFSETS gather of {SEQS} sequences x 2 beams (max_seq_len {MAX_SEQ_LEN}) "
                                      f"from {dt.name} pools of {primary} blocks, S64 lengths")
    verify_gather(kvx_provider, case, kvx_call_options(), clause=CL, feature=())
