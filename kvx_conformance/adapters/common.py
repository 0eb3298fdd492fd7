"""What every engine adapter shares: the refusal error, array introspection, the bundle.

An adapter describes memory an engine already owns; it never copies the cache. It
reads shape, strides (in elements), element type and data pointer from a numpy
array or a torch tensor (torch is optional and never imported here: a tensor is
recognised by its ``stride()`` / ``data_ptr()`` methods), and returns an
:class:`AdaptedCache`: the KVX geometry, one :class:`TensorLayout` for K and one
for V, and where each layout's base element lives in the engine array.

What KVX v1.1 cannot express is refused with :class:`AdapterError`, whose message
is one line: the engine concept, then why KVX cannot carry it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..abi import header as abi
from ..abi.descriptors import BlockTable, Geometry, IOLayout, SeqLens, SlotMapping, TensorLayout, to_c_cache
from ..abi.dtypes import np_dtype
from ..abi.header import DType, Memory
from ..cases.case import CacheCase, GatherCase, PoolCase, WriteCase


class AdapterError(ValueError):
    """An engine concept that KVX v1.1 cannot express (one line: what, then why)."""

    def __init__(self, what: str, why: str):
        super().__init__(f"{what}: {why}")
        self.what = what
        self.why = why


# ----------------------------------------------------------------------------
# Array introspection (numpy arrays and torch tensors)


def is_torch_like(x: Any) -> bool:
    """True for a torch tensor (or an object with its strided-memory protocol)."""
    return callable(getattr(x, "stride", None)) and callable(getattr(x, "data_ptr", None))


@dataclass(frozen=True)
class ArrayInfo:
    shape: tuple[int, ...]
    stride: tuple[int, ...]  # elements
    itemsize: int
    dtype_name: str  # numpy name ("float16", "bfloat16", ...) or torch's without the prefix
    data_ptr: int


def array_info(x: Any, what: str = "array") -> ArrayInfo:
    """Shape, element strides, element size, dtype name and data pointer of ``x``."""
    if isinstance(x, np.ndarray):
        itemsize = x.dtype.itemsize
        if any(s % itemsize for s in x.strides):
            raise AdapterError(what, f"byte strides {x.strides} are not whole elements of {itemsize} bytes")
        stride = tuple(s // itemsize for s in x.strides)
        info = ArrayInfo(tuple(x.shape), stride, itemsize, x.dtype.name, int(x.__array_interface__["data"][0]))
    elif is_torch_like(x):
        info = ArrayInfo(
            tuple(int(n) for n in x.shape), tuple(int(s) for s in x.stride()), int(x.element_size()),
            str(x.dtype).removeprefix("torch."), int(x.data_ptr()),
        )
    else:
        raise TypeError(f"{what}: expected a numpy array or a torch tensor, got {type(x).__name__}")
    if any(s < 0 for s in info.stride):
        raise AdapterError(what, f"negative strides {info.stride}; engine caches never use them and the reference answers UNSUPPORTED (R-STRIDE-NEG)")
    return info


def extent_elements(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements from the first element to one past the farthest (non-negative strides)."""
    if any(n <= 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride))


_ELEMENT_DTYPES = {
    "float16": DType.F16,
    "bfloat16": DType.BF16,
    "float32": DType.F32,
    "float8_e4m3fn": DType.F8_E4M3,
    "float8_e5m2": DType.F8_E5M2,
}

#: ``kv_cache_dtype`` strings (vLLM / TGI spelling) for FP8 bytes held in a uint8/int8 tensor.
_FP8_NAMES = {"fp8": DType.F8_E4M3, "fp8_e4m3": DType.F8_E4M3, "fp8_e5m2": DType.F8_E5M2}


def cache_dtype(info: ArrayInfo, kv_cache_dtype: str | DType = "auto", what: str = "cache") -> DType:
    """The KVX cache dtype of an engine cache tensor.

    ``kv_cache_dtype`` follows vLLM: ``"auto"`` takes the tensor's element type;
    ``"fp8"`` / ``"fp8_e4m3"`` / ``"fp8_e5m2"`` name the FP8 format of a 1-byte
    tensor (vLLM allocates FP8 caches as uint8). A :class:`DType` is taken as is.
    """
    if isinstance(kv_cache_dtype, DType):
        dt = kv_cache_dtype
    elif kv_cache_dtype == "auto":
        dt = _ELEMENT_DTYPES.get(info.dtype_name)
        if dt is None:
            hint = " (pass kv_cache_dtype='fp8_e4m3' or 'fp8_e5m2' if it holds FP8 bytes)" if info.itemsize == 1 else ""
            raise AdapterError(f"{what} element type {info.dtype_name}", f"not a KVX cache dtype (F16, BF16, F32, F8_E4M3, F8_E5M2){hint}")
    elif kv_cache_dtype in _FP8_NAMES:
        dt = _FP8_NAMES[kv_cache_dtype]
    else:
        raise AdapterError(f"{what} kv_cache_dtype={kv_cache_dtype!r}", "KVX v1.1 cache dtypes are F16, BF16, F32, F8_E4M3 (OCP e4m3fn) and F8_E5M2 only")
    if dt not in abi.CACHE_DTYPES:
        raise AdapterError(f"{what} dtype {dt.name}", "not a KVX cache dtype")
    if abi.DTYPE_SIZE[dt] != info.itemsize:
        raise AdapterError(f"{what} kv_cache_dtype {dt.name}", f"needs {abi.DTYPE_SIZE[dt]}-byte elements, the tensor has {info.itemsize}-byte {info.dtype_name}")
    return dt


def index_dtype(x: Any, what: str) -> DType:
    """S32 / S64 for an int32 / int64 engine index array; anything else is refused."""
    info = array_info(x, what)
    if info.dtype_name == "int32":
        return DType.S32
    if info.dtype_name == "int64":
        return DType.S64
    raise AdapterError(f"{what} element type {info.dtype_name}", "KVX index, slot and length arrays are S32 or S64")


def to_numpy(x: Any) -> np.ndarray:
    """A host numpy copy-or-view of an index array (torch tensors are moved to the host)."""
    if isinstance(x, np.ndarray):
        return x
    if is_torch_like(x):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def flat_alias(x: Any, offset: int, span: int, what: str = "array") -> Any:
    """A 1-D view of ``span`` elements starting ``offset`` elements past ``x``'s data pointer.

    The view aliases the engine's memory (writes through it land in the engine
    array). The region must lie inside ``x``'s own extent.
    """
    info = array_info(x, what)
    extent = extent_elements(info.shape, info.stride)
    if offset < 0 or offset + span > extent:
        raise ValueError(f"{what}: elements [{offset}, {offset + span}) lie outside the array's extent of {extent}")
    if isinstance(x, np.ndarray):
        whole = np.lib.stride_tricks.as_strided(x, shape=(offset + span,), strides=(info.itemsize,))
        return whole[offset:]
    return x.as_strided((span,), (1,), int(x.storage_offset()) + offset)


# ----------------------------------------------------------------------------
# The bundle an adapter returns


@dataclass
class PoolRef:
    """KV_OFFSETS block pools (spec 6.7): where ``pool.primary`` / ``pool.secondary`` point."""

    bytes_per_block: int
    primary: Any
    primary_offset: int = 0  # elements from primary's data pointer to the pool pointer
    secondary: Any = None
    secondary_offset: int = 0

    def _storage(self, arr: Any, offset: int, what: str) -> Any:
        info = array_info(arr, what)
        return flat_alias(arr, offset, extent_elements(info.shape, info.stride) - offset, what)

    def primary_storage(self) -> Any:
        return self._storage(self.primary, self.primary_offset, "pool.primary")

    def secondary_storage(self) -> Any | None:
        if self.secondary is None:
            return None
        return self._storage(self.secondary, self.secondary_offset, "pool.secondary")

    @property
    def primary_ptr(self) -> int:
        info = array_info(self.primary)
        return info.data_ptr + self.primary_offset * info.itemsize

    @property
    def secondary_ptr(self) -> int:
        if self.secondary is None:
            return 0
        info = array_info(self.secondary)
        return info.data_ptr + self.secondary_offset * info.itemsize


def _torch_int_view(tensor: Any) -> Any:
    """The tensor's elements as signed integers of the same size (raw bits)."""
    import torch  # optional dependency, only reached with torch tensors

    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.view(ints)


def _np_copy(storage: Any, dtype: DType) -> np.ndarray:
    """A host copy of a flat alias, as the oracle's typed storage array."""
    npdt = np_dtype(dtype)
    if isinstance(storage, np.ndarray):
        return np.array(storage, copy=True).view(npdt)
    # torch: through raw integer bits (numpy knows no torch bfloat16 / FP8)
    return np.array(_torch_int_view(storage.detach()).cpu().numpy(), copy=True).view(npdt)


@dataclass
class AdaptedCache:
    """An engine cache described as KVX: geometry, K/V layouts and their base elements.

    ``k_array`` / ``v_array`` are the engine arrays the descriptors point into and
    ``k_offset`` / ``v_offset`` the element offset of each descriptor's base from
    that array's data pointer (non-zero for a layer or K/V slice of a larger
    tensor). ``pool`` is set for KV_OFFSETS (TensorRT-LLM).
    """

    engine: str
    geometry: Geometry
    k: TensorLayout
    v: TensorLayout
    k_array: Any
    v_array: Any
    k_offset: int = 0
    v_offset: int = 0
    pool: PoolRef | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    # -- pointers and aliases into the engine memory

    def _ptr(self, arr: Any, offset: int) -> int:
        info = array_info(arr)
        return info.data_ptr + offset * info.itemsize

    @property
    def k_ptr(self) -> int:
        return self._ptr(self.k_array, self.k_offset)

    @property
    def v_ptr(self) -> int:
        return self._ptr(self.v_array, self.v_offset)

    def k_storage(self) -> Any:
        """Flat alias of the K descriptor's span (writes land in the engine array)."""
        return flat_alias(self.k_array, self.k_offset, self.k.span_elements(), f"{self.engine} K")

    def v_storage(self) -> Any:
        return flat_alias(self.v_array, self.v_offset, self.v.span_elements(), f"{self.engine} V")

    def element_offset(self, kind: str, block, token, head, dim):
        """Element offset, from the engine array's data pointer, of logical elements
        as the KVX descriptor addresses them (docs/spec-readings.md R-CACHE).
        Indices broadcast (ints or numpy integer arrays)."""
        t = self.k if kind == "k" else self.v
        base = self.k_offset if kind == "k" else self.v_offset
        return base + _layout_offsets(t, block, token, head, dim)

    def addressed_offsets(self, kind: str) -> np.ndarray:
        """Every element offset the K or V descriptor addresses, from its base."""
        g = self.geometry
        t = self.k if kind == "k" else self.v
        b, tok, h, d = np.ix_(*(np.arange(n, dtype=np.int64) for n in (g.num_blocks, g.block_size, g.num_kv_heads, g.head_dim)))
        return np.asarray(_layout_offsets(t, b, tok, h, d)).reshape(-1)

    # -- the C descriptor

    def to_c(self, memory: Memory = Memory.HOST) -> abi.kvx_cache_desc_t:
        pool = self.pool
        return to_c_cache(
            self.geometry, self.k, self.k_ptr, self.v, self.v_ptr, memory,
            pool_bytes_per_block=pool.bytes_per_block if pool else 0,
            pool_primary=pool.primary_ptr if pool else 0,
            pool_secondary=pool.secondary_ptr if pool else 0,
        )

    # -- cases for the oracle / a provider (copies of the engine memory)

    def cache_case(self) -> CacheCase:
        pool = None
        if self.pool is not None:
            sec = self.pool.secondary_storage()
            pool = PoolCase(
                self.pool.bytes_per_block,
                _np_copy(self.pool.primary_storage(), self.k.dtype),
                None if sec is None else _np_copy(sec, self.k.dtype),
            )
        return CacheCase(
            self.geometry, self.k, self.v,
            _np_copy(self.k_storage(), self.k.dtype), _np_copy(self.v_storage(), self.v.dtype), pool,
        )

    def write_case(self, key: np.ndarray, value: np.ndarray, slots: SlotMapping, label: str = "") -> WriteCase:
        """A write of dense ``[num_tokens, H, D]`` key/value rows through ``slots``."""
        key = np.ascontiguousarray(key)
        value = np.ascontiguousarray(value)
        n, h, d = key.shape
        io_dtype = _dtype_of(key)
        layout = IOLayout.dense(io_dtype, n, h, d)
        return WriteCase(
            self.cache_case(), layout, IOLayout.dense(_dtype_of(value), n, h, d),
            key.reshape(-1), value.reshape(-1), slots, n, label=label or f"adapter {self.engine}",
        )

    def gather_case(
        self, table: BlockTable, seq_lens: SeqLens, max_seq_len: int, out_dtype: DType | None = None,
        poison: float = -7.0, label: str = "",
    ) -> GatherCase:
        """A gather into dense padded ``[seq_count * beam_width * max_seq_len, H, D]`` outputs."""
        g = self.geometry
        out_dtype = out_dtype or self.k.dtype
        rows = table.seq_count * table.beam_width * max_seq_len
        out = IOLayout.dense(out_dtype, rows, g.num_kv_heads, g.head_dim)
        init = np.full(out.span_elements(), poison, dtype=np.float32).astype(np_dtype(out_dtype))
        return GatherCase(
            self.cache_case(), table, seq_lens, max_seq_len, out, rows,
            out_k_init=init.copy(), out_v_init=init.copy(), label=label or f"adapter {self.engine}",
        )

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        """Put a write-call result (``{"k": flat, "v": flat}``, as from ``cache_case``)
        back into the engine memory: only the elements each descriptor addresses, so
        interleaved K and V spans (ppl.nn layouts 0/1, one TensorRT-LLM pool) do not
        overwrite each other."""
        for kind, storage in (("k", self.k_storage()), ("v", self.v_storage())):
            idx = self.addressed_offsets(kind)
            dt = np_dtype(self.k.dtype if kind == "k" else self.v.dtype)
            bits = np.asarray(arrays[kind]).view(dt).view(np.dtype(f"u{dt.itemsize}"))[idx]
            if isinstance(storage, np.ndarray):
                storage.view(np.dtype(f"u{dt.itemsize}"))[idx] = bits
            else:  # torch: move raw bits (numpy knows no torch bfloat16 / FP8)
                import torch  # optional dependency, only reached with torch tensors

                src = torch.from_numpy(bits.view(np.dtype(f"i{dt.itemsize}")) if dt.itemsize > 1 else bits)
                _torch_int_view(storage)[torch.from_numpy(idx).to(storage.device)] = src.to(storage.device)


def _dtype_of(x: np.ndarray) -> DType:
    dt = _ELEMENT_DTYPES.get(x.dtype.name)
    if dt is None:
        raise TypeError(f"IO array of {x.dtype.name}: not a KVX IO dtype")
    return dt


def _layout_offsets(t: TensorLayout, b, tok, h, d):
    """R-CACHE addressing, from the oracle (one definition of the reading)."""
    from ..reference_impl.addressing import cache_offsets  # the oracle ships in this package

    pack = t.shape[4] if t.layout == abi.Layout.BLOCK_HND_PACKED else 1
    return cache_offsets(abi.Layout(t.layout), t.stride, pack, b, tok, h, d)


# ----------------------------------------------------------------------------
# Small shared helpers


def is_power_of_two(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def per_token_blocks(table_row: np.ndarray, length: int, block_size: int) -> np.ndarray:
    """RAGGED (spec 5.1) entries of one sequence: the block id of each of its tokens."""
    t = np.arange(length, dtype=np.int64)
    return np.asarray(table_row, dtype=np.int64)[t // block_size]


def ragged_table(per_seq_blocks: list[np.ndarray], lengths: Any, block_size: int, index_dtype: DType = DType.S32) -> BlockTable:
    """A KVX RAGGED table from per-sequence block lists and token counts."""
    lengths = [int(n) for n in lengths]
    per_token = [per_token_blocks(np.asarray(b), n, block_size) for b, n in zip(per_seq_blocks, lengths)]
    max_blocks = max((-(-n // block_size) for n in lengths), default=0)
    return BlockTable.ragged(per_token, max_blocks, index_dtype=index_dtype, indptr_dtype=index_dtype)
