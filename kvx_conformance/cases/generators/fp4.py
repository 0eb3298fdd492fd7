"""Seeded FP4 cases of any geometry: the plans the generated FP4 tests draw (``strategies.fp4_plans``).

A :class:`Fp4Plan` is the structure of one KVX 1.2 FP4 call (format, layout, geometry, IO dtype,
global scales, slots or block table); :func:`write_case` and :func:`gather_case` build its arrays
from ``plan.seed`` alone, so a plan printed by a failing test rebuilds the same call. Values are
normal draws times per-channel (K) or per-token (V) lognormal magnitudes, with all-zero blocks
and blocks many binades below or above the rest, the blocks an encoder's scale logic branches on.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...abi.header import DType, Fp4Format, Layout
from .. import fp4 as fx

#: NVFP4 global scales of a side: absent (1.0), one per tensor, or one per head
GLOBAL_KINDS = ("none", "per_tensor", "per_head")


@dataclass(frozen=True)
class Fp4Plan:
    """One FP4 call's structure. ``op`` "write": ``tokens`` rows of ``io`` at distinct slots, a share of
    them -1 or (``sentinel``) the non-negative ``invalid_slot``; "gather": ``seqs`` sequences of at most
    ``max_seq_len`` tokens through a PACKED or RAGGED table into ``io`` (F4_E2M1: codes and scales
    raw)."""

    op: str
    fmt: Fp4Format
    layout: Layout
    num_blocks: int
    block_size: int
    heads: int
    head_dim: int
    io: DType
    seed: int
    k_global: str = "none"
    v_global: str = "none"
    tokens: int = 0
    slot_dtype: DType = DType.S64
    sentinel: bool = False
    table: str = "packed"
    index_dtype: DType = DType.S32
    seqs: int = 0
    max_seq_len: int = 0

    def describe(self) -> str:
        head = (f"{fx.FORMAT_NAMES[self.fmt]} cache ({self.layout.name}) of {self.num_blocks} blocks of "
                f"{self.block_size} tokens, {self.heads} heads x {self.head_dim} dims")
        g = f", global scales K {self.k_global} V {self.v_global}" if self.fmt == Fp4Format.NVFP4 else ""
        if self.op == "write":
            inv = "a non-negative invalid_slot" if self.sentinel else "invalid_slot -1"
            return (f"{head}{g}: write of {self.tokens} {self.io.name} rows, {self.slot_dtype.name} slots, "
                    f"{inv}")
        return (f"{head}{g}: gather of {self.seqs} sequences (max_seq_len {self.max_seq_len}) through a "
                f"{self.table.upper()} table of {self.index_dtype.name} ids into {self.io.name}")


def _globals(plan: Fp4Plan, rng: np.random.Generator):
    """(K, V) global scales as ``fx.new_cache`` takes them (None, a float or one per head)."""
    if plan.fmt != Fp4Format.NVFP4:
        return None, None
    out = []
    for kind in (plan.k_global, plan.v_global):
        if kind == "per_tensor":
            out.append(np.float32(rng.lognormal(-4, 2)))
        elif kind == "per_head":
            out.append([np.float32(x) for x in rng.lognormal(-4, 2, plan.heads)])
        else:
            out.append(None)
    return out[0], out[1]


def rows(plan: Fp4Plan, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """K and V rows ``[n, H, D]`` (FP32, each exact in ``plan.io`` where that is F16 / BF16 / F32)."""
    H, D, B = plan.heads, plan.head_dim, fx.block_values(plan.fmt)
    k = rng.standard_normal((n, H, D)) * rng.lognormal(0, 1.5, (1, H, D))
    v = rng.standard_normal((n, H, D)) * rng.lognormal(0, 1, (n, 1, 1))
    if n:
        J = D // B
        blocks = k.reshape(n, H, J, B)  # a few blocks all zero, a few 2^-30 or 2^20 times the rest
        for mult in (0.0, 2.0 ** -30, 2.0 ** 20):
            pick = rng.random((n, H, J)) < 0.02
            blocks[pick] *= mult
    k, v = k.astype(np.float32), v.astype(np.float32)
    if plan.io in fx.IO_NP and plan.io != DType.F32:
        with np.errstate(over="ignore"):
            k, v = (x.astype(fx.IO_NP[plan.io]).astype(np.float32) for x in (k, v))
        # values past the IO dtype's range became inf: informational blocks, kept rare by the draws
    return k, v


def write_case(plan: Fp4Plan):
    """(cache, key, value as ``plan.io`` arrays, slots, invalid_slot) of a write plan."""
    rng = np.random.default_rng(plan.seed)
    gk, gv = _globals(plan, rng)
    cache = fx.new_cache(plan.fmt, plan.num_blocks, plan.block_size, plan.heads, plan.head_dim, plan.layout,
                         k_global=gk, v_global=gv)
    n, total = plan.tokens, plan.num_blocks * plan.block_size
    perm = rng.permutation(total)
    slots = perm[:n].astype(np.int64)
    invalid = -1
    skipped = rng.random(n) < 0.05
    if plan.sentinel:  # a slot of the cache no token writes, named invalid_slot: those tokens are no-ops
        invalid = int(perm[n]) if n < total else int(perm[-1])
        slots[skipped] = invalid
        slots[rng.random(n) < 0.02] = -1
        if invalid in slots[~np.isin(slots, (invalid, -1))]:  # every slot taken: the sentinel's token writes nothing
            slots[slots == invalid] = -1
    else:
        slots[skipped] = -1
    k, v = rows(plan, n, rng)
    io = fx.IO_NP[plan.io]
    return cache, k.astype(io), v.astype(io), slots, invalid


def gather_case(plan: Fp4Plan):
    """(cache, table, seq_lens, max_seq_len, indptr or None, max_blocks_per_seq) of a gather plan; the
    cache holds the oracle's encoding of random rows in every block."""
    rng = np.random.default_rng(plan.seed)
    gk, gv = _globals(plan, rng)
    cache = fx.new_cache(plan.fmt, plan.num_blocks, plan.block_size, plan.heads, plan.head_dim, plan.layout,
                         k_global=gk, v_global=gv)
    nb, bs = plan.num_blocks, plan.block_size
    k, v = rows(plan, nb * bs, rng)
    fx.fill_cache(cache, list(range(nb)), k, v)
    msl, S = plan.max_seq_len, plan.seqs
    lens = rng.integers(0, msl + 1, S)
    if S:
        lens[rng.integers(0, S)] = msl  # one sequence as long as max_seq_len
        if S > 2:
            lens[rng.integers(0, S)] = msl + int(rng.integers(1, 2 * bs + 1))  # one longer: truncated at it
    mbps = -(-msl // bs)
    if plan.table == "ragged":
        ids, indptr = _ragged(rng, nb, [min(int(x), msl) for x in lens])
        return cache, ids, lens.tolist(), msl, indptr, mbps
    table = rng.integers(0, nb, (S, max(mbps, 1)))
    return cache, table, lens.tolist(), msl, None, max(mbps, 1)


def _ragged(rng: np.random.Generator, nb: int, read: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Flat RAGGED ids (one per token, R-DATA: token t of sequence s reads ``indices[indptr[s] + t]``) and
    indptr, with unused ids before the first range and after some ranges."""
    lead = int(rng.integers(0, 4))
    parts, indptr = [rng.integers(0, nb, lead)], [lead]
    for n in read:
        n += int(rng.integers(0, 3))
        parts.append(rng.integers(0, nb, n))
        indptr.append(indptr[-1] + n)
    return np.concatenate(parts).astype(np.int64), np.array(indptr, np.int64)
