"""``kvx_gather_kv`` as the readings define it (R-ORDER, R-GATHER, R-DATA, R-IO, R-CONVERT).

Output row ``r = (s * beam_width + beam) * max_seq_len + t`` holds token ``t`` of
sequence ``s`` for ``t < n_s = min(seq_lens[s], max_seq_len)``; every other row keeps
its initial contents.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvx_conformance.abi import header as abi
from kvx_conformance.abi.header import DType, Layout, Memory, Status, TableFormat
from kvx_conformance.cases.case import GatherCase, Result

from . import convert, metadata
from .addressing import cache_offsets, io_offsets, pool_offsets
from .cview import CaseError, dims, gather_view, is_null
from .rules import RULES
from .storage import check_bounds, typed_view
from .validate import descriptor_violations

NULL_INDEX = 0xFFFFFFFF
SECONDARY_BIT = 0x80000000


@dataclass
class TokenPlan:
    """One entry per gathered (sequence, beam, token)."""

    rows: np.ndarray  # output row
    seq: np.ndarray
    beam: np.ndarray
    token: np.ndarray


def token_plan(n: np.ndarray, beam_width: int, max_seq_len: int) -> TokenPlan:
    n_pair = np.repeat(n, beam_width)  # pair p = s * beam_width + beam
    total = int(n_pair.sum())
    pair = np.repeat(np.arange(n_pair.size, dtype=np.int64), n_pair)
    start = np.cumsum(n_pair) - n_pair
    token = np.arange(total, dtype=np.int64) - np.repeat(start, n_pair)
    return TokenPlan(pair * max_seq_len + token, pair // beam_width, pair % beam_width, token)


def data_check(
    case: GatherCase, c: abi.kvx_cache_desc_t, g: abi.kvx_gather_desc_t
) -> tuple[str, dict]:
    """R-DATA: (violated rule id or "", decoded metadata for the gather)."""
    t, sl = g.block_table, g.seq_lens
    fmt = TableFormat(t.format)
    S, mb, bs, nb = t.seq_count, t.max_blocks_per_seq, c.block_size, c.num_blocks
    meta: dict = {}
    if fmt == TableFormat.RAGGED:
        indptr = metadata.indptr(case, t.indptr_dtype, S + 1)
        if indptr[0] < 0:
            return "R-DATA.ragged_indptr_first", meta
        if np.any(np.diff(indptr) < 0):
            return "R-DATA.ragged_indptr_monotonic", meta
        if indptr[S] != t.indices_count:
            return "R-DATA.ragged_indptr_last", meta
        meta["indptr"] = indptr
    lengths = metadata.lengths(case, sl.dtype, S)
    if np.any(lengths < 0):
        return "R-DATA.negative_length", meta
    n = np.minimum(lengths, np.int64(g.max_seq_len))
    meta["n"] = n
    nblocks = -(-n // bs)
    if np.any(nblocks > mb):
        return "R-DATA.max_blocks", meta
    idx = metadata.indices(case, t.index_dtype, t.indices_count)
    meta["indices"] = idx
    if fmt == TableFormat.PACKED:
        table = idx.reshape(S, mb)
        used = np.arange(mb)[None, :] < nblocks[:, None]
        if np.any(used & ((table < 0) | (table >= nb))):
            return "R-DATA.packed_block_id", meta
    elif fmt == TableFormat.RAGGED:
        indptr = meta["indptr"]
        if np.any(n > indptr[1:] - indptr[:-1]):
            return "R-DATA.ragged_seq_range", meta
        plan = token_plan(n, 1, max(g.max_seq_len, 1))
        ids = idx[indptr[plan.seq] + plan.token]
        if np.any((ids < 0) | (ids >= nb)):
            return "R-DATA.ragged_block_id", meta
    else:
        table = (idx & 0xFFFFFFFF).reshape(S, t.beam_width, 2, mb)
        used = (np.arange(mb)[None, :] < nblocks[:, None])[:, None, None, :]
        if np.any(used & (table == NULL_INDEX)):
            return "R-DATA.kv_offsets_null_index", meta
        if is_null(c.pool.secondary) and np.any(used & ((table & SECONDARY_BIT) != 0)):
            return "R-DATA.kv_offsets_secondary_null", meta
    return "", meta


def _cache_values(case: GatherCase, c: abi.kvx_cache_desc_t, side: str, blocks, offs, h, d) -> np.ndarray:
    cdesc = getattr(c, side)
    init = case.cache.k_init if side == "k" else case.cache.v_init
    store = typed_view(init, cdesc.dtype, f"{side} cache")
    shape, stride = dims(cdesc)
    pack = shape[4] if cdesc.layout == Layout.BLOCK_HND_PACKED else 1
    off = cache_offsets(Layout(cdesc.layout), stride, pack, blocks, offs, h, d) + getattr(case.cache, side).origin
    check_bounds(off, store.size, f"{side} cache")
    return store[off]


def _pool_values(case: GatherCase, c: abi.kvx_cache_desc_t, entries: np.ndarray, offs, h, d) -> np.ndarray:
    """Values of KVCacheIndex ``entries`` (uint32, shape [N, 1, 1]) from the primary/secondary pools."""
    pool = case.cache.pool
    if pool is None:
        raise CaseError("KV_OFFSETS gather without a PoolCase")
    secondary = (entries & SECONDARY_BIT) != 0
    blocks = (entries & 0x7FFFFFFF).astype(np.int64)
    off = pool_offsets(blocks, offs, h, d, c.num_kv_heads, c.block_size, c.head_dim)
    prim = typed_view(pool.primary, c.k.dtype, "primary pool")
    sec_mask = np.broadcast_to(secondary, off.shape)
    out = np.empty(off.shape, prim.dtype)
    check_bounds(off[~sec_mask], prim.size, "primary pool")
    out[~sec_mask] = prim[off[~sec_mask]]
    if np.any(sec_mask):
        if pool.secondary is None:
            raise CaseError("KV_OFFSETS entry selects the secondary pool but the case has none")
        sec = typed_view(pool.secondary, c.k.dtype, "secondary pool")
        check_bounds(off[sec_mask], sec.size, "secondary pool")
        out[sec_mask] = sec[off[sec_mask]]
    return out


def expected_gather(case: GatherCase, memory: Memory = Memory.HOST, memory_supported: bool = True,
                    served: tuple[str, ...] = ()) -> Result:
    """Status and output storage (``{"k", "v"}``, flat, from the case's poisoned init arrays)."""
    view = gather_view(case, memory)
    out = {"k": case.out_k_init.copy(), "v": case.out_v_init.copy()}
    violations = descriptor_violations(view, "gather", memory_supported, served)
    if violations:
        return Result(int(RULES[violations[0]].status), out, rule=violations[0])
    c, g = view.cache, view.desc
    rule, meta = data_check(case, c, g)
    if rule:
        return Result(int(RULES[rule].status), out, rule=rule)
    t = g.block_table
    fmt = TableFormat(t.format)
    bw = t.beam_width if fmt == TableFormat.KV_OFFSETS else 1
    plan = token_plan(meta["n"], bw, g.max_seq_len)
    if plan.rows.size == 0:
        return Result(int(Status.OK), out)
    H, D, bs, mb = c.num_kv_heads, c.head_dim, c.block_size, t.max_blocks_per_seq
    idx = meta["indices"]
    rows = plan.rows.reshape(-1, 1, 1)
    offs = (plan.token % bs).reshape(-1, 1, 1)
    h = np.arange(H, dtype=np.int64).reshape(1, -1, 1)
    d = np.arange(D, dtype=np.int64).reshape(1, 1, -1)
    values: dict[str, np.ndarray] = {}
    if fmt == TableFormat.KV_OFFSETS:
        table = (idx & 0xFFFFFFFF).reshape(t.seq_count, bw, 2, mb)
        j = plan.token // bs
        for kv, side in ((0, "k"), (1, "v")):
            entries = table[plan.seq, plan.beam, kv, j].reshape(-1, 1, 1)
            values[side] = _pool_values(case, c, entries, offs, h, d)
        cache_dtypes = {"k": DType(c.k.dtype), "v": DType(c.k.dtype)}
    else:
        if fmt == TableFormat.PACKED:
            blocks = idx.reshape(t.seq_count, mb)[plan.seq, plan.token // bs]
        else:
            blocks = idx[meta["indptr"][plan.seq] + plan.token]
        blocks = blocks.reshape(-1, 1, 1)
        for side in ("k", "v"):
            values[side] = _cache_values(case, c, side, blocks, offs, h, d)
        cache_dtypes = {"k": DType(c.k.dtype), "v": DType(c.v.dtype)}
    for side, tdesc in (("k", g.io.key), ("v", g.io.value)):
        store = typed_view(out[side], tdesc.dtype, f"out {side}")
        shape, stride = dims(tdesc)
        dst = io_offsets(shape, stride, rows, h, d) + (case.out_layout if side == "k" else case.value_out).origin
        check_bounds(dst, store.size, f"out {side}")
        store[dst] = convert.convert(values[side], cache_dtypes[side], DType(tdesc.dtype))
    return Result(int(Status.OK), out)
