"""Cases: one KVX call fully described, with its initial memory contents.

A case is what both faces of a check consume:

- ``kvx_conformance.reference_impl.expected_write(case)`` /
  ``expected_gather(case)`` (the numpy oracle) return the expected status and the
  expected memory after the call;
- ``kvx_conformance.cases.execute.run_write(provider, case, memory)`` /
  ``run_gather(...)`` place the same contents in guarded buffers, call the
  provider and return what came back.

All arrays are numpy, in *storage* form: a cache tensor is a flat 1-D array of its
dtype (``dtypes.np_dtype``) with ``layout.span_elements()`` elements, addressed by
element offset (docs/spec-readings.md R-CACHE); IO tensors likewise are flat arrays
with ``IOLayout.span_elements()`` elements. Cases are plain data: the
``describe()`` text is what a failure message prints.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..abi.descriptors import BlockTable, Geometry, IOLayout, ScaleSpec, SeqLens, SlotMapping, TensorLayout
from ..abi.header import DType


#: C-level overrides applied to the ctypes structs after they are built from a case,
#: keyed by dotted path from the call's arguments: ``"cache.size"``,
#: ``"cache.k.ndim"``, ``"desc.io.key.data"``, ``"desc.block_table.indptr_count"``,
#: ``"version.size"``. A value of ``None`` on a pointer field passes NULL; the
#: special path ``"cache"`` or ``"desc"`` with value None passes a NULL struct
#: pointer. Negative tests use these to violate exactly one rule; the oracle reads
#: the same overrides to decide the expected status.
COverrides = dict


@dataclass
class PoolCase:
    """KV_OFFSETS block pools (spec 6.7): flat storage arrays of the cache dtype."""

    bytes_per_block: int
    primary: np.ndarray
    secondary: np.ndarray | None = None
    #: pass a NULL ``pool.secondary`` even though ``secondary`` holds data (negative tests)
    secondary_null: bool = False


@dataclass
class CacheCase:
    geom: Geometry
    k: TensorLayout
    v: TensorLayout
    k_init: np.ndarray
    v_init: np.ndarray
    pool: PoolCase | None = None


@dataclass
class ValidateCase:
    """A ``kvx_validate_cache_desc`` call."""

    cache: CacheCase
    seed: int | None = None
    label: str = ""
    c_overrides: dict = field(default_factory=dict)

    def describe(self) -> str:
        c = self.cache
        return f"validate {self.label} seed={self.seed} geom={c.geom} k={c.k} v={c.v} overrides={self.c_overrides}"


@dataclass
class WriteCase:
    cache: CacheCase
    key_layout: IOLayout
    value_layout: IOLayout
    key: np.ndarray  # flat storage, key_layout.span_elements() elements of key_layout.dtype
    value: np.ndarray
    slots: SlotMapping
    num_tokens: int
    k_scale: float | None = None  # per-tensor F32 pointer (spec 6.9 k_scale); None = NULL
    v_scale: float | None = None
    k_scale_desc: ScaleSpec | None = None
    v_scale_desc: ScaleSpec | None = None
    #: seed and generator that produced the case, for repro lines
    seed: int | None = None
    label: str = ""
    c_overrides: dict = field(default_factory=dict)
    #: io.value points at the key input's buffer (one tensor for both, as MLA passes its latent);
    #: ``value`` / ``value_layout`` must then be ``key`` / ``key_layout``
    value_is_key: bool = False

    def describe(self) -> str:
        c = self.cache
        return (
            f"write {self.label} seed={self.seed} geom={c.geom} k={c.k} v={c.v} key={self.key_layout} "
            + ("value=key (one buffer) " if self.value_is_key else "")
            + (f"value={self.value_layout} " if self.value_layout != self.key_layout else "")
            + f"tokens={self.num_tokens} slots[{self.slots.dtype.name}, invalid={self.slots.invalid_slot}]="
            f"{np.asarray(self.slots.slots)[:16].tolist()}{'...' if len(self.slots.slots) > 16 else ''}"
            + (f" overrides={self.c_overrides}" if self.c_overrides else "")
        )


@dataclass
class GatherCase:
    cache: CacheCase
    table: BlockTable
    seq_lens: SeqLens
    max_seq_len: int
    out_layout: IOLayout  # the key output's layout, and the value output's unless value_out_layout is set
    num_tokens: int
    #: initial (poisoned) contents of the outputs, flat storage of each output's dtype
    out_k_init: np.ndarray = field(default=None)  # type: ignore[assignment]
    out_v_init: np.ndarray = field(default=None)  # type: ignore[assignment]
    seed: int | None = None
    label: str = ""
    c_overrides: dict = field(default_factory=dict)
    #: the value output's layout where it is not the key's (its own strides or dtype: spec 6.8, io.key and
    #: io.value are tensor descriptors of their own)
    value_out_layout: IOLayout | None = None

    @property
    def value_out(self) -> IOLayout:
        """The value output's layout."""
        return self.value_out_layout if self.value_out_layout is not None else self.out_layout

    def describe(self) -> str:
        c = self.cache
        t = self.table
        return (
            f"gather {self.label} seed={self.seed} geom={c.geom} k={c.k} v={c.v} out={self.out_layout} "
            + (f"value_out={self.value_out_layout} " if self.value_out_layout is not None else "")
            + f"table={t.format.name}[{t.index_dtype.name}] seqs={t.seq_count} beam={t.beam_width} "
            f"max_blocks={t.max_blocks_per_seq} lens[{self.seq_lens.dtype.name}]="
            f"{np.asarray(self.seq_lens.lengths).tolist()[:16]} "
            f"max_seq_len={self.max_seq_len}"
            + (f" overrides={self.c_overrides}" if self.c_overrides else "")
        )


@dataclass
class Result:
    """What a call produced (or, from the oracle, should produce)."""

    status: int
    #: write: {"k": flat cache, "v": flat cache}; gather: {"k": flat out, "v": flat out}
    arrays: dict[str, np.ndarray]
    #: execute only: guard regions that changed, e.g. ["k cache: 3 bytes after end changed"]
    guard_violations: list[str] = field(default_factory=list)
    #: oracle only: id of the rule that decided a non-OK status (reference_impl.rules), "" for OK
    rule: str = ""
    #: execute only: read-only inputs the call changed, one line each naming the buffer and
    #: its first changed element, e.g. ["slots: 1 of 6 element(s) changed ...; first at element 2: 7 before, -1 after"]
    input_changes: list[str] = field(default_factory=list)
