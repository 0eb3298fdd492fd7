"""TensorRT-LLM-shaped caches (seed 003, kvx-abi-1.1; docs/adapters.md, TensorRT-LLM rows).

The KV cache manager's pool is ``[num_blocks, num_layers, 2, H, tokens_per_block, D]``;
one layer's ``KVBlockArray`` is described as BLOCK_HND views (for the writes: new
tokens land through slots of pool blocks) plus the layer's pool pointers, and read
through ``block_offsets[B, W, 2, M]`` of ``KVCacheIndex`` values (KV_OFFSETS):

- ``kv_offsets.decode``: prefill and decode of several requests, one beam;
- ``kv_offsets.beam2``: beam search with two beams sharing the prompt blocks; the
  partly filled shared block is copied on write (block manager fork), each beam
  then writes its own tokens, and the gather reads every beam through its offsets;
- ``kv_offsets.secondary``: early blocks offloaded to the secondary pool (bit 31).
"""
from __future__ import annotations

import numpy as np
import pytest

from kvx_conformance.abi.header import DType
from kvx_conformance.adapters import trtllm
from kvx_conformance.adapters.trtllm import PoolBlock
from kvx_conformance.results.outcomes import INFORMATIONAL, REQUIRED, conformance

from ._scenario import CL_REFUSED, CL_SCENARIO, Scenario, churned_manager, not_expressible, values

CL = CL_SCENARIO + "; spec 5.1 (KV_OFFSETS), 6.7; kvx-abi-1.1"
LAYERS, LAYER = 2, 1

#: (num_kv_heads, head_dim, tokens_per_block, num_blocks)
POOLS = {
    "llama3_8b": (8, 128, 16, 7),
    "llama70b_tp8": (1, 128, 32, 10),
    "h2_d64": (2, 64, 32, 10),
}


def _pool(name, seed, dtype=DType.F16, secondary_blocks=0):
    h, d, t, nb = POOLS[name]
    pool = values(dtype, (nb, LAYERS, 2, h, t, d), seed)
    sec = values(dtype, (secondary_blocks, LAYERS, 2, h, t, d), seed + 1) if secondary_blocks else None
    adapted = trtllm.block_array(pool, layer_idx=LAYER, num_kv_heads=h, tokens_per_block=t, head_dim=d,
                                 secondary_pool=sec)
    return pool, sec, adapted


def _copy_blocks(pool, copies):
    """The copy-on-write copies the block manager asked for (every layer, K and V)."""
    for src, dst in copies:
        pool[dst] = pool[src]


def _slots(bm, seqs):
    """TensorRT-LLM's kernels place a token at (block of its position, offset); the
    KVX write reaches the same element through the slot of that pool block."""
    return bm.slot_mapping(seqs, dtype=DType.S32)


@conformance("engine.trtllm.kv_offsets.decode", CL, REQUIRED, "engines", ("write", "gather"), feature="kv_offsets")
@pytest.mark.parametrize("shape", ["llama3_8b", "llama70b_tp8"])
def test_kv_offsets_decode(kvx_provider, kvx_call_options, kvx_claims, shape):
    pool, _, adapted = _pool(shape, 201)
    _, _, t, nb = POOLS[shape]
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, adapted, seed=201,
                   what=f"TensorRT-LLM KVBlockArray layer {LAYER}/{LAYERS} {shape} tokens_per_block {t}")
    bm = churned_manager(nb, t, seed=202)
    seqs = ["a", "b", "c"]
    for s, n in zip(seqs, (t + 3, 2 * t - 1, 5)):
        bm.allocate(s, n)
    scn.write(_slots(bm, seqs), label="prefill of 3 requests through the layer's HND views")
    for _ in range(2):
        for s in seqs:
            bm.append_tokens(s, 1)
        scn.write(_slots(bm, seqs), label="decode of 3 requests")
    offs = trtllm.block_offsets([bm.blocks(s) for s in seqs], num_layers=LAYERS)
    lens = bm.seq_lens(seqs)
    scn.gather(trtllm.kv_offsets_table(offs), lens, int(lens.lengths.max()), label="block_offsets [3, 1, 2, M]")


@conformance("engine.trtllm.kv_offsets.beam2", CL, REQUIRED, "engines", ("write", "gather"), feature="kv_offsets")
@pytest.mark.parametrize("shape", ["llama70b_tp8", "h2_d64"])
def test_kv_offsets_beam2(kvx_provider, kvx_call_options, kvx_claims, shape):
    pool, _, adapted = _pool(shape, 211)
    _, _, t, nb = POOLS[shape]
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, adapted, seed=211,
                   what=f"TensorRT-LLM beam width 2, {shape} tokens_per_block {t}")
    bm = churned_manager(nb, t, seed=212)
    prompts = {"a": t + 5, "b": 2 * t - 3}
    for s, n in prompts.items():
        bm.allocate(s, n)
    scn.write(_slots(bm, list(prompts)), label="prefill of 2 prompts")
    beams = {s: [s, f"{s}#1"] for s in prompts}
    for s in prompts:
        bm.fork(s, f"{s}#1")
    every = [b for s in prompts for b in beams[s]]
    for step in range(3):
        for b in every:
            bm.append_tokens(b, 1)
        _copy_blocks(pool, bm.take_copies())  # copy-on-write before the beams write their tokens
        scn.write(_slots(bm, every), label=f"beam decode step {step + 1}: 4 beams, the shared partial block copied")
    if any(bm.blocks(s)[-1] == bm.blocks(f"{s}#1")[-1] for s in prompts):
        raise RuntimeError("harness: the beams must own different last blocks after copy-on-write")
    offs = trtllm.block_offsets([[bm.blocks(b) for b in beams[s]] for s in prompts], beam_width=2, num_layers=LAYERS)
    lens = bm.seq_lens(list(prompts))
    scn.gather(trtllm.kv_offsets_table(offs), lens, int(lens.lengths.max()),
               label="block_offsets [2, 2, 2, M]: beams share the prompt blocks")


@conformance("engine.trtllm.kv_offsets.secondary", CL + ", 10 (secondary pool)", REQUIRED, "engines",
             ("write", "gather"), feature="secondary_pool")
def test_kv_offsets_secondary_pool(kvx_provider, kvx_call_options, kvx_claims):
    pool, sec, adapted = _pool("h2_d64", 221, secondary_blocks=4)
    _, _, t, nb = POOLS["h2_d64"]
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, adapted, seed=221,
                   what=f"TensorRT-LLM primary + secondary pool, h2_d64 tokens_per_block {t}")
    bm = churned_manager(nb, t, seed=222)
    seqs = ["a", "b"]
    for s, n in zip(seqs, (3 * t + 2, 2 * t + 7)):
        bm.allocate(s, n)
    scn.write(_slots(bm, seqs), label="prefill of 2 prompts")
    # offload: the first block of each request moves to the secondary pool (all layers)
    lists = []
    for i, s in enumerate(seqs):
        blocks = bm.blocks(s)
        sec[i] = pool[blocks[0]]
        pool[blocks[0]] = values(DType.F16, pool[blocks[0]].shape, 223 + i)  # the primary copy is reused
        lists.append([PoolBlock(i, secondary=True)] + [PoolBlock(b) for b in blocks[1:]])
    for s in seqs:
        bm.append_tokens(s, 1)
    scn.write(_slots(bm, seqs), label="decode of 2 requests")
    lens = bm.seq_lens(seqs)
    scn.gather(trtllm.kv_offsets_table(trtllm.block_offsets(lists, num_layers=LAYERS)), lens,
               int(lens.lengths.max()), label="first blocks in the secondary pool (bit 31)")


@conformance("engine.trtllm.refused.cyclic", CL_REFUSED, INFORMATIONAL, "engines")
def test_refused_cyclic():
    """Cyclic (sliding-window) KV cache with sink tokens: windowing is not in KVX v1 (spec 10)."""
    pool = np.zeros((2, 1, 2, 1, 16, 8), np.float16)
    not_expressible(lambda: trtllm.block_array(pool, layer_idx=0, num_kv_heads=1, tokens_per_block=16, head_dim=8,
                                               sink_tokens=4, cyclic_cache_len=64))


@conformance("engine.trtllm.refused.tokens_per_block", CL_REFUSED, INFORMATIONAL, "engines")
def test_refused_tokens_per_block():
    """tokens_per_block 48: KV_OFFSETS needs a power of two (spec 5.1)."""
    pool = np.zeros((2, 1, 2, 1, 48, 8), np.float16)
    not_expressible(lambda: trtllm.block_array(pool, layer_idx=0, num_kv_heads=1, tokens_per_block=48, head_dim=8))
