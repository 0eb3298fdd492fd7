"""The descriptor model: what a KVX call describes, as plain Python data.

One description feeds both faces of a check: ``reference_impl`` (the numpy
oracle) computes the expected result from it, and ``to_c_*`` turns it, with
buffer pointers, into the ctypes structs of :mod:`kvx_conformance.abi.header` handed to
the provider. Fields are kept raw (counts are not derived at C time) so negative
tests can describe exactly one violated rule.
"""
from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass, field

import numpy as np

from . import header as abi
from .header import DType, Layout, Memory, TableFormat, TableFlags

# ----------------------------------------------------------------------------
# Cache geometry and tensor layouts (spec 4.1, 4.2, 6.1, 6.2)


@dataclass(frozen=True)
class Geometry:
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size


@dataclass(frozen=True)
class TensorLayout:
    """A cache tensor: dtype, layout enum, shape and strides (in elements).

    Logical element (block b, token t, head h, dim d) lives at the element offset
    given by ``reference_impl.addressing.element_offsets``. For BLOCK_CUSTOM the
    project's reading (docs/spec-readings.md, R-CUSTOM) is: ndim 4, shape in
    logical order ``[num_blocks, block_size, num_kv_heads, head_dim]``, any strides.
    """

    dtype: DType
    layout: Layout
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    #: elements from the start of the buffer to the data pointer (``reversed``: a negative stride)
    origin: int = 0

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return abi.DTYPE_SIZE[self.dtype]

    def span_elements(self) -> int:
        """Elements from the start of the buffer to one past the farthest element addressed."""
        return _span(self.shape, self.stride, self.origin)

    def with_(self, **changes) -> "TensorLayout":
        return dataclasses.replace(self, **changes)

    def reversed(self, dim: int) -> "TensorLayout":
        """The same elements with dimension ``dim`` walked backwards (``_reversed``)."""
        return _reversed(self, dim)


def _span(shape, stride, origin: int) -> int:
    """Elements from the start of a buffer to one past the farthest element addressed from a data
    pointer ``origin`` elements into it: negative strides reach back at most ``origin`` (the
    buffer is extended where they reach further)."""
    if any(s <= 0 for s in shape):
        return 0
    back = sum((n - 1) * -s for n, s in zip(shape, stride) if s < 0)
    ahead = sum((n - 1) * s for n, s in zip(shape, stride) if s > 0)
    return max(origin, back) + 1 + ahead


def _reversed(t, dim: int):
    """``t`` with the stride of ``dim`` negated and the data pointer moved to that dimension's last
    index, so the same buffer holds every element (index i of ``dim`` lands where index n-1-i was):
    how a caller describes a tensor walked backwards (spec 4.2 "MUST honor provided strides")."""
    n, s = t.shape[dim], t.stride[dim]
    stride = tuple(-x if i == dim else x for i, x in enumerate(t.stride))
    return dataclasses.replace(t, stride=stride, origin=t.origin + (n - 1) * s)


def canonical_shape(geom: Geometry, layout: Layout, pack: int | None = None) -> tuple[int, ...]:
    g = geom
    if layout == Layout.BLOCK_NHD or layout == Layout.BLOCK_CUSTOM:
        return (g.num_blocks, g.block_size, g.num_kv_heads, g.head_dim)
    if layout == Layout.BLOCK_HND:
        return (g.num_blocks, g.num_kv_heads, g.block_size, g.head_dim)
    if layout == Layout.BLOCK_HND_PACKED:
        if not pack:
            raise ValueError("HND_PACKED needs a pack factor")
        return (g.num_blocks, g.num_kv_heads, g.head_dim // pack, g.block_size, pack)
    raise ValueError(f"no canonical shape for layout {layout!r}")


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides in elements, last dimension contiguous."""
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def cache_layout(
    geom: Geometry,
    layout: Layout,
    dtype: DType,
    pack: int | None = None,
    pad: int = 0,
    order: tuple[int, ...] | None = None,
) -> TensorLayout:
    """A cache tensor layout: canonical strides, optionally padded or permuted.

    ``pad`` adds that many elements after each innermost row (every stride but
    the last grows accordingly). ``order`` lists dimensions from outermost to
    innermost in memory (default: row-major); e.g. ``(0, 1, 3, 2)`` on HND
    gives vLLM's V cache ``[blocks, H, D, block_size]`` described as HND.
    """
    shape = canonical_shape(geom, layout, pack)
    order = tuple(order) if order is not None else tuple(range(len(shape)))
    stride = [0] * len(shape)
    acc = 1
    for pos, dim in enumerate(reversed(order)):
        stride[dim] = acc
        acc *= shape[dim]
        if pos == 0:
            acc += pad
    return TensorLayout(dtype=dtype, layout=layout, shape=shape, stride=tuple(stride))


# ----------------------------------------------------------------------------
# Slots, tables, lengths, IO (spec 5, 6.3-6.10)


@dataclass
class SlotMapping:
    slots: np.ndarray  # int64 values; stored as ``dtype`` when handed to a provider
    dtype: DType = DType.S64
    invalid_slot: int = -1
    token_count: int | None = None  # None: len(slots)

    @property
    def count(self) -> int:
        return len(self.slots) if self.token_count is None else self.token_count

    def encoded(self) -> np.ndarray:
        from .dtypes import np_dtype

        return np.ascontiguousarray(np.asarray(self.slots).astype(np_dtype(self.dtype)))


@dataclass
class BlockTable:
    format: TableFormat
    indices: np.ndarray  # flat, values as int64 (KVCacheIndex as its int32 bit pattern)
    seq_count: int
    max_blocks_per_seq: int
    index_dtype: DType = DType.S32
    indptr: np.ndarray | None = None
    indptr_dtype: DType = DType.INVALID
    beam_width: int = 1
    indices_count: int | None = None  # None: len(indices)
    indptr_count: int | None = None  # None: len(indptr) or 0
    flags: int = 0

    @property
    def n_indices(self) -> int:
        return len(self.indices) if self.indices_count is None else self.indices_count

    @property
    def n_indptr(self) -> int:
        if self.indptr_count is not None:
            return self.indptr_count
        return 0 if self.indptr is None else len(self.indptr)

    @classmethod
    def packed(cls, table: np.ndarray, index_dtype: DType = DType.S32) -> "BlockTable":
        table = np.asarray(table, dtype=np.int64)
        seqs, mb = table.shape
        return cls(TableFormat.PACKED, table.reshape(-1), seqs, mb, index_dtype=index_dtype)

    @classmethod
    def ragged(
        cls,
        per_token_blocks: list[np.ndarray],
        max_blocks_per_seq: int,
        index_dtype: DType = DType.S32,
        indptr_dtype: DType = DType.S32,
    ) -> "BlockTable":
        """RAGGED (spec 5.1): one block id per cached token, indptr = prefix sums."""
        lens = [len(x) for x in per_token_blocks]
        indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        indices = np.concatenate([np.asarray(x, np.int64) for x in per_token_blocks]) if lens else np.zeros(0, np.int64)
        return cls(
            TableFormat.RAGGED, indices, len(lens), max_blocks_per_seq,
            index_dtype=index_dtype, indptr=indptr, indptr_dtype=indptr_dtype,
        )

    @classmethod
    def kv_offsets(cls, offsets: np.ndarray) -> "BlockTable":
        """KV_OFFSETS (spec 5.1): ``offsets[seq, beam, 0|1 (K|V), block]`` KVCacheIndex values."""
        offsets = np.asarray(offsets, dtype=np.int64)
        seqs, beams, two, mb = offsets.shape
        assert two == 2
        return cls(
            TableFormat.KV_OFFSETS, offsets.reshape(-1), seqs, mb, index_dtype=DType.S32,
            beam_width=beams, flags=int(TableFlags.KVCACHEINDEX),
        )

    def encoded_indices(self) -> np.ndarray:
        from .dtypes import np_dtype

        idx = np.asarray(self.indices, dtype=np.int64)
        if self.index_dtype == DType.S32:
            return np.ascontiguousarray((idx & 0xFFFFFFFF).astype(np.uint32).view(np.int32))
        return np.ascontiguousarray(idx.astype(np_dtype(self.index_dtype)))

    def encoded_indptr(self) -> np.ndarray | None:
        from .dtypes import np_dtype

        if self.indptr is None:
            return None
        dt = self.indptr_dtype if self.indptr_dtype in abi.INDEX_DTYPES else DType.S64
        return np.ascontiguousarray(np.asarray(self.indptr, np.int64).astype(np_dtype(dt)))


@dataclass
class SeqLens:
    lengths: np.ndarray  # int64 values
    dtype: DType = DType.S32
    seq_count: int | None = None

    @property
    def count(self) -> int:
        return len(self.lengths) if self.seq_count is None else self.seq_count

    def encoded(self) -> np.ndarray:
        from .dtypes import np_dtype

        return np.ascontiguousarray(np.asarray(self.lengths, np.int64).astype(np_dtype(self.dtype)))


@dataclass(frozen=True)
class IOLayout:
    """An IO tensor (spec 6.8): dense ``[num_tokens, H, D]`` unless shape/stride say otherwise."""

    dtype: DType
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    layout: Layout = Layout.BLOCK_CUSTOM
    #: elements from the start of the buffer to the data pointer (``reversed``: a negative stride)
    origin: int = 0

    @classmethod
    def dense(cls, dtype: DType, num_tokens: int, num_kv_heads: int, head_dim: int) -> "IOLayout":
        return cls(dtype, (num_tokens, num_kv_heads, head_dim), (num_kv_heads * head_dim, head_dim, 1))

    @classmethod
    def padded4d(cls, dtype: DType, seq_count: int, max_seq_len: int, num_kv_heads: int, head_dim: int) -> "IOLayout":
        hd = num_kv_heads * head_dim
        return cls(dtype, (seq_count, max_seq_len, num_kv_heads, head_dim), (max_seq_len * hd, hd, head_dim, 1))

    def span_elements(self) -> int:
        return _span(self.shape, self.stride, self.origin)

    def reversed(self, dim: int) -> "IOLayout":
        """The same elements with dimension ``dim`` walked backwards (``_reversed``)."""
        return _reversed(self, dim)


@dataclass
class ScaleSpec:
    """A scale descriptor (spec 6.6) plus its values (F32)."""

    values: np.ndarray
    granularity: abi.ScaleGranularity = abi.ScaleGranularity.PER_TENSOR
    dtype: DType = DType.F32
    #: ``stride[0]`` of a PER_HEAD descriptor in elements: head h's value is ``data[h * stride]``
    #: (spec 6.6 "Scale strides"; R-FP8). 1 is dense, and so is 0 (the field left unset); past 1 the
    #: elements between are filled with :data:`SCALE_GAP`.
    stride: int = 1

    def buffer(self) -> np.ndarray:
        """The F32 buffer ``data`` points at: the values ``stride`` elements apart."""
        vals = np.asarray(self.values, np.float32).reshape(-1)
        if self.stride in (0, 1) or vals.size <= 1:  # 0: the field left unset, adjacent values (R-FP8)
            return vals
        if self.stride < 0:
            raise ValueError(f"scale stride {self.stride}: the suites place values at strides >= 0")
        out = np.full((vals.size - 1) * self.stride + 1, SCALE_GAP, np.float32)
        out[::self.stride] = vals
        return out


#: what fills the elements between strided scale values: a negative scale flips every sign, so
#: a provider that reads the values densely cannot land on the right result by chance.
SCALE_GAP = np.float32(-3.0)


# ----------------------------------------------------------------------------
# Conversion to the C structs. Pointers are plain ints (0 = NULL).


def to_c_tensor(t: TensorLayout | IOLayout, data: int, memory: Memory, size: int | None = None) -> abi.kvx_tensor_desc_t:
    c = abi.kvx_tensor_desc_t.new(dtype=int(t.dtype), layout=int(t.layout), memory=int(memory), ndim=len(t.shape))
    for i, (n, s) in enumerate(zip(t.shape[: abi.MAX_TENSOR_DIMS], t.stride[: abi.MAX_TENSOR_DIMS])):
        c.shape[i] = n
        c.stride[i] = s
    if data and t.origin:
        data += t.origin * abi.DTYPE_SIZE[t.dtype]  # the data pointer of a tensor with negative strides
    c.data = data or None
    if size is not None:
        c.size = size
    return c


def to_c_cache(
    geom: Geometry,
    k: TensorLayout,
    k_ptr: int,
    v: TensorLayout,
    v_ptr: int,
    memory: Memory,
    pool_bytes_per_block: int = 0,
    pool_primary: int = 0,
    pool_secondary: int = 0,
) -> abi.kvx_cache_desc_t:
    c = abi.kvx_cache_desc_t.new(
        num_blocks=geom.num_blocks, block_size=geom.block_size,
        num_kv_heads=geom.num_kv_heads, head_dim=geom.head_dim,
    )
    c.k = to_c_tensor(k, k_ptr, memory)
    c.v = to_c_tensor(v, v_ptr, memory)
    c.pool = abi.kvx_pool_desc_t.new(
        memory=int(memory), bytes_per_block=pool_bytes_per_block,
        primary=pool_primary or None, secondary=pool_secondary or None,
    )
    return c


def to_c_io(
    key: IOLayout, key_ptr: int, value: IOLayout, value_ptr: int, memory: Memory,
    num_tokens: int, num_kv_heads: int, head_dim: int,
) -> abi.kvx_kv_io_desc_t:
    io = abi.kvx_kv_io_desc_t.new(num_tokens=num_tokens, num_kv_heads=num_kv_heads, head_dim=head_dim)
    io.key = to_c_tensor(key, key_ptr, memory)
    io.value = to_c_tensor(value, value_ptr, memory)
    return io


def to_c_slots(s: SlotMapping, ptr: int) -> abi.kvx_slot_mapping_t:
    return abi.kvx_slot_mapping_t.new(dtype=int(s.dtype), token_count=s.count, invalid_slot=s.invalid_slot, slots=ptr or None)


def to_c_table(t: BlockTable, indices_ptr: int, indptr_ptr: int) -> abi.kvx_block_table_t:
    return abi.kvx_block_table_t.new(
        format=int(t.format), index_dtype=int(t.index_dtype), indptr_dtype=int(t.indptr_dtype),
        seq_count=t.seq_count, beam_width=t.beam_width, max_blocks_per_seq=t.max_blocks_per_seq,
        indices=indices_ptr or None, indptr=indptr_ptr or None,
        indices_count=t.n_indices, indptr_count=t.n_indptr, flags=t.flags,
    )


def to_c_seq_lens(s: SeqLens, ptr: int) -> abi.kvx_seq_lens_t:
    return abi.kvx_seq_lens_t.new(dtype=int(s.dtype), seq_count=s.count, lengths=ptr or None)


def to_c_scale(s: ScaleSpec | None, ptr: int) -> abi.kvx_scale_desc_t:
    c = abi.kvx_scale_desc_t.new()
    if s is None:
        return c
    c.dtype = int(s.dtype)
    c.granularity = int(s.granularity)
    vals = np.asarray(s.values)
    c.ndim = vals.ndim
    for i, n in enumerate(vals.shape):
        c.shape[i] = n
    acc = 1
    for i in range(vals.ndim - 1, -1, -1):
        c.stride[i] = acc
        acc *= vals.shape[i]
    if vals.ndim == 1:
        c.stride[0] = s.stride
    c.data = ptr or None
    return c


def struct_bytes(obj: ctypes.Structure) -> bytes:
    return ctypes.string_at(ctypes.addressof(obj), ctypes.sizeof(obj))
