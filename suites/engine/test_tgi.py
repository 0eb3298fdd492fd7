"""text-generation-inference-shaped caches and metadata (seed 003; docs/adapters.md, TGI rows).

- ``flashinfer``: BLOCK_SIZE 1, ``[num_blocks, 1, H, D]`` caches, ``slots`` and the
  per-token ``block_tables_ragged`` (RAGGED) for the gather;
- ``flashdecoding``: BLOCK_SIZE 256, ``block_tables_tensor`` (PACKED);
- ``paged``: BLOCK_SIZE 16, packed K with ``x = BLOCK_SIZE // element_size`` and
  strided V;
- ``ragged``: a batch mixing prefill and decode, read through RAGGED tables
  (``block_tables_ragged`` at BLOCK_SIZE 1, ``ragged_from_block_tables`` at 16).

TGI has no padding sentinel (a negative slot would wrap in its store): slots are
never negative here, and a negative one is a refusal.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvx_conformance.abi.header import DType
from kvx_conformance.adapters import tgi
from kvx_conformance.results.outcomes import INFORMATIONAL, REQUIRED, conformance

from ._scenario import CL_REFUSED, CL_SCENARIO, SHAPES, Scenario, churned_manager, not_expressible, \
    padded_table, values

CL = CL_SCENARIO


def _flash(bs, nb, h, d, seed, dtype=DType.F16):
    k = values(dtype, (nb, bs, h, d), seed)
    v = values(dtype, (nb, bs, h, d), seed + 1)
    return tgi.flash_cache(k, v)


def _slots(bm, seqs):
    return tgi.slots(bm.slot_mapping(seqs).slots)  # int64 slots, one per new token


def _ragged(bm, seqs, input_lengths):
    """TGI's ``block_tables_ragged``: ``block_tables[i][:cache_len + input_len]`` concatenated (BLOCK_SIZE 1)."""
    parts = [np.asarray(bm.blocks(s)[: bm.num_tokens(s)], np.int32) for s in seqs]
    cache_lengths = [bm.num_tokens(s) - n for s, n in zip(seqs, input_lengths)]
    return tgi.block_tables_ragged(np.concatenate(parts), np.asarray(input_lengths, np.int32),
                                   np.asarray(cache_lengths, np.int32), 1)


@conformance("engine.tgi.flashinfer.prefill", CL + "; spec 5.1 (RAGGED)", REQUIRED, "engines", ("write", "gather"),
             feature="ragged")
@pytest.mark.parametrize("shape", ["llama3_8b", "llama70b_tp8"])
def test_flashinfer_prefill(kvx_provider, kvx_call_options, kvx_claims, shape):
    h, d = SHAPES[shape]
    nb = 160
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, _flash(1, nb, h, d, 301), seed=301,
                   what=f"TGI flashinfer BLOCK_SIZE 1 {shape} F16")
    bm = churned_manager(nb, 1, seed=302)
    prompts = {"a": 41, "b": 7, "c": 66}
    for s, n in prompts.items():
        bm.allocate(s, n)
    scn.write(_slots(bm, list(prompts)), label="prefill of 3 requests through slots")
    table, lens = _ragged(bm, list(prompts), list(prompts.values()))
    scn.gather(table, lens, int(lens.lengths.max()), label="block_tables_ragged of 3 requests")


@conformance("engine.tgi.ragged.mixed", CL + "; spec 5.1 (RAGGED)", REQUIRED, "engines", ("write", "gather"),
             feature="ragged")
@pytest.mark.parametrize("block_size", [1, 16], ids=["flashinfer_bs1", "paged_bs16"])
def test_ragged_mixed(kvx_provider, kvx_call_options, kvx_claims, block_size):
    """A batch of two decoding requests and a new prompt; the gather reads the batch through RAGGED."""
    h, d = SHAPES["h2_d64"]
    nb = 96 // block_size if block_size > 1 else 96
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, _flash(block_size, nb, h, d, 311), seed=311,
                   what=f"TGI BLOCK_SIZE {block_size} mixed batch 2x64 F16")
    bm = churned_manager(nb, block_size, seed=312)
    bm.allocate("r0", 30)
    bm.allocate("r1", 17)
    scn.write(_slots(bm, ["r0", "r1"]), label="prefill of the running requests")
    bm.append_tokens("r0", 1)
    bm.append_tokens("r1", 1)
    bm.allocate("new", 23)
    seqs, inputs = ["r0", "r1", "new"], [1, 1, 23]
    scn.write(_slots(bm, seqs), label="decode of 2 requests + prefill of 1 in one batch")
    if block_size == 1:
        table, lens = _ragged(bm, seqs, inputs)
    else:
        cache_lengths = [bm.num_tokens(s) - n for s, n in zip(seqs, inputs)]
        table, lens = tgi.ragged_from_block_tables(padded_table(bm, seqs), np.asarray(inputs, np.int32),
                                                   np.asarray(cache_lengths, np.int32), block_size)
    scn.gather(table, lens, int(lens.lengths.max()), label="RAGGED table of the mixed batch")


@conformance("engine.tgi.flashdecoding.decode", CL, REQUIRED, "engines", ("write", "gather"))
@pytest.mark.parametrize("shape", ["h2_d64", "llama70b_tp8"])
def test_flashdecoding_decode(kvx_provider, kvx_call_options, kvx_claims, shape):
    h, d = SHAPES[shape]
    bs, nb = 256, 4
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, _flash(bs, nb, h, d, 321), seed=321,
                   what=f"TGI flashdecoding BLOCK_SIZE 256 {shape} F16")
    bm = churned_manager(nb, bs, seed=322)
    seqs = ["a", "b"]
    for s, n in zip(seqs, (255, 40)):  # "a" crosses into its second block on the first decode step
        bm.allocate(s, n)
    for _ in range(2):
        for s in seqs:
            bm.append_tokens(s, 1)
        scn.write(_slots(bm, seqs), label="decode of 2 requests")
    table = tgi.block_tables_tensor(padded_table(bm, seqs, rows=3), num_reqs=2)
    lens = tgi.seq_lens(np.ones(2, np.int32), np.asarray([bm.num_tokens(s) - 1 for s in seqs], np.int32))
    scn.gather(table, lens, int(lens.lengths.max()), label="block_tables_tensor of 2 requests")


@conformance("engine.tgi.paged.decode", CL, REQUIRED, "engines", ("write", "gather"), feature="hnd_packed")
@pytest.mark.parametrize("shape", ["llama3_8b", "h4_d256"])
def test_paged_decode(kvx_provider, kvx_call_options, kvx_claims, shape):
    h, d = SHAPES[shape]
    bs, nb, dtype = 16, 10, DType.BF16
    x = tgi.pack_factor(bs, 2)  # BLOCK_SIZE // element_size = 8
    k = values(dtype, (nb, h, d // x, bs, x), 331)
    v = values(dtype, (nb, h, d, bs), 332)
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, tgi.paged_cache(k, v), seed=331,
                   what=f"TGI paged BLOCK_SIZE 16 x={x} {shape} BF16")
    bm = churned_manager(nb, bs, seed=333)
    seqs = ["a", "b", "c"]
    for s, n in zip(seqs, (33, 15, 20)):
        bm.allocate(s, n)
    scn.write(_slots(bm, seqs), label="prefill of 3 requests")
    for s in seqs:
        bm.append_tokens(s, 1)
    scn.write(_slots(bm, seqs), label="decode of 3 requests")
    table = tgi.block_tables_tensor(padded_table(bm, seqs))
    lens = bm.seq_lens(seqs)
    scn.gather(table, lens, int(lens.lengths.max()), label="block_tables_tensor of 3 requests")


@conformance("engine.tgi.refused.ragged_block16", CL_REFUSED, INFORMATIONAL, "engines")
def test_refused_native_ragged_block16():
    """TGI's own block_tables_ragged is per token only at BLOCK_SIZE 1."""
    not_expressible(lambda: tgi.block_tables_ragged(np.zeros(3, np.int32), np.array([3], np.int32),
                                                    np.array([0], np.int32), 16))


@conformance("engine.tgi.refused.negative_slots", CL_REFUSED, INFORMATIONAL, "engines")
def test_refused_negative_slots():
    """A negative TGI slot wraps to the cache's end in TGI, and is a no-op in KVX."""
    not_expressible(lambda: tgi.slots(np.array([4, -1, 7], np.int64)))
