"""Shared machinery of the engine-shaped scenarios (not a test module).

A scenario owns engine-native arrays (numpy, in the shapes and strides the engine
allocates), describes them through :mod:`kvx_conformance.adapters`, and runs a
sequence of steps against the provider on the run's memory type:

- ``write``: the new tokens of a step (prefill, decode, chunked prefill) through a
  slot mapping made by :class:`~kvx_conformance.adapters.block_manager.BlockManager` and put
  into the engine's own metadata format (CUDA-graph padding as -1 slots);
- ``gather``: the cached tokens of every sequence through the engine's table.

Every step is compared with the oracle (``kvx_conformance.reference_impl``) by
:func:`kvx_conformance.cases.checks.verify_write` / ``verify_gather``: status, guard bytes,
and the whole cache (write) or the outputs and the unchanged cache (gather),
bit-exactly. The memory after a checked write is loaded back into the engine arrays
(:meth:`AdaptedCache.load`), so the next step starts from what the provider wrote.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvx_conformance.abi.header import DType
from kvx_conformance.adapters import AdaptedCache, AdapterError
from kvx_conformance.adapters.block_manager import BlockManager
from kvx_conformance.cases import build as cb
from kvx_conformance.cases.checks import verify_gather, verify_write
from kvx_conformance.results.engines import NOT_EXPRESSIBLE
from kvx_conformance.results.outcomes import ConformanceFailure, Unsupported

CL_WRITE = "spec 4.1, 4.2, 5.2, 7; R-CACHE, R-WRITE"
CL_GATHER = "spec 5.1, 5.3, 6.10, 7; R-CACHE, R-GATHER, R-DATA"
CL_REFUSED = "spec 4.2, 4.3, 5.1, 10 (what KVX v1.1 can express)"
#: a scenario of writes and gathers
CL_SCENARIO = "spec 4.1, 4.2, 5.1, 5.2, 5.3, 6.10, 7; R-CACHE, R-WRITE, R-GATHER, R-DATA"

#: (num_kv_heads, head_dim) of real models: Llama-3-8B (8 x 128), a 70B model at
#: tensor parallel 8 (1 x 128 per rank), a small model (2 x 64), wide heads (4 x 256)
SHAPES = {"llama3_8b": (8, 128), "llama70b_tp8": (1, 128), "h2_d64": (2, 64), "h4_d256": (4, 256)}
SHAPE_PARAMS = [pytest.param(h, d, id=name) for name, (h, d) in SHAPES.items()]


def values(dtype: DType, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Finite random values of ``dtype`` (numpy / ml_dtypes element type) in ``shape``."""
    n = int(np.prod(shape))
    return cb.finite_values(cb.rng_for(seed), dtype, n).reshape(shape)


def fp8_bytes(dtype: DType, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """An FP8 cache as the uint8 tensor vLLM allocates (finite FP8 values)."""
    return values(dtype, shape, seed).view(np.uint8)


def churned_manager(num_blocks: int, block_size: int, seed: int, rounds: int = 8) -> BlockManager:
    """A block manager after rounds of allocation and release, so that the free queue
    hands out scattered, non-contiguous block ids as in a long-running server."""
    bm = BlockManager(num_blocks, block_size)
    rng = cb.rng_for(seed)
    live: list[str] = []
    for r in range(rounds):
        while bm.num_free > 2 and rng.random() < 0.7:
            sid = f"warm{r}.{len(live)}"
            bm.allocate(sid, int(rng.integers(1, (bm.num_free // 2) * block_size + 1)))
            live.append(sid)
        rng.shuffle(live)
        for sid in live[: max(1, len(live) // 2)]:
            bm.free(sid)
        live = live[max(1, len(live) // 2):]
    for sid in live:
        bm.free(sid)
    bm.check()
    if bm.num_free != num_blocks:
        raise RuntimeError("harness: the churn left blocks allocated")
    return bm


def padded_table(bm: BlockManager, seq_ids, width: int | None = None, rows: int | None = None,
                 dtype=np.int32) -> np.ndarray:
    """An engine-native ``[rows, width]`` block table (rows past the sequences and
    columns past their blocks hold 0, as vLLM's persistent buffer does); ``width``
    defaults to the longest block list."""
    width = width or max(len(bm.blocks(s)) for s in seq_ids)
    out = np.zeros((rows or len(seq_ids), width), dtype=dtype)
    for i, s in enumerate(seq_ids):
        b = bm.blocks(s)
        out[i, : len(b)] = b
    return out


class Scenario:
    """Steps of one engine scenario against the provider, each checked against the oracle."""

    def __init__(self, provider, opts, claims, adapted: AdaptedCache, *, seed: int, what: str):
        self.provider, self.opts, self.claims = provider, opts, frozenset(claims or ())
        self.adapted, self.seed, self.what = adapted, seed, what
        self.step = 0

    @property
    def geometry(self):
        return self.adapted.geometry

    def _run(self, verify, case, clause: str):
        feats = cb.case_features(case)
        unclaimed = [f for f in feats if f not in self.claims]
        try:
            return verify(self.provider, case, self.opts, clause=clause, feature=feats[0] if feats else None)
        except Unsupported as e:
            if unclaimed:
                raise Unsupported(f"{self.what}: {e} (optional: {', '.join(unclaimed)})", unclaimed[0]) from None
            raise ConformanceFailure(
                f"{self.what}: UNSUPPORTED although every optional feature it uses is claimed",
                expected="a correct result", got=f"UNSUPPORTED ({e})", clause=clause,
                case=case.describe(), seed=case.seed) from None

    def write(self, slots, *, label: str, io_dtype: DType | None = None,
              k_scale: float | None = None, v_scale: float | None = None, k_scale_desc=None, v_scale_desc=None):
        """Write ``len(slots)`` new tokens of random values through ``slots`` (``k_scale`` / ``v_scale``:
        the flat F32 pointers of spec 6.9; ``k_scale_desc`` / ``v_scale_desc``: scale descriptors)."""
        self.step += 1
        g = self.geometry
        n = int(slots.count)
        dt = io_dtype or self.adapted.k.dtype
        s = self.seed * 1000 + self.step
        key = values(dt, (n, g.num_kv_heads, g.head_dim), s)
        value = values(dt, (n, g.num_kv_heads, g.head_dim), s + 500)
        case = self.adapted.write_case(key, value, slots, label=f"{self.what}: step {self.step} {label}")
        case = dataclasses.replace(case, seed=self.seed, k_scale=k_scale, v_scale=v_scale, k_scale_desc=k_scale_desc,
                                   v_scale_desc=v_scale_desc)
        got = self._run(verify_write, case, CL_WRITE)
        self.adapted.load(got.arrays)
        return got

    def gather(self, table, seq_lens, max_seq_len: int, *, label: str, out_dtype: DType | None = None,
               out_layout=None):
        """Gather every sequence's cached tokens into padded outputs: dense, or
        ``out_layout`` (an engine's strided output view, poisoned around its elements)."""
        self.step += 1
        case = self.adapted.gather_case(table, seq_lens, max_seq_len, out_dtype=out_dtype,
                                        label=f"{self.what}: step {self.step} {label}")
        case = dataclasses.replace(case, seed=self.seed)
        if out_layout is not None:
            rng = cb.rng_for(self.seed * 1000 + self.step)
            n = out_layout.span_elements()
            case = dataclasses.replace(case, out_layout=out_layout, out_k_init=cb.poison(rng, out_layout.dtype, n),
                                       out_v_init=cb.poison(rng, out_layout.dtype, n))
        return self._run(verify_gather, case, CL_GATHER)


def not_expressible(build) -> None:
    """Record an engine configuration KVX v1.1 cannot express (informational skip).

    ``build()`` must raise :class:`AdapterError`; its one-line reason becomes the
    record. If the adapter accepts the configuration, the scenario is a harness fault.
    """
    try:
        build()
    except AdapterError as e:
        pytest.skip(f"{NOT_EXPRESSIBLE}: {e}")
    raise RuntimeError("the adapter accepted a configuration this scenario says KVX cannot express")
