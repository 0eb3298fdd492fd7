"""What a user would write instead of a KVX call: torch-native (device) and numpy (host) peers.

Each peer moves the same bytes as the case, in the same buffers, with the index math
(block id and in-block offset of every token) precomputed outside the timed region:

- write, NHD: ``cache.view(slots, H, D).index_copy_(0, slots, key)`` (torch) /
  ``cache[slots] = key`` (numpy), K and V;
- write, HND / HND_PACKED: advanced-index assignment ``cache[blk, :, off, :] = key``
  (``cache[blk, :, :, off, :] = key.view(n, H, D/x, x)`` for HND_PACKED);
- gather, NHD with whole blocks: ``torch.index_select(cache, 0, block_ids, out=...)``
  (a block copy); otherwise advanced indexing ``cache[blk, :, off, :]`` copied into the
  output (an indexing pass plus a copy);
- FP8 caches: the same on the bytes (``uint8`` views), after ``key.to(float8)`` for writes.
"""
from __future__ import annotations

import numpy as np

from .prepare import Prepared


def _idx(pr: Prepared, j: int):
    """(block, offset) numpy arrays per token of set j, and the per-token pool row for kv_offsets."""
    c, s = pr.case, pr.sets[j]
    bs = c.block_size
    if c.op == "write":
        slots = s.meta["slots"]
        return slots // bs, slots % bs, None
    table = s.meta["table"]
    t = np.arange(c.sl)
    blk = table[:, t // bs].reshape(-1)
    off = np.tile(t % bs, c.seqs)
    return blk, off, table


def _views(pr: Prepared, lib, arrs):
    """Cache tensors shaped by layout: [nb, bs, H, D] / [nb, H, bs, D] / [nb, H, D/x, bs, x]."""
    c, g = pr.case, pr.geom
    shape = tuple(pr.k_layout.shape)
    if pr.pool:
        p = arrs["pool"]
        return p.reshape((2 * g.num_blocks,) + shape[1:]), None
    return arrs["k_cache"].reshape(shape), arrs["v_cache"].reshape(shape)


def torch_peer(pr: Prepared):
    """(fn(i, stream) -> 0, description) on device memory, or (None, reason)."""
    import torch

    c = pr.case
    if c.memory != "device":
        return None, "torch peer runs on device memory only"
    if c.fp4 or c.scale != 1.0:
        return None, "no torch peer for FP4 or scaled FP8 quantization"
    fp8 = c.dtype.startswith("fp8")
    tdt = pr.mem.tdtype
    from .sweep import DTYPES

    cdt = tdt(DTYPES[c.dtype])
    arrs = {k: (v.view(torch.uint8) if fp8 else v) for k, v in pr.arrays.items()}
    kc, vc = _views(pr, torch, arrs)
    H, D = c.heads, c.head_dim
    calls = []
    for j in range(pr.nsets):
        s = pr.sets[j]
        blk, off, table = _idx(pr, j)
        blk_t = torch.from_numpy(blk.astype(np.int64)).cuda()
        off_t = torch.from_numpy(off.astype(np.int64)).cuda()
        if c.op == "write":
            n = c.tokens
            key, val = s.arrays["key"].view(n, H, D), s.arrays["value"].view(n, H, D)
            slots_t = torch.from_numpy(s.meta["slots"]).cuda()
            calls.append(_write_fn(c, kc, vc, key, val, slots_t, blk_t, off_t, cdt, fp8))
        else:
            rows = c.rows
            ok = s.arrays["out_k"].view(torch.uint8 if fp8 else s.arrays["out_k"].dtype)
            ov = s.arrays["out_v"].view(torch.uint8 if fp8 else s.arrays["out_v"].dtype)
            tbl_t = torch.from_numpy(table.reshape(-1).astype(np.int64)).cuda()
            calls.append(_gather_fn(pr, kc, vc, ok, ov, rows, blk_t, off_t, tbl_t))
    desc = _describe(pr)

    def fn(i, stream=None):
        calls[i % len(calls)]()
        return 0

    return fn, desc


def _describe(pr: Prepared) -> str:
    c = pr.case
    if c.op == "write":
        return "index_copy_ (K, V)" if c.layout == "nhd" else "advanced-index assignment (K, V)"
    if c.layout == "nhd" and not pr.pool and c.sl % c.block_size == 0:
        return "index_select of whole blocks (K, V)"
    return "advanced indexing + copy (K, V)"


def _write_fn(c, kc, vc, key, val, slots_t, blk_t, off_t, cdt, fp8):
    H, D = c.heads, c.head_dim
    conv = (lambda x: x.to(cdt).view(__import__("torch").uint8)) if fp8 else (lambda x: x)
    if c.layout == "nhd":
        kf, vf = kc.view(-1, H, D), vc.view(-1, H, D)

        def run():
            kf.index_copy_(0, slots_t, conv(key))
            vf.index_copy_(0, slots_t, conv(val))
    elif c.layout == "hnd":
        def run():
            kc[blk_t, :, off_t, :] = conv(key)
            vc[blk_t, :, off_t, :] = conv(val)
    else:
        x = kc.shape[-1]

        def run():
            kc[blk_t, :, :, off_t, :] = conv(key).view(-1, H, D // x, x)
            vc[blk_t, :, :, off_t, :] = conv(val).view(-1, H, D // x, x)
    return run


def _gather_fn(pr, kc, vc, ok, ov, rows, blk_t, off_t, tbl_t):
    import torch

    c = pr.case
    H, D = c.heads, c.head_dim
    if pr.pool:
        nb = pr.geom.num_blocks

        def run():
            ok.view(rows, H, D).copy_(kc[blk_t, :, off_t, :])
            ov.view(rows, H, D).copy_(kc[blk_t + nb, :, off_t, :])
        return run
    if c.layout == "nhd" and c.sl % c.block_size == 0:
        bs = c.block_size
        nblk = rows // bs

        def run():
            torch.index_select(kc, 0, tbl_t, out=ok.view(nblk, bs, H, D))
            torch.index_select(vc, 0, tbl_t, out=ov.view(nblk, bs, H, D))
        return run
    if c.layout == "nhd":
        def run():
            ok.view(rows, H, D).copy_(kc[blk_t, off_t])
            ov.view(rows, H, D).copy_(vc[blk_t, off_t])
    elif c.layout == "hnd":
        def run():
            ok.view(rows, H, D).copy_(kc[blk_t, :, off_t, :])
            ov.view(rows, H, D).copy_(vc[blk_t, :, off_t, :])
    else:
        x = kc.shape[-1]

        def run():
            ok.view(rows, H, D // x, x).copy_(kc[blk_t, :, :, off_t, :])
            ov.view(rows, H, D // x, x).copy_(vc[blk_t, :, :, off_t, :])
    return run


def numpy_peer(pr: Prepared):
    """(fn(i) -> 0, description) on host memory: numpy fancy indexing."""
    c = pr.case
    if c.memory != "host":
        return None, "numpy peer runs on host memory only"
    if c.fp4 or c.scale != 1.0:
        return None, "no numpy peer for FP4 or scaled FP8 quantization"
    u8 = c.dtype.startswith("fp8")
    arrs = dict(pr.arrays)
    kc, vc = _views(pr, np, arrs)
    H, D = c.heads, c.head_dim
    calls = []
    for j in range(pr.nsets):
        s = pr.sets[j]
        blk, off, table = _idx(pr, j)
        if c.op == "write":
            n = c.tokens
            key = s.arrays["key"].reshape(n, H, D)
            val = s.arrays["value"].reshape(n, H, D)
            cdt = kc.dtype
            calls.append(_np_write(c, kc, vc, key, val, s.meta["slots"], blk, off, cdt, u8))
        else:
            ok, ov = s.arrays["out_k"], s.arrays["out_v"]
            calls.append(_np_gather(pr, kc, vc, ok, ov, c.rows, blk, off))

    def fn(i, stream=None):
        calls[i % len(calls)]()
        return 0

    return fn, ("fancy-index assignment (K, V)" if c.op == "write" else "fancy-index take (K, V)")


def _np_write(c, kc, vc, key, val, slots, blk, off, cdt, convert):
    H, D = c.heads, c.head_dim
    conv = (lambda x: x.astype(cdt)) if convert or key.dtype != cdt else (lambda x: x)
    if c.layout == "nhd":
        kf, vf = kc.reshape(-1, H, D), vc.reshape(-1, H, D)

        def run():
            kf[slots] = conv(key)
            vf[slots] = conv(val)
    elif c.layout == "hnd":
        def run():
            kc[blk, :, off, :] = conv(key)
            vc[blk, :, off, :] = conv(val)
    else:
        x = kc.shape[-1]

        def run():
            kc[blk, :, :, off, :] = conv(key).reshape(-1, H, D // x, x)
            vc[blk, :, :, off, :] = conv(val).reshape(-1, H, D // x, x)
    return run


def _np_gather(pr, kc, vc, ok, ov, rows, blk, off):
    c = pr.case
    H, D = c.heads, c.head_dim
    if pr.pool:
        nb = pr.geom.num_blocks

        def run():
            ok.reshape(rows, H, D)[:] = kc[blk, :, off, :]
            ov.reshape(rows, H, D)[:] = kc[blk + nb, :, off, :]
    elif c.layout == "nhd":
        def run():
            ok.reshape(rows, H, D)[:] = kc[blk, off]
            ov.reshape(rows, H, D)[:] = vc[blk, off]
    elif c.layout == "hnd":
        def run():
            ok.reshape(rows, H, D)[:] = kc[blk, :, off, :]
            ov.reshape(rows, H, D)[:] = vc[blk, :, off, :]
    else:
        x = kc.shape[-1]

        def run():
            ok.reshape(rows, H, D // x, x)[:] = kc[blk, :, :, off, :]
            ov.reshape(rows, H, D // x, x)[:] = vc[blk, :, :, off, :]
    return run
