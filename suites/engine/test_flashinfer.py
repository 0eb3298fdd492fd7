"""FlashInfer-shaped caches and metadata (seed 003; docs/adapters.md, FlashInfer rows).

The cache is one ``[max_pages, 2, page_size, H, D]`` (NHD) or ``[max_pages, 2, H,
page_size, D]`` (HND) tensor, K at index 0 of the 2-axis and V at 1. The batch is
described by ``paged_kv_indptr``, ``paged_kv_indices`` and ``paged_kv_last_page_len``
(int32, made from the block manager's tables with ``flashinfer.from_packed``). New
tokens are placed the way ``append_paged_kv_cache`` places them: token at position
``p`` of request ``b`` goes to page ``indices[indptr[b] + p // page_size]``, offset
``p % page_size``; the gather reads the batch through ``flashinfer.to_kvx`` as a
PACKED or a RAGGED table.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvx_conformance.abi.descriptors import SlotMapping
from kvx_conformance.abi.header import DType, TableFormat
from kvx_conformance.adapters import flashinfer
from kvx_conformance.results.outcomes import REQUIRED, conformance

from ._scenario import CL_SCENARIO, SHAPES, Scenario, churned_manager, values

CL = CL_SCENARIO
PAGE = 16


def _cache(layout, nb, h, d, seed, dtype=DType.F16):
    shape = (nb, 2, PAGE, h, d) if layout == "NHD" else (nb, 2, h, PAGE, d)
    return flashinfer.paged_kv_cache(values(dtype, shape, seed), kv_layout=layout)


def _metadata(bm, seqs):
    return flashinfer.from_packed(bm.packed_table(seqs), bm.seq_lens(seqs), PAGE)


def append_slots(meta: flashinfer.PagedKVMetadata, batch: np.ndarray, positions: np.ndarray) -> SlotMapping:
    """Where ``append_paged_kv_cache`` puts each new token, as KVX slots."""
    page = meta.indices[meta.indptr[batch] + positions // PAGE].astype(np.int64)
    return SlotMapping(page * PAGE + positions % PAGE, dtype=DType.S64, invalid_slot=-1)


def _append(scn, bm, seqs, new: dict, label: str):
    """Grow the requests in ``new`` (tokens each), rebuild the metadata, write the tokens."""
    for s, n in new.items():
        bm.append_tokens(s, n)
    meta = _metadata(bm, seqs)
    batch = np.concatenate([np.full(new.get(s, 0), i) for i, s in enumerate(seqs)]).astype(np.int64)
    pos = np.concatenate([np.arange(bm.num_tokens(s) - new.get(s, 0), bm.num_tokens(s)) for s in seqs])
    slots = append_slots(meta, batch, pos.astype(np.int64))
    expected = bm.slot_mapping([s for s in seqs if new.get(s, 0)]).slots
    if not np.array_equal(slots.slots, expected):
        raise RuntimeError("harness: the FlashInfer placement differs from the block manager's slots")
    scn.write(slots, label=label)
    return meta


def _gather(scn, meta, fmt, label):
    table, lens = flashinfer.to_kvx(meta.indptr, meta.indices, meta.last_page_len, PAGE, format=fmt)
    scn.gather(table, lens, int(lens.lengths.max()), label=label)


@conformance("engine.flashinfer.nhd.decode", CL, REQUIRED, "engines", ("write", "gather"))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_nhd_decode(kvx_provider, kvx_call_options, kvx_claims, shape):
    h, d = SHAPES[shape]
    nb = 12
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, _cache("NHD", nb, h, d, 401), seed=401,
                   what=f"FlashInfer NHD [pages, 2, 16, H, D] {shape} F16")
    bm = churned_manager(nb, PAGE, seed=402)
    seqs = ["a", "b", "c", "d"]
    for s, n in zip(seqs, (16, 33, 1, 47)):  # a full last page, partial ones, a one-token request
        bm.allocate(s, n)
    for _ in range(2):
        meta = _append(scn, bm, seqs, {s: 1 for s in seqs}, "decode of 4 requests")
    _gather(scn, meta, TableFormat.PACKED, "indptr/indices/last_page_len as PACKED")


@conformance("engine.flashinfer.hnd.prefill", CL, REQUIRED, "engines", ("write", "gather"))
@pytest.mark.parametrize("shape", ["llama3_8b", "h2_d64"])
def test_hnd_prefill(kvx_provider, kvx_call_options, kvx_claims, shape):
    h, d = SHAPES[shape]
    nb = 12
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, _cache("HND", nb, h, d, 411), seed=411,
                   what=f"FlashInfer HND [pages, 2, H, 16, D] {shape} F16")
    bm = churned_manager(nb, PAGE, seed=412)
    seqs = ["a", "b", "c"]
    for s in seqs:
        bm.allocate(s, 0)
    meta = _append(scn, bm, seqs, {"a": 40, "b": 16, "c": 57}, "prefill of 3 requests")
    _gather(scn, meta, TableFormat.PACKED, "indptr/indices/last_page_len as PACKED")


@conformance("engine.flashinfer.ragged.mixed", CL + "; spec 5.1 (RAGGED)", REQUIRED, "engines", ("write", "gather"),
             feature="ragged")
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_ragged_mixed(kvx_provider, kvx_call_options, kvx_claims, layout):
    h, d = SHAPES["llama70b_tp8"]
    nb = 12
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, _cache(layout, nb, h, d, 421), seed=421,
                   what=f"FlashInfer {layout} 1x128 F16, RAGGED metadata")
    bm = churned_manager(nb, PAGE, seed=422)
    for s, n in (("r0", 20), ("r1", 31), ("p", 0)):
        bm.allocate(s, n)
    seqs = ["r0", "r1", "p"]
    meta = _append(scn, bm, seqs, {"r0": 1, "r1": 1, "p": 37}, "decode of 2 requests + a prompt of 37")
    _gather(scn, meta, TableFormat.RAGGED, "indptr/indices/last_page_len as RAGGED (one entry per token)")
