"""vLLM-shaped caches and metadata (seed 003; docs/adapters.md, vLLM rows).

- ``flash_nhd``: ``reshape_and_cache_flash`` caches ``[num_blocks, block_size, H, D]``
  (BF16, as Llama-3 serves), int64 ``slot_mapping`` padded with -1 to the CUDA-graph
  batch size, int32 ``block_table`` rows of the persistent buffer;
- ``flash_hnd``: the same logical view over HND memory (layout chosen by strides);
- ``flash_attn_combined`` / ``flashinfer_combined``: one ``[2, blocks, ...]`` or
  ``[blocks, 2, ...]`` tensor per layer, K and V descriptors at their offsets;
- ``paged``: packed K ``[blocks, H, D/x, block_size, x]`` (x = 16 bytes / element)
  and V ``[blocks, H, D, block_size]`` (V described through transposed strides);
- ``hybrid``: manager blocks of 32 tokens, kernel blocks of 16;
- ``dcp``: decode context parallelism (virtual blocks of ``block_size * W``; other
  ranks' tokens are -1 slots), one rank's cache;
- ``fp8``: an FP8 cache held as uint8 with ``kv_cache_dtype``, BF16 inputs, scales.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvx_conformance.abi.descriptors import SeqLens
from kvx_conformance.abi.header import DType
from kvx_conformance.adapters import vllm
from kvx_conformance.cases import build as cb
from kvx_conformance.results.outcomes import INFORMATIONAL, REQUIRED, conformance

from ._scenario import (CL_REFUSED, CL_SCENARIO, SHAPE_PARAMS, Scenario, churned_manager, fp8_bytes,
                        not_expressible, padded_table, values)

CL = CL_SCENARIO
BS = 16
CUDA_GRAPH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # vLLM's default capture sizes start like this


def graph_size(n: int) -> int:
    """The CUDA-graph batch a step of ``n`` tokens is padded to."""
    return next((s for s in CUDA_GRAPH_SIZES if s >= n), n)


def _flash_cache(num_blocks, h, d, seed, dtype=DType.BF16, hnd_memory=False):
    if hnd_memory:  # memory [blocks, H, block_size, D], viewed as [blocks, block_size, H, D]
        k = values(dtype, (num_blocks, h, BS, d), seed).transpose(0, 2, 1, 3)
        v = values(dtype, (num_blocks, h, BS, d), seed + 1).transpose(0, 2, 1, 3)
    else:
        k = values(dtype, (num_blocks, BS, h, d), seed)
        v = values(dtype, (num_blocks, BS, h, d), seed + 1)
    return vllm.flash_cache(k, v)


def _gather_all(scn, bm, seqs, rows, label):
    """vLLM's attention metadata for the batch: the persistent int32 block table (rows
    past the batch are CUDA-graph padding) and seq_lens (0 for padded requests)."""
    width = max(len(bm.blocks(s)) for s in seqs)
    table = vllm.block_table(padded_table(bm, seqs, width, rows=rows))
    lens = np.zeros(rows, np.int64)
    lens[: len(seqs)] = [bm.num_tokens(s) for s in seqs]
    scn.gather(table, SeqLens(lens, DType.S32), int(lens.max()), label=label)


def _prefill(scn, bm, prompts: dict, label: str):
    for s, n in prompts.items():
        bm.allocate(s, n)
    total = sum(prompts.values())
    slots = vllm.slot_mapping(bm.slot_mapping(list(prompts), pad_to=graph_size(total)).slots)
    scn.write(slots, label=f"{label}: prefill of {list(prompts.values())} tokens, padded to {graph_size(total)}")


def _decode(scn, bm, seqs, steps: int, label: str):
    for _ in range(steps):
        for s in seqs:
            bm.append_tokens(s, 1)
        slots = vllm.slot_mapping(bm.slot_mapping(seqs, pad_to=graph_size(len(seqs))).slots)
        scn.write(slots, label=f"{label}: decode of {len(seqs)} sequences, CUDA-graph padded to "
                               f"{graph_size(len(seqs))} with -1")


@conformance("engine.vllm.flash_nhd.prefill", CL, REQUIRED, "engines", ("write", "gather"))
@pytest.mark.parametrize("h,d", SHAPE_PARAMS)
def test_flash_nhd_prefill(kvx_provider, kvx_call_options, kvx_claims, h, d):
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, _flash_cache(12, h, d, 101), seed=101,
                   what=f"vLLM flash NHD {h}x{d} BF16")
    bm = churned_manager(12, BS, seed=102)
    _prefill(scn, bm, {"a": 37, "b": 5, "c": 61}, "3 prompts")
    _gather_all(scn, bm, ["a", "b", "c"], 4, "block_table of 3 requests + 1 padded row")


@conformance("engine.vllm.flash_nhd.decode", CL, REQUIRED, "engines", ("write", "gather"))
@pytest.mark.parametrize("h,d", SHAPE_PARAMS)
def test_flash_nhd_decode(kvx_provider, kvx_call_options, kvx_claims, h, d):
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, _flash_cache(12, h, d, 111), seed=111,
                   what=f"vLLM flash NHD {h}x{d} BF16")
    bm = churned_manager(12, BS, seed=112)
    seqs = ["a", "b", "c", "d", "e"]
    for s, n in zip(seqs, (15, 31, 3, 16, 40)):  # two of them cross a block boundary on the first step
        bm.allocate(s, n)
    _decode(scn, bm, seqs, 2, "5 running requests")
    _gather_all(scn, bm, seqs, 8, "block_table of 5 requests, CUDA-graph padded to 8 rows")


@conformance("engine.vllm.flash_nhd.mixed", CL, REQUIRED, "engines", ("write", "gather"))
@pytest.mark.parametrize("h,d", SHAPE_PARAMS[:2])
def test_flash_nhd_mixed(kvx_provider, kvx_call_options, kvx_claims, h, d):
    """Chunked prefill: decode tokens of running requests and a prompt chunk in one batch."""
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, _flash_cache(12, h, d, 121), seed=121,
                   what=f"vLLM flash NHD {h}x{d} BF16 chunked prefill")
    bm = churned_manager(12, BS, seed=122)
    bm.allocate("r0", 20)
    bm.allocate("r1", 47)
    bm.allocate("p", 0)
    for chunk in (24, 19):
        bm.append_tokens("r0", 1)
        bm.append_tokens("r1", 1)
        bm.append_tokens("p", chunk)
        n = 2 + chunk
        slots = vllm.slot_mapping(bm.slot_mapping(["r0", "r1", "p"], pad_to=graph_size(n)).slots)
        scn.write(slots, label=f"2 decode tokens + a prefill chunk of {chunk}, padded to {graph_size(n)}")
    _gather_all(scn, bm, ["r0", "r1", "p"], 4, "3 requests + 1 padded row")


@conformance("engine.vllm.flash_hnd.decode", CL, REQUIRED, "engines", ("write", "gather"), feature="hnd")
@pytest.mark.parametrize("h,d", [SHAPE_PARAMS[0], SHAPE_PARAMS[2]])
def test_flash_hnd_decode(kvx_provider, kvx_call_options, kvx_claims, h, d):
    adapted = _flash_cache(12, h, d, 131, hnd_memory=True)
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, adapted, seed=131,
                   what=f"vLLM flash cache over HND memory {h}x{d} BF16")
    bm = churned_manager(12, BS, seed=132)
    _prefill(scn, bm, {"a": 29, "b": 50}, "2 prompts")
    _decode(scn, bm, ["a", "b"], 3, "2 running requests")
    _gather_all(scn, bm, ["a", "b"], 2, "2 requests")


@conformance("engine.vllm.combined.decode", CL, REQUIRED, "engines", ("write", "gather"))
@pytest.mark.parametrize("backend", ["flash_attn", "flashinfer"])
def test_combined_kv_cache(kvx_provider, kvx_call_options, kvx_claims, backend):
    """One tensor per layer: FlashAttention ``[2, blocks, bs, H, D]``, FlashInfer ``[blocks, 2, bs, H, D]``."""
    h, d, nb = 8, 128, 10
    shape = (2, nb, BS, h, d) if backend == "flash_attn" else (nb, 2, BS, h, d)
    kv = values(DType.F16, shape, 141)
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, vllm.flash_kv_cache(kv, backend=backend),
                   seed=141, what=f"vLLM {backend} combined KV cache {shape} F16")
    bm = churned_manager(nb, BS, seed=142)
    _prefill(scn, bm, {"a": 33, "b": 17, "c": 2}, "3 prompts")
    _decode(scn, bm, ["a", "b", "c"], 1, "3 running requests")
    _gather_all(scn, bm, ["a", "b", "c"], 4, "3 requests + 1 padded row")


def _paged_cache(nb, h, d, seed, dtype=DType.F16):
    x = 16 // 2  # vLLM: x = 16 bytes / element size
    k = values(dtype, (nb, h, d // x, BS, x), seed)
    v = values(dtype, (nb, h, d, BS), seed + 1)
    return vllm.paged_cache(k, v)


@conformance("engine.vllm.paged.prefill", CL, REQUIRED, "engines", ("write", "gather"), feature="hnd_packed")
@pytest.mark.parametrize("h,d", [SHAPE_PARAMS[0], SHAPE_PARAMS[2]])
def test_paged_prefill(kvx_provider, kvx_call_options, kvx_claims, h, d):
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, _paged_cache(12, h, d, 151), seed=151,
                   what=f"vLLM paged (reshape_and_cache) {h}x{d} F16")
    bm = churned_manager(12, BS, seed=152)
    _prefill(scn, bm, {"a": 45, "b": 16, "c": 30}, "3 prompts")
    _gather_all(scn, bm, ["a", "b", "c"], 4, "3 requests + 1 padded row")


@conformance("engine.vllm.paged.decode", CL, REQUIRED, "engines", ("write", "gather"), feature="hnd_packed")
@pytest.mark.parametrize("h,d", [SHAPE_PARAMS[0], SHAPE_PARAMS[1]])
def test_paged_decode(kvx_provider, kvx_call_options, kvx_claims, h, d):
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, _paged_cache(12, h, d, 161), seed=161,
                   what=f"vLLM paged (reshape_and_cache) {h}x{d} F16")
    bm = churned_manager(12, BS, seed=162)
    seqs = ["a", "b", "c"]
    for s, n in zip(seqs, (31, 8, 47)):
        bm.allocate(s, n)
    _decode(scn, bm, seqs, 2, "3 running requests")
    _gather_all(scn, bm, seqs, 4, "3 requests + 1 padded row")


@conformance("engine.vllm.hybrid.decode", CL, REQUIRED, "engines", ("write", "gather"))
def test_hybrid_block_sizes(kvx_provider, kvx_call_options, kvx_claims):
    """Manager blocks of 32 tokens over kernel blocks of 16: tables and slots in kernel blocks."""
    manager_bs, nb_manager = 32, 6
    h, d = 8, 128
    k = values(DType.BF16, (nb_manager * 2, BS, h, d), 171)
    v = values(DType.BF16, (nb_manager * 2, BS, h, d), 172)
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, vllm.flash_cache(k, v), seed=171,
                   what="vLLM hybrid manager 32 / kernel 16 BF16 8x128")
    bm = churned_manager(nb_manager, manager_bs, seed=173)
    seqs = ["a", "b"]
    prompts = [40, 23]
    for s, n in zip(seqs, prompts):
        bm.allocate(s, n)
    counts = [len(bm.blocks(s)) for s in seqs]
    mt = padded_table(bm, seqs, 3)
    kernel_table = vllm.hybrid_block_table(mt, counts, manager_bs, BS)
    table2d = np.asarray(kernel_table.indices).reshape(kernel_table.seq_count, kernel_table.max_blocks_per_seq)
    qsl = np.concatenate([[0], np.cumsum(prompts)])
    pos = np.concatenate([np.arange(n) for n in prompts])
    scn.write(vllm.compute_slot_mapping(table2d, qsl, pos, BS, pad_to=graph_size(len(pos))),
              label="prefill through compute_slot_mapping on kernel blocks")
    for s in seqs:
        bm.append_tokens(s, 1)
    counts = [len(bm.blocks(s)) for s in seqs]
    kernel_table = vllm.hybrid_block_table(padded_table(bm, seqs, 3), counts, manager_bs, BS)
    table2d = np.asarray(kernel_table.indices).reshape(kernel_table.seq_count, kernel_table.max_blocks_per_seq)
    pos = np.array([bm.num_tokens(s) - 1 for s in seqs])
    scn.write(vllm.compute_slot_mapping(table2d, np.arange(3), pos, BS, pad_to=4), label="decode, padded to 4")
    lens = bm.seq_lens(seqs)
    scn.gather(kernel_table, lens, int(lens.lengths.max()), label="kernel-block table of manager blocks")


@conformance("engine.vllm.dcp.decode", CL, REQUIRED, "engines", ("write", "gather"))
@pytest.mark.parametrize("world,rank,interleave", [(2, 1, 1), (4, 2, 16)], ids=["w2r1i1", "w4r2i16"])
def test_decode_context_parallel(kvx_provider, kvx_call_options, kvx_claims, world, rank, interleave):
    """One rank of decode context parallelism: virtual blocks of ``16 * W`` tokens, the
    rank's tokens interleaved in runs of ``interleave``; other ranks' tokens are -1."""
    h, d, nb = 1, 128, 10
    k = values(DType.BF16, (nb, BS, h, d), 181)
    v = values(DType.BF16, (nb, BS, h, d), 182)
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, vllm.flash_cache(k, v), seed=181,
                   what=f"vLLM DCP world {world} rank {rank} interleave {interleave}, 70B TP8 shape")
    bm = churned_manager(nb, BS * world, seed=183)  # the manager allocates virtual blocks
    seqs, prompts = ["a", "b", "c"], [70, 9, 100]
    for s, n in zip(seqs, prompts):
        bm.allocate(s, n)
    table = padded_table(bm, seqs, 5)
    qsl = np.concatenate([[0], np.cumsum(prompts)])
    pos = np.concatenate([np.arange(n) for n in prompts])
    kw = dict(cp_world_size=world, cp_rank=rank, cp_kv_cache_interleave_size=interleave)
    scn.write(vllm.compute_slot_mapping(table, qsl, pos, BS, pad_to=graph_size(len(pos)), **kw),
              label="prefill of 3 prompts, other ranks' tokens -1")
    for s in seqs:
        bm.append_tokens(s, 1)
    table = padded_table(bm, seqs, 5)
    pos = np.array([bm.num_tokens(s) - 1 for s in seqs])
    scn.write(vllm.compute_slot_mapping(table, np.arange(4), pos, BS, pad_to=4, **kw), label="decode, padded to 4")
    lens = vllm.cp_local_seq_lens([bm.num_tokens(s) for s in seqs], BS, world, rank, interleave)
    scn.gather(vllm.block_table(table), lens, int(lens.lengths.max()), label="this rank's share of every sequence")


@conformance("engine.vllm.fp8.decode", CL, REQUIRED, "engines", ("write", "gather"), feature="fp8")
@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_cache(kvx_provider, kvx_call_options, kvx_claims, kv_cache_dtype):
    """``kv_cache_dtype=fp8*``: a uint8 cache tensor, BF16 inputs quantized with k_scale / v_scale.

    vLLM's ``k_scale`` / ``v_scale`` are 0-d F32 tensors: described as scalar PER_TENSOR scale
    descriptors (spec 6.6: ``ndim`` / ``shape`` "for non-scalar scales"), not as the flat
    ``k_scale`` / ``v_scale`` pointers, whose use without a descriptor is a MAY of spec 6.9
    ("implementations MAY fall back to ``k_scale``/``v_scale``"): a required test does not
    depend on it (readings R-FP8)."""
    h, d, nb = 8, 128, 10
    dt = DType.F8_E4M3 if kv_cache_dtype == "fp8_e4m3" else DType.F8_E5M2
    k = fp8_bytes(dt, (nb, BS, h, d), 191)
    v = fp8_bytes(dt, (nb, BS, h, d), 192)
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, vllm.flash_cache(k, v, kv_cache_dtype=kv_cache_dtype),
                   seed=191, what=f"vLLM {kv_cache_dtype} cache (uint8) 8x128, BF16 inputs")
    bm = churned_manager(nb, BS, seed=193)
    seqs = ["a", "b", "c"]
    for s, n in zip(seqs, (31, 12, 50)):
        bm.allocate(s, n)
    for _ in range(2):
        for s in seqs:
            bm.append_tokens(s, 1)
        slots = vllm.slot_mapping(bm.slot_mapping(seqs, pad_to=4).slots)
        scn.write(slots, io_dtype=DType.BF16, k_scale_desc=cb.scale_spec([0.25], scalar=True),
                  v_scale_desc=cb.scale_spec([4.0], scalar=True), label="decode, scales 0.25 / 4, padded to 4")
    _gather_all(scn, bm, seqs, 4, "3 requests + 1 padded row")


@conformance("engine.vllm.refused.cache_dtype", CL_REFUSED, INFORMATIONAL, "engines")
@pytest.mark.parametrize("what", ["int8", "fp8_e4m3fnuz"])
def test_refused_cache_dtypes(what):
    """int8 caches and ROCm's fp8_e4m3fnuz have no KVX cache dtype (spec 4.3)."""
    k = np.zeros((2, BS, 1, 8), np.int8 if what == "int8" else np.uint8)
    not_expressible(lambda: vllm.flash_cache(k, k, kv_cache_dtype="auto" if what == "int8" else what))


@conformance("engine.vllm.refused.hybrid_kernel_block", CL_REFUSED, INFORMATIONAL, "engines")
def test_refused_hybrid_kernel_block():
    """A kernel block size that does not divide the manager block size."""
    not_expressible(lambda: vllm.hybrid_block_table(np.zeros((1, 1), np.int32), [1], 32, 24))
