"""Driving a provider's FP4 cache (KVX 1.2): cases, the oracle's answers, and the calls.

The FP4 suite (``suites/conformance/test_s10_fp4.py``) and the accuracy runner
(``kvx_conformance.accuracy.runner.provider_roundtrip``) use this module. It builds
the 1.2 structs (``abi.kvx_*_v1_2_t``), places every tensor in guarded buffers of
the run's memory type, calls the provider and reads everything back; the oracle
side (:func:`expected_write`, :func:`expected_gather`) is
``kvx_conformance.reference_impl.fp4`` applied row by row.

Storage of an :class:`Fp4Cache` (numpy, uint8):

* ``k_codes`` / ``v_codes``: packed E2M1, ``[nb, bs, H, D/2]`` (NHD) or
  ``[nb, H, bs, D/2]`` (HND); described to the provider in elements (nibbles:
  ``kvx_abi.h``, "shapes and strides of such a tensor count elements"): shape
  ``[nb, bs, H, D]``, strides ``[bs*H*D, H*D, D, 1]`` (NHD) by default. With
  ``k_data_strides`` / ``v_data_strides`` (elements; ``head_dim`` stride 1, the block,
  token and head strides even and non-negative, e.g. padded rows, heads or blocks) the
  code arrays are strided views (byte strides: half the element strides) into the
  buffers ``k_code_buf`` / ``v_code_buf`` handed to the provider, whose gaps hold
  :data:`GAP_FILL`;
* ``k_scales`` / ``v_scales``: ``[nb, bs, H, D/B]`` or ``[nb, H, bs, D/B]``, the
  scale pool, indexed by the same physical block ids. Dense by default; with
  ``k_scale_strides`` / ``v_scale_strides`` (bytes = elements, any non-negative
  pattern, e.g. gaps between blocks, rows and bytes) they are strided views into the
  buffers ``k_scale_buf`` / ``v_scale_buf`` that the provider is handed, and every
  oracle function reads and writes through those views (:func:`padded_strides`).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field, replace

import ml_dtypes
import numpy as np

from ..abi import header as abi, buffers
from ..abi.descriptors import ScaleSpec
from ..abi.header import DType, Fp4Format, Layout, Memory, ScaleGranularity, TableFormat
from ..reference_impl import fp4 as oracle
from .execute import _Arena as CallArena

FORMATS = {"nvfp4": Fp4Format.NVFP4, "mxfp4": Fp4Format.MXFP4, "mxfp4_ocp": Fp4Format.MXFP4_OCP}
FORMAT_NAMES = {v: k for k, v in FORMATS.items()}
IO_NP = {DType.F32: np.dtype(np.float32), DType.F16: np.dtype(np.float16), DType.BF16: np.dtype(ml_dtypes.bfloat16)}
POISON = 0xA5  # initial byte of the cache tensors and of gather outputs


def block_values(fmt: Fp4Format) -> int:
    return 32 if fmt == Fp4Format.MXFP4_OCP else 16


def scale_dtype(fmt: Fp4Format) -> DType:
    return DType.F8_E4M3 if fmt == Fp4Format.NVFP4 else DType.UE8M0


#: (provider, memory, cache layout) of the latest run_write / run_gather / run_validate: what a
#: refusal of that call may be charged to besides ``fp4`` (:func:`layout_feature`)
_LAST_CALL: tuple | None = None


def _record_call(provider, memory, cache: "Fp4Cache") -> None:
    global _LAST_CALL
    _LAST_CALL = (provider, Memory(memory), cache.layout)


def layout_feature() -> tuple[str, ...]:
    """The layout feature ("nhd" / "hnd") of the latest FP4 call's cache, unless it is the
    provider's core layout (``build.core_layout``: required of it, never an excuse): a refusal of
    an FP4 call in the other layout is charged to that layout too (readings R-REFUSAL: a refusal
    names every optional feature the case uses), so an HND-only provider is not failed by the
    NHD cases of a claimed ``fp4``."""
    if _LAST_CALL is None:
        return ()
    from . import build as cb

    provider, memory, layout = _LAST_CALL
    name = {Layout.BLOCK_NHD: "nhd", Layout.BLOCK_HND: "hnd"}.get(Layout(int(layout)))
    try:
        core = cb.core_layout(provider, memory)
    except Exception:  # noqa: BLE001 - no core known: both layouts count as required
        return ()
    return () if name is None or name == core else (name,)


def provider_minor(provider) -> int:
    try:
        return int(provider.version().minor)
    except Exception:
        return 0


# ----------------------------------------------------------------------------- cases


@dataclass
class Fp4Cache:
    fmt: Fp4Format
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    layout: Layout = Layout.BLOCK_NHD
    k_codes: np.ndarray = None  # type: ignore[assignment]
    v_codes: np.ndarray = None  # type: ignore[assignment]
    k_scales: np.ndarray = None  # type: ignore[assignment]
    v_scales: np.ndarray = None  # type: ignore[assignment]
    #: NVFP4 global scales (None: absent = 1.0; a float: PER_TENSOR; a sequence: PER_HEAD)
    k_global: object = None
    v_global: object = None
    #: ``stride[0]`` of PER_HEAD global scales: head h's value at element h * global_stride (R-FP8,
    #: R-FP4), the elements between holding descriptors.SCALE_GAP
    global_stride: int = 1
    #: scale pool strides in bytes (None: dense); with strides, ``*_scales`` are views into ``*_scale_buf``
    k_scale_strides: tuple | None = None
    v_scale_strides: tuple | None = None
    k_scale_buf: np.ndarray | None = None
    v_scale_buf: np.ndarray | None = None
    #: data tensor strides in elements (nibbles; None: dense); with strides, ``*_codes`` are views into
    #: ``*_code_buf``
    k_data_strides: tuple | None = None
    v_data_strides: tuple | None = None
    k_code_buf: np.ndarray | None = None
    v_code_buf: np.ndarray | None = None

    @property
    def B(self) -> int:
        return block_values(self.fmt)

    def code_shape(self) -> tuple[int, ...]:
        nb, bs, H, D = self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim
        return (nb, bs, H, D // 2) if self.layout == Layout.BLOCK_NHD else (nb, H, bs, D // 2)

    def data_shape(self) -> tuple[int, ...]:
        """Shape of a data tensor as described to the provider (elements: ``head_dim`` last)."""
        nb, bs, H, D = self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim
        return (nb, bs, H, D) if self.layout == Layout.BLOCK_NHD else (nb, H, bs, D)

    def scale_shape(self) -> tuple[int, ...]:
        nb, bs, H, J = self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim // self.B
        return (nb, bs, H, J) if self.layout == Layout.BLOCK_NHD else (nb, H, bs, J)

    def row(self, arr: np.ndarray, b: int, t: int) -> np.ndarray:
        """View ``[H, ...]`` of (block b, offset t) in a code or scale array."""
        return arr[b, t] if self.layout == Layout.BLOCK_NHD else arr[b, :, t]

    def g_per_head(self, side: str) -> np.ndarray:
        g = self.k_global if side == "k" else self.v_global
        if g is None or self.fmt != Fp4Format.NVFP4:
            return np.ones(self.num_kv_heads, np.float32)
        return np.broadcast_to(np.asarray(g, np.float32), (self.num_kv_heads,)).copy()

    def copy(self) -> "Fp4Cache":
        out = replace(self, k_codes=self.k_codes.copy(), v_codes=self.v_codes.copy(),
                      k_scales=self.k_scales.copy(), v_scales=self.v_scales.copy())
        for side in ("k", "v"):
            buf = getattr(self, f"{side}_scale_buf")
            if buf is not None:
                out.set_scale_buf(side, buf.copy())
            buf = getattr(self, f"{side}_code_buf")
            if buf is not None:
                out.set_code_buf(side, buf.copy())
        return out

    def data_strides(self, side: str) -> tuple:
        """Strides (elements, i.e. nibbles) of one side's data tensor as described to the provider."""
        st = getattr(self, f"{side}_data_strides")
        return tuple(int(x) for x in st) if st is not None else tuple(_dense_strides(self.data_shape()))

    def code_byte_strides(self, side: str) -> tuple:
        """Byte strides of one side's code array ``[..., D/2]``: half the element strides, 1 for the
        byte pairs of ``head_dim``."""
        st = self.data_strides(side)
        return tuple(x // 2 for x in st[:3]) + (1,)

    def code_storage(self, side: str) -> np.ndarray:
        """The buffer the provider is handed for one side's codes (padded or dense)."""
        buf = getattr(self, f"{side}_code_buf")
        return buf if buf is not None else getattr(self, f"{side}_codes")

    def set_code_buf(self, side: str, buf: np.ndarray) -> None:
        """Adopt ``buf`` (flat uint8) as one side's padded data tensor; ``*_codes`` views it."""
        buf = np.ascontiguousarray(buf, np.uint8).reshape(-1)
        setattr(self, f"{side}_code_buf", buf)
        setattr(self, f"{side}_codes", np.lib.stride_tricks.as_strided(
            buf, self.code_shape(), self.code_byte_strides(side), writeable=True))

    def code_gaps(self, side: str) -> np.ndarray | None:
        """Mask of the bytes of a padded data buffer that no code byte covers (None: dense)."""
        buf = getattr(self, f"{side}_code_buf")
        return None if buf is None else _gap_mask(buf.size, self.code_shape(), self.code_byte_strides(side))

    def scale_strides(self, side: str) -> tuple:
        """Strides (bytes) of one side's scale tensor as described to the provider."""
        st = getattr(self, f"{side}_scale_strides")
        return tuple(int(x) for x in st) if st is not None else tuple(_dense_strides(self.scale_shape()))

    def scale_storage(self, side: str) -> np.ndarray:
        """The buffer the provider is handed for one side's scale pool (padded or dense)."""
        buf = getattr(self, f"{side}_scale_buf")
        return buf if buf is not None else getattr(self, f"{side}_scales")

    def set_scale_buf(self, side: str, buf: np.ndarray) -> None:
        """Adopt ``buf`` (flat uint8) as one side's padded scale pool; ``*_scales`` views it."""
        buf = np.ascontiguousarray(buf, np.uint8).reshape(-1)
        setattr(self, f"{side}_scale_buf", buf)
        setattr(self, f"{side}_scales", np.lib.stride_tricks.as_strided(
            buf, self.scale_shape(), self.scale_strides(side), writeable=True))

    def scale_gaps(self, side: str) -> np.ndarray | None:
        """Mask of the bytes of a padded scale buffer that no scale element covers (None: dense)."""
        buf = getattr(self, f"{side}_scale_buf")
        return None if buf is None else _gap_mask(buf.size, self.scale_shape(), self.scale_strides(side))


def _gap_mask(size: int, shape, strides) -> np.ndarray:
    """Mask of the ``size`` bytes of a buffer that no element of the strided view ``shape`` /
    ``strides`` (bytes) covers."""
    idx = np.zeros(shape, np.int64)
    for axis, (n, st) in enumerate(zip(shape, strides)):
        shp = [1] * len(shape)
        shp[axis] = n
        idx = idx + (np.arange(n, dtype=np.int64) * st).reshape(shp)
    gaps = np.ones(size, bool)
    gaps[idx.reshape(-1)] = False
    return gaps


#: byte of the gaps of a padded scale pool or data tensor (unlike every byte the poison fill leaves)
GAP_FILL = 0x5A


def padded_strides(shape, pads=(0, 0, 0), step: int = 1) -> tuple[int, ...]:
    """Row-major strides of a 4-D tensor ``shape`` with gaps, in its own units (bytes for a scale
    pool, elements (nibbles) for FP4 data): ``step`` from one element of a row to the next, then
    ``pads[2]`` after each row (axis 2), ``pads[1]`` after each item of axis 1, ``pads[0]`` after
    each block (axis 0). All zero pads and step 1: the dense strides."""
    _, d1, d2, d3 = (int(x) for x in shape)
    s3 = int(step)
    s2 = d3 * s3 + int(pads[2])
    s1 = d2 * s2 + int(pads[1])
    s0 = d1 * s1 + int(pads[0])
    return (s0, s1, s2, s3)


def _check_data_strides(side: str, shape, st) -> None:
    """Data strides the oracle addresses as bytes: ``head_dim`` stride 1, the others non-negative
    and even (a whole byte apart), non-zero on an extent > 1 (R-CACHE: elements would alias)."""
    if len(st) != 4 or st[3] != 1:
        raise ValueError(f"{side} data strides {st}: four strides with head_dim stride 1 expected")
    for n, x in zip(shape[:3], st[:3]):
        if x < 0 or (n > 1 and (x == 0 or x % 2)):
            raise ValueError(f"{side} data strides {st}: block, token and head strides must be even and > 0")


def new_cache(fmt: Fp4Format, num_blocks: int, block_size: int, H: int, D: int, layout=Layout.BLOCK_NHD,
              k_global=None, v_global=None, fill: int = POISON, k_scale_strides=None, v_scale_strides=None,
              scale_tail: int = 0, k_data_strides=None, v_data_strides=None, data_tail: int = 0) -> Fp4Cache:
    """A cache filled with poison bytes. ``k_scale_strides`` / ``v_scale_strides`` (bytes,
    non-negative; None: dense) describe a scale pool with gaps: its buffer is as long as the
    farthest element plus ``scale_tail`` bytes, the gaps hold :data:`GAP_FILL`.
    ``k_data_strides`` / ``v_data_strides`` (elements, i.e. nibbles: ``head_dim`` stride 1, the
    others even; None: dense) do the same for the codes, with ``data_tail`` bytes after the
    farthest code byte."""
    c = Fp4Cache(Fp4Format(fmt), num_blocks, block_size, H, D, Layout(layout), k_global=k_global, v_global=v_global,
                 k_scale_strides=None if k_scale_strides is None else tuple(int(x) for x in k_scale_strides),
                 v_scale_strides=None if v_scale_strides is None else tuple(int(x) for x in v_scale_strides),
                 k_data_strides=None if k_data_strides is None else tuple(int(x) for x in k_data_strides),
                 v_data_strides=None if v_data_strides is None else tuple(int(x) for x in v_data_strides))
    c.k_codes = np.full(c.code_shape(), fill, np.uint8)
    c.v_codes = np.full(c.code_shape(), fill ^ 0x3C, np.uint8)
    for side, init in (("k", fill), ("v", fill ^ 0x3C)):
        st = getattr(c, f"{side}_data_strides")
        if st is None:
            continue
        _check_data_strides(side, c.data_shape(), st)
        span = sum((n - 1) * x for n, x in zip(c.code_shape(), c.code_byte_strides(side))) + 1
        c.set_code_buf(side, np.full(span + int(data_tail), GAP_FILL, np.uint8))
        getattr(c, f"{side}_codes")[...] = init
    c.k_scales = np.full(c.scale_shape(), fill ^ 0x11, np.uint8)
    c.v_scales = np.full(c.scale_shape(), fill ^ 0x22, np.uint8)
    for side, init in (("k", fill ^ 0x11), ("v", fill ^ 0x22)):
        st = getattr(c, f"{side}_scale_strides")
        if st is None:
            continue
        if len(st) != 4 or any(x < 0 for x in st):
            raise ValueError(f"{side} scale strides {st}: four non-negative strides expected")
        span = sum((n - 1) * x for n, x in zip(c.scale_shape(), st)) + 1
        c.set_scale_buf(side, np.full(span + int(scale_tail), GAP_FILL, np.uint8))
        getattr(c, f"{side}_scales")[...] = init
    return c


def encode_rows(fmt: Fp4Format, x: np.ndarray, g: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Oracle codes and scales of rows ``x[..., H, D]`` (g per head, NVFP4 only)."""
    if fmt == Fp4Format.NVFP4:
        return oracle.nvfp4_encode(x, global_scale=g)
    if fmt == Fp4Format.MXFP4:
        return oracle.mxfp4_encode(x, block=16, rule="ceil")
    return oracle.mxfp4_encode(x, block=32, rule="floor")


def decode_rows(fmt: Fp4Format, codes: np.ndarray, scales: np.ndarray, g: np.ndarray | None, out_dtype) -> np.ndarray:
    if fmt == Fp4Format.NVFP4:
        return oracle.nvfp4_decode(codes, scales, global_scale=g, out_dtype=out_dtype)
    return oracle.mxfp4_decode(codes, scales, out_dtype=out_dtype)


def fill_cache(cache: Fp4Cache, blocks: list[int], k: np.ndarray, v: np.ndarray) -> None:
    """Encode ``k``/``v`` ``[len(blocks) * bs, H, D]`` with the oracle into the given blocks, in order."""
    bs = cache.block_size
    for side, x in (("k", k), ("v", v)):
        codes, scales = encode_rows(cache.fmt, x, cache.g_per_head(side))
        for i, b in enumerate(blocks):
            for t in range(bs):
                cache.row(getattr(cache, f"{side}_codes"), b, t)[...] = codes[i * bs + t]
                cache.row(getattr(cache, f"{side}_scales"), b, t)[...] = scales[i * bs + t]


# ----------------------------------------------------------------------------- oracle answers


def slot_ok(slot: int, cache: Fp4Cache, invalid_slot: int) -> bool:
    return 0 <= slot < cache.num_blocks * cache.block_size and slot != invalid_slot


def expected_write(cache: Fp4Cache, key: np.ndarray, value: np.ndarray, slots, invalid_slot: int = -1) -> Fp4Cache:
    out = cache.copy()
    bs = cache.block_size
    for side, x in (("k", key), ("v", value)):
        codes, scales = encode_rows(cache.fmt, x, cache.g_per_head(side))
        for i, slot in enumerate(np.asarray(slots, np.int64)):
            if not slot_ok(int(slot), cache, invalid_slot):
                continue
            b, t = divmod(int(slot), bs)
            out.row(getattr(out, f"{side}_codes"), b, t)[...] = codes[i]
            out.row(getattr(out, f"{side}_scales"), b, t)[...] = scales[i]
    return out


def gathered_rows(cache: Fp4Cache, table: np.ndarray, seq_lens, max_seq_len: int, indptr=None):
    """(output row, block, offset) of every gathered token. PACKED (``indptr`` None):
    ``table[s, t // block_size]``; RAGGED (``table`` the flat indices): token t of
    sequence s uses block ``table[indptr[s] + t]`` (R-DATA), at offset ``t % block_size``."""
    bs = cache.block_size
    table = np.asarray(table, np.int64)
    for s, L in enumerate(seq_lens):
        for t in range(max(0, min(int(L), max_seq_len))):
            b = table[int(indptr[s]) + t] if indptr is not None else table[s, t // bs]
            yield s * max_seq_len + t, int(b), t % bs


def expected_gather(cache: Fp4Cache, table, seq_lens, max_seq_len: int, out_dtype: DType, out_init: dict,
                    indptr=None):
    """Oracle outputs: dequantized rows (or raw codes and scales when out_dtype is F4_E2M1).
    ``indptr`` given: ``table`` is a RAGGED table's flat indices (:func:`gathered_rows`)."""
    out = {k: v.copy() for k, v in out_init.items()}
    for row, b, t in gathered_rows(cache, np.asarray(table), seq_lens, max_seq_len, indptr):
        for side in ("k", "v"):
            codes = cache.row(getattr(cache, f"{side}_codes"), b, t)
            scales = cache.row(getattr(cache, f"{side}_scales"), b, t)
            if out_dtype == DType.F4_E2M1:
                out[side][row] = codes
                out[side + "_scales"][row] = scales
            else:
                out[side][row] = decode_rows(cache.fmt, codes, scales, cache.g_per_head(side), IO_NP[out_dtype])
    return out


# ----------------------------------------------------------------------------- C structs


def _tensor(dtype, layout, memory, shape, stride, ptr) -> abi.kvx_tensor_desc_t:
    t = abi.kvx_tensor_desc_t.new(dtype=int(dtype), layout=int(layout), memory=int(memory), ndim=len(shape))
    for i, (n, s) in enumerate(zip(shape, stride)):
        t.shape[i], t.stride[i] = int(n), int(s)
    t.data = ptr or None
    return t


def _dense_strides(shape) -> list[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= int(n)
    return out[::-1]


def _global_desc(g, H: int, arena: "_Arena", name: str, stride: int = 1) -> abi.kvx_scale_desc_t:
    sd = abi.kvx_scale_desc_t.new()
    if g is None:
        return sd
    arr = np.atleast_1d(np.asarray(g, np.float32))
    sd.dtype = int(DType.F32)
    if np.ndim(g) == 0:
        sd.granularity = int(ScaleGranularity.PER_TENSOR)
    else:
        sd.granularity, sd.ndim, sd.shape[0], sd.stride[0] = int(ScaleGranularity.PER_HEAD), 1, H, stride
        arr = ScaleSpec(arr, ScaleGranularity.PER_HEAD, stride=stride).buffer()
    sd.data = arena.put(name, arr)
    return sd


#: the buffers a write / a gather may only read (R-INPUTS), compared after each call
READONLY_WRITE = frozenset({"key", "value", "slots", "key scales", "value scales", "k global scale", "v global scale"})
READONLY_GATHER = frozenset({"k cache", "v cache", "k scale pool", "v scale pool", "k global scale", "v global scale",
                             "indices", "indptr", "seq_lens"})


class _Arena(CallArena):
    """The executor's arena of one call, with the read-only buffers named up front and
    read back in the shape of a template array."""

    def __init__(self, memory: Memory, readonly: frozenset = frozenset()):
        super().__init__(memory, 0)
        self.readonly_names = readonly

    def put(self, name: str, array: np.ndarray) -> int:
        return super().put(name, array, readonly=name in self.readonly_names)

    def get(self, name: str, like: np.ndarray) -> np.ndarray:
        return self.bufs[name].download().view(like.dtype).reshape(like.shape)


def cache_struct(cache: Fp4Cache, arena: _Arena, cache_size: int | None = None) -> abi.kvx_cache_desc_v1_2_t:
    memory = arena.memory
    nb, bs, H, D, J = cache.num_blocks, cache.block_size, cache.num_kv_heads, cache.head_dim, cache.head_dim // cache.B
    logical = (nb, bs, H, D) if cache.layout == Layout.BLOCK_NHD else (nb, H, bs, D)
    sshape = cache.scale_shape()
    c = abi.kvx_cache_desc_v1_2_t.new(num_blocks=nb, block_size=bs, num_kv_heads=H, head_dim=D)
    c.k = _tensor(DType.F4_E2M1, cache.layout, memory, logical, cache.data_strides("k"),
                  arena.put("k cache", cache.code_storage("k")))
    c.v = _tensor(DType.F4_E2M1, cache.layout, memory, logical, cache.data_strides("v"),
                  arena.put("v cache", cache.code_storage("v")))
    c.pool = abi.kvx_pool_desc_t.new()
    x = abi.kvx_fp4_cache_ext_t.new(format=int(cache.fmt))
    sdt = scale_dtype(cache.fmt)
    x.k_scales = _tensor(sdt, cache.layout, memory, sshape, cache.scale_strides("k"),
                         arena.put("k scale pool", cache.scale_storage("k")))
    x.v_scales = _tensor(sdt, cache.layout, memory, sshape, cache.scale_strides("v"),
                         arena.put("v scale pool", cache.scale_storage("v")))
    x.k_global = _global_desc(cache.k_global, H, arena, "k global scale", cache.global_stride)
    x.v_global = _global_desc(cache.v_global, H, arena, "v global scale", cache.global_stride)
    c.fp4 = x
    if cache_size is not None:
        c.size = cache_size
    _ = J
    return c


def _read_cache(cache: Fp4Cache, arena: _Arena) -> Fp4Cache:
    out = cache.copy()
    for side in ("k", "v"):
        got = arena.get(f"{side} cache", cache.code_storage(side))
        if getattr(cache, f"{side}_code_buf") is not None:
            out.set_code_buf(side, got)
        else:
            setattr(out, f"{side}_codes", got)
        got = arena.get(f"{side} scale pool", cache.scale_storage(side))
        if getattr(cache, f"{side}_scale_buf") is not None:
            out.set_scale_buf(side, got)
        else:
            setattr(out, f"{side}_scales", got)
    return out


@dataclass
class Fp4Result:
    status: int
    cache: Fp4Cache | None = None
    out: dict = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    #: read-only inputs the call changed (R-INPUTS), one line each
    input_changes: list[str] = field(default_factory=list)


def _io(dtype: DType, memory, ptr_k, ptr_v, rows: int, H: int, D: int) -> abi.kvx_kv_io_desc_t:
    shape = (rows, H, D)
    io = abi.kvx_kv_io_desc_t.new(num_tokens=rows, num_kv_heads=H, head_dim=D)
    io.key = _tensor(dtype, Layout.INVALID, memory, shape, _dense_strides(shape), ptr_k)
    io.value = _tensor(dtype, Layout.INVALID, memory, shape, _dense_strides(shape), ptr_v)
    return io


def _io_scales(fmt, memory, ptr_k, ptr_v, rows: int, H: int, J: int) -> abi.kvx_fp4_io_scales_t:
    shape = (rows, H, J)
    x = abi.kvx_fp4_io_scales_t.new()
    x.key_scales = _tensor(scale_dtype(fmt), Layout.INVALID, memory, shape, _dense_strides(shape), ptr_k)
    x.value_scales = _tensor(scale_dtype(fmt), Layout.INVALID, memory, shape, _dense_strides(shape), ptr_v)
    return x


def view_strides(arr: np.ndarray, nibbles: bool = False) -> list[int]:
    """``arr``'s strides in elements, as an IO tensor descriptor gives them (``nibbles``: packed F4_E2M1 codes,
    two per byte, their strides counted in nibbles, R-FP4)."""
    st = [s // arr.itemsize for s in arr.strides]
    return [2 * s for s in st[:-1]] + [1] if nibbles else st


def _put_view(arena: "_Arena", name: str, arr: np.ndarray, nibbles: bool = False) -> tuple[int, list[int] | None]:
    """Place an IO array: a C-contiguous one as it is (strides None: the dense ones), a strided view (an
    IO tensor read through its strides, spec 4.2, 6.8) as the whole array it views, the pointer at its
    first element, with its strides in elements (``nibbles``: packed F4_E2M1 codes, two per byte, their
    strides in nibbles, R-FP4). The gaps of that array are part of the read-only input (R-INPUTS)."""
    if arr.flags.c_contiguous or arr.size == 0:
        return arena.put(name, arr), None
    base = arr
    while isinstance(base.base, np.ndarray):
        base = base.base
    off = arr.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    item = arr.itemsize
    if not base.flags.c_contiguous or off < 0 or off % item or any(s <= 0 or s % item for s in arr.strides):
        raise ValueError(f"{name}: a view of positive strides into a C-contiguous array is needed")
    if nibbles and arr.strides[-1] != item:
        raise ValueError(f"{name}: packed codes need adjacent bytes along head_dim")
    return arena.put(name, base) + off, view_strides(arr, nibbles)


def _set_strides(t, st: list[int] | None) -> None:
    for i, s in enumerate(st or ()):
        t.stride[i] = int(s)


def run_write(provider, cache: Fp4Cache, key: np.ndarray, value: np.ndarray, slots, *, memory=Memory.HOST,
              invalid_slot: int = -1, slot_dtype=DType.S64, raw_scales: tuple | None = None,
              cache_size: int | None = None, overrides: dict | None = None, stream=None) -> Fp4Result:
    """Write ``key``/``value`` (``[n, H, D]`` F32/F16/BF16, or packed codes ``[n, H, D/2]`` with
    ``raw_scales=(k_scales, v_scales)``) at ``slots``; returns the cache as left by the call. A strided
    numpy view among them is passed through its strides (:func:`_put_view`)."""
    arena, c, d = _place_write(provider, cache, key, value, slots, memory, invalid_slot, slot_dtype, raw_scales,
                               cache_size, overrides)
    st = provider.write_kv(c, d, stream)
    buffers.synchronize(Memory(memory))
    return Fp4Result(int(st), _read_cache(cache, arena), {}, arena.violations(), arena.input_changes())


def run_write_repeated(provider, cache: Fp4Cache, key: np.ndarray, value: np.ndarray, slots, *, memory=Memory.HOST,
                       times: int = 3) -> list[Fp4Result]:
    """The same write ``times`` times through one set of buffers and descriptors (the same pointers,
    slots and rows), the cache's codes and scale pools given their contents before the first call
    again between the calls (the caller rewriting them); one result per call (the cache after it)."""
    arena, c, d = _place_write(provider, cache, key, value, slots, memory, invalid_slot=-1, slot_dtype=DType.S64,
                               raw_scales=None, cache_size=None, overrides=None)
    out = []
    for i in range(times):
        if i:
            for side in ("k", "v"):
                arena.refill(f"{side} cache", cache.code_storage(side))
                arena.refill(f"{side} scale pool", cache.scale_storage(side))
        st = provider.write_kv(c, d, None)
        buffers.synchronize(Memory(memory))
        out.append(Fp4Result(int(st), _read_cache(cache, arena), {}, arena.violations(), arena.input_changes()))
    return out


def _place_write(provider, cache: Fp4Cache, key, value, slots, memory, invalid_slot, slot_dtype, raw_scales,
                 cache_size, overrides):
    """The buffers and 1.2 structs of a write: (arena, cache struct, write desc)."""
    _record_call(provider, memory, cache)
    arena = _Arena(Memory(memory), READONLY_WRITE)
    c = cache_struct(cache, arena, cache_size)
    n, H = key.shape[0], cache.num_kv_heads
    D = cache.head_dim
    if raw_scales is not None:
        dt = DType.F4_E2M1
    else:
        dt = {v: k for k, v in IO_NP.items()}[np.dtype(key.dtype)]
    raw = raw_scales is not None
    kp, kst = _put_view(arena, "key", key, raw) if n else (0, None)
    vp, vst = _put_view(arena, "value", value, raw) if n else (0, None)
    io = _io(dt, memory, kp, vp, n, H, D)
    _set_strides(io.key, kst)
    _set_strides(io.value, vst)
    s = np.asarray(slots, np.int64 if slot_dtype == DType.S64 else np.int32)
    d = abi.kvx_write_desc_v1_2_t.new()
    d.io = io
    d.slots = abi.kvx_slot_mapping_t.new(dtype=int(slot_dtype), token_count=n, invalid_slot=invalid_slot)
    d.slots.slots = arena.put("slots", s) if n else None
    d.k_scale_desc = abi.kvx_scale_desc_t.new()
    d.v_scale_desc = abi.kvx_scale_desc_t.new()
    if raw_scales is not None:
        ks, vs = raw_scales
        (ksp, ksst), (vsp, vsst) = _put_view(arena, "key scales", ks), _put_view(arena, "value scales", vs)
        d.fp4 = _io_scales(cache.fmt, memory, ksp, vsp, n, H, D // cache.B)
        _set_strides(d.fp4.key_scales, ksst)
        _set_strides(d.fp4.value_scales, vsst)
    _apply(c, d, overrides)
    return arena, c, d


def run_validate(provider, cache: Fp4Cache, *, memory=Memory.HOST, cache_size: int | None = None,
                 overrides: dict | None = None) -> Fp4Result:
    """``kvx_validate_cache_desc`` on the 1.2 cache struct of ``cache`` (its buffers read-only,
    as for a gather); ``Fp4Result.cache`` is the cache as the call left it."""
    _record_call(provider, memory, cache)
    arena = _Arena(Memory(memory), READONLY_GATHER)
    c = cache_struct(cache, arena, cache_size)
    _apply(c, None, overrides)
    st = provider.validate_cache_desc(c)
    buffers.synchronize(Memory(memory))
    return Fp4Result(int(st), _read_cache(cache, arena), {}, arena.violations(), arena.input_changes())


def run_gather(provider, cache: Fp4Cache, table: np.ndarray, seq_lens, max_seq_len: int, out_dtype: DType, *,
               memory=Memory.HOST, cache_size: int | None = None, overrides: dict | None = None,
               stream=None, index_dtype: DType = DType.S32, indptr=None, indptr_dtype: DType = DType.S32,
               max_blocks_per_seq: int | None = None) -> Fp4Result:
    """Gather into ``[S * max_seq_len, H, D]`` of ``out_dtype`` (F4_E2M1: raw codes + scales).

    PACKED (``indptr`` None): ``table`` is ``[S, max_blocks_per_seq]``. RAGGED: ``table`` is
    the flat indices, ``indptr`` the ``S + 1`` offsets (``max_blocks_per_seq`` required).
    Indices in ``index_dtype`` (S32 or S64), indptr in ``indptr_dtype``."""
    arena, c, d, init, rows = _place_gather(provider, cache, table, seq_lens, max_seq_len, out_dtype, memory,
                                            cache_size, overrides, index_dtype, indptr, indptr_dtype,
                                            max_blocks_per_seq)
    st = provider.gather_kv(c, d, stream)
    buffers.synchronize(Memory(memory))
    return _gather_result(st, arena, init, rows, out_dtype)


def run_gather_repeated(provider, cache: Fp4Cache, table: np.ndarray, seq_lens, max_seq_len: int, out_dtype: DType,
                        *, memory=Memory.HOST, times: int = 3) -> list[Fp4Result]:
    """The same PACKED gather ``times`` times through one set of buffers and descriptors, the
    outputs given their initial (poison) contents again between the calls; one result per call."""
    arena, c, d, init, rows = _place_gather(provider, cache, table, seq_lens, max_seq_len, out_dtype, memory,
                                            cache_size=None, overrides=None, index_dtype=DType.S32, indptr=None,
                                            indptr_dtype=DType.S32, max_blocks_per_seq=None)
    out = []
    for i in range(times):
        if i and rows:
            arena.refill("out key", init["k"])
            arena.refill("out value", init["v"])
        st = provider.gather_kv(c, d, None)
        buffers.synchronize(Memory(memory))
        out.append(_gather_result(st, arena, init, rows, out_dtype))
    return out


def _place_gather(provider, cache: Fp4Cache, table, seq_lens, max_seq_len: int, out_dtype: DType, memory, cache_size,
                  overrides, index_dtype, indptr, indptr_dtype, max_blocks_per_seq):
    """The buffers and 1.2 structs of a gather: (arena, cache struct, gather desc, initial outputs, rows)."""
    _record_call(provider, memory, cache)
    arena = _Arena(Memory(memory), READONLY_GATHER)
    c = cache_struct(cache, arena, cache_size)
    np_idx = {DType.S32: np.int32, DType.S64: np.int64}
    ragged = indptr is not None
    if ragged:
        table = np.asarray(table, np.int64).astype(np_idx[DType(index_dtype)]).reshape(-1)
        indptr = np.asarray(indptr, np.int64).astype(np_idx[DType(indptr_dtype)]).reshape(-1)
        S, mbps = len(indptr) - 1, int(max_blocks_per_seq)
    else:
        table = np.asarray(table, np.int64).astype(np_idx[DType(index_dtype)])
        S, mbps = table.shape
    rows, H, D, J = S * max_seq_len, cache.num_kv_heads, cache.head_dim, cache.head_dim // cache.B
    init = out_init(cache, rows, out_dtype)
    pk = arena.put("out key", init["k"]) if rows else 0
    pv = arena.put("out value", init["v"]) if rows else 0
    d = abi.kvx_gather_desc_v1_2_t.new(max_seq_len=max_seq_len)
    d.io = _io(out_dtype, memory, pk, pv, rows, H, D)
    if ragged:
        d.block_table = abi.kvx_block_table_t.new(format=int(TableFormat.RAGGED), index_dtype=int(index_dtype),
                                                  indptr_dtype=int(indptr_dtype), seq_count=S, beam_width=1,
                                                  max_blocks_per_seq=mbps, indices_count=table.size,
                                                  indptr_count=indptr.size)
        d.block_table.indptr = arena.put("indptr", indptr)
    else:
        d.block_table = abi.kvx_block_table_t.new(format=int(TableFormat.PACKED), index_dtype=int(index_dtype),
                                                  seq_count=S, beam_width=1, max_blocks_per_seq=mbps,
                                                  indices_count=S * mbps)
    d.block_table.indices = arena.put("indices", table) if table.size else None
    d.seq_lens = abi.kvx_seq_lens_t.new(dtype=int(DType.S32), seq_count=S)
    d.seq_lens.lengths = arena.put("seq_lens", np.asarray(seq_lens, np.int32)) if S else None
    if out_dtype == DType.F4_E2M1:
        d.fp4 = _io_scales(cache.fmt, memory, arena.put("out key scales", init["k_scales"]),
                           arena.put("out value scales", init["v_scales"]), rows, H, J)
    _apply(c, d, overrides)
    return arena, c, d, init, rows


def _gather_result(st, arena: _Arena, init: dict, rows: int, out_dtype: DType) -> Fp4Result:
    out = {}
    if rows:
        out = {"k": arena.get("out key", init["k"]), "v": arena.get("out value", init["v"])}
        if out_dtype == DType.F4_E2M1:
            out["k_scales"] = arena.get("out key scales", init["k_scales"])
            out["v_scales"] = arena.get("out value scales", init["v_scales"])
    # a gather only reads the cache and its scale pools: a change to them is a changed input
    return Fp4Result(int(st), None, out, arena.violations(), arena.input_changes())


def out_init(cache: Fp4Cache, rows: int, out_dtype: DType) -> dict:
    H, D, J = cache.num_kv_heads, cache.head_dim, cache.head_dim // cache.B
    if out_dtype == DType.F4_E2M1:
        return {"k": np.full((rows, H, D // 2), POISON, np.uint8), "v": np.full((rows, H, D // 2), POISON, np.uint8),
                "k_scales": np.full((rows, H, J), POISON, np.uint8), "v_scales": np.full((rows, H, J), POISON, np.uint8)}
    dt = IO_NP[out_dtype]
    poison = np.full((rows, H, D * dt.itemsize), POISON, np.uint8).view(dt)
    return {"k": poison.copy(), "v": poison.copy()}


def _apply(cache_struct_, desc, overrides: dict | None) -> None:
    """Dotted overrides on the built structs: ``{"cache.fp4.format": 7, "desc.fp4.size": 0}``."""
    for path, value in (overrides or {}).items():
        root, *parts = path.split(".")
        obj = cache_struct_ if root == "cache" else desc
        for p in parts[:-1]:
            obj = getattr(obj, p)
        leaf = parts[-1]
        if "[" in leaf:
            name, idx = leaf[:-1].split("[")
            getattr(obj, name)[int(idx)] = value
        else:
            setattr(obj, leaf, value)


def struct_bytes(s: ctypes.Structure) -> bytes:
    return ctypes.string_at(ctypes.addressof(s), ctypes.sizeof(s))


# ----------------------------------------------------------------------------- tiers

#: Signed E2M1 grid in value order (+-0 share index 7).
_GRID = np.array([-6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)


def _grid_index(code_vals: np.ndarray) -> np.ndarray:
    return np.searchsorted(_GRID, code_vals.astype(np.float32))


def _scale_f32(fmt: Fp4Format, s: np.ndarray) -> np.ndarray:
    if fmt == Fp4Format.NVFP4:
        return s.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return s.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)


def written_rows(cache: Fp4Cache, slots, invalid_slot: int = -1) -> list[tuple[int, int, int]]:
    """(token i, block, offset) of each slot written, the last write of a slot winning."""
    last: dict[int, int] = {}
    for i, s in enumerate(np.asarray(slots, np.int64)):
        if slot_ok(int(s), cache, invalid_slot):
            last[int(s)] = i
    return [(i, s // cache.block_size, s % cache.block_size) for s, i in sorted(last.items(), key=lambda kv: kv[1])]


def _nan_scale(fmt: Fp4Format, s: np.ndarray) -> np.ndarray:
    """Scale bytes that are NaN: E4M3 0x7F / 0xFF (NVFP4), UE8M0 0xFF (MXFP4)."""
    s = np.asarray(s, np.uint8)
    return (s & 0x7F) == 0x7F if fmt == Fp4Format.NVFP4 else s == 0xFF


def scale_gap_problems(before: Fp4Cache, got: Fp4Cache, limit: int = 4) -> list[str]:
    """Bytes in the gaps of a padded scale pool (no scale element there) or of a padded data
    tensor (no code byte there) that changed; [] for dense tensors."""
    out = []
    for side in ("k", "v"):
        for what, gaps, storage, strides in (
                ("scale pool", before.scale_gaps(side), "scale_storage", f"{before.scale_strides(side)} bytes"),
                ("data tensor", before.code_gaps(side), "code_storage", f"{before.data_strides(side)} elements")):
            if gaps is None:
                continue
            b = getattr(before, storage)(side).reshape(-1)
            g = getattr(got, storage)(side).reshape(-1)
            _first(out, np.flatnonzero(gaps & (b != g)), limit,
                   lambda i: f"{side} {what} byte {int(i)} (a gap, strides {strides}): expected "
                             f"{int(b[i]):#04x} unchanged, got {int(g[i]):#04x}",
                   f"{side} {what}: {{}} gap bytes changed in all")
    return out


def _first(out: list[str], bad, limit: int, line, total: str) -> None:
    """Append ``line(x)`` for the first ``limit`` of ``bad``, then ``total`` (``{}``: how many) if
    there are more."""
    out.extend(line(x) for x in bad[:limit])
    if len(bad) > limit:
        out.append(total.format(len(bad)))


def special_blocks(cache: Fp4Cache, key, value, slots, invalid_slot: int = -1) -> dict[str, np.ndarray]:
    """Per side, a mask over the scale array of the blocks a write fills from inputs holding a
    NaN or an Inf (``key`` / ``value``: the values passed, as FP32; an F16 input past 65504 is
    such an Inf). The readings leave them open: "NaN/Inf inputs must not crash and must not
    disturb other blocks (informational beyond that)"."""
    out = {}
    for side, x in (("k", key), ("v", value)):
        m = np.zeros(cache.scale_shape(), bool)
        xs = np.asarray(x, np.float32)
        for i, b, t in written_rows(cache, slots, invalid_slot):
            blk = xs[i].reshape(cache.num_kv_heads, -1, cache.B)
            cache.row(m, b, t)[...] = ~np.all(np.isfinite(blk), axis=-1)
        out[side] = m
    return out


def exact_write_problems(got: Fp4Cache, want: Fp4Cache, limit: int = 4,
                         special: dict[str, np.ndarray] | None = None) -> list[str]:
    """Codes and scale bytes of a quantizing write against the oracle's, bit for bit,
    except NaN blocks, compared as a class (docs/numerics.md): where both scale bytes are
    NaN (E4M3 0x7F or 0xFF, UE8M0 0xFF) the block decodes to NaN whatever its bytes, so
    neither its scale encoding nor its codes are pinned. ``special`` (:func:`special_blocks`):
    blocks filled from NaN / Inf inputs, not compared at all (informational in the readings;
    ``fp4.write.specials_isolated`` checks that they disturb no other block)."""
    out = scale_gap_problems(want, got)
    for side in ("k", "v"):
        gs, es = getattr(got, f"{side}_scales"), getattr(want, f"{side}_scales")
        nan_blk = _nan_scale(got.fmt, gs) & _nan_scale(want.fmt, es) if gs.shape == es.shape else None
        if nan_blk is not None and special is not None and special[side].shape == nan_blk.shape:
            nan_blk = nan_blk | special[side]
        for a in (f"{side}_codes", f"{side}_scales"):
            g, e = getattr(got, a), getattr(want, a)
            differ = g != e
            if nan_blk is not None and differ.shape[:-1] == nan_blk.shape[:-1]:
                if a.endswith("_scales"):
                    differ &= ~nan_blk
                elif g.shape[-1] % nan_blk.shape[-1] == 0:  # B / 2 code bytes per scale
                    differ &= ~np.repeat(nan_blk, g.shape[-1] // nan_blk.shape[-1], axis=-1)
            _first(out, np.argwhere(differ), limit,
                   lambda idx: f"{a}{tuple(int(v) for v in idx)}: expected {int(e[tuple(idx)]):#04x}, "
                               f"got {int(g[tuple(idx)]):#04x}",
                   f"{a}: {{}} bytes differ in all")
    return out


def compatible_write_problems(before: Fp4Cache, got: Fp4Cache, want: Fp4Cache, key, value, slots,
                              invalid_slot: int = -1, metric_slack: float = 1.05, limit: int = 6) -> list[str]:
    """The "compatible" tier (readings: FP4 extension) of a write; [] when it holds.

    Per block: the scale within one E4M3 step / one exponent of the oracle's (an all-zero
    block exactly scale 0 and codes 0); per element: the provider's code within one
    grid step of the oracle's code for the provider's own scale (any code where that scale
    decodes to 0: every code then decodes to +-0); the relative RMSE of
    the provider's decode at most ``metric_slack`` times the oracle's. Blocks with
    NaN/Inf inputs are informational (skipped); bytes of rows not written are unchanged.
    """
    probs: list[str] = scale_gap_problems(before, got)
    rows = written_rows(before, slots, invalid_slot)
    fmt, B = before.fmt, before.B
    # untouched storage
    mask_c = np.ones(before.code_shape(), bool)
    mask_s = np.ones(before.scale_shape(), bool)
    for _, b, t in rows:
        before.row(mask_c, b, t)[...] = False
        before.row(mask_s, b, t)[...] = False
    for a, m in (("k_codes", mask_c), ("v_codes", mask_c), ("k_scales", mask_s), ("v_scales", mask_s)):
        n = int(np.count_nonzero(getattr(got, a)[m] != getattr(before, a)[m]))
        if n:
            probs.append(f"{a}: {n} byte(s) outside the written rows changed")
    err_p = err_r = ref_pow = 0.0
    H, J = before.num_kv_heads, before.head_dim // B
    for side, x in (("k", np.asarray(key, np.float32)), ("v", np.asarray(value, np.float32))):
        if not rows:
            break
        # every written row's blocks at once: [R, H, J, B] values and codes, [R, H, J] scale bytes
        toks = np.array([i for i, _, _ in rows])
        xs = x[toks].reshape(len(rows), H, J, B)

        def stack(arr):
            return np.stack([before.row(arr, b, t) for _, b, t in rows])
        cp = oracle.unpack_e2m1(stack(getattr(got, f"{side}_codes"))).reshape(xs.shape)
        cr = oracle.unpack_e2m1(stack(getattr(want, f"{side}_codes"))).reshape(xs.shape)
        sp = stack(getattr(got, f"{side}_scales")).astype(np.int64)
        sr = stack(getattr(want, f"{side}_scales")).astype(np.int64)
        # the provider's scale decoded (times g: NVFP4), per block
        g = before.g_per_head(side)[None, :, None] if fmt == Fp4Format.NVFP4 else np.ones((1, 1, 1), np.float32)
        sc_p, sc_r = _scale_f32(fmt, sp.astype(np.uint8)), _scale_f32(fmt, sr.astype(np.uint8))
        finite = np.all(np.isfinite(xs), axis=-1)  # blocks with NaN / Inf inputs: informational, skipped
        zero = finite & ~np.any(xs, axis=-1)
        bad_zero = zero & ((sp != 0) | np.any(cp, axis=-1))
        far_scale = (np.abs(sp - sr) > 1) | (sp == 0xFF) | ((sp > 0x7E) if fmt == Fp4Format.NVFP4 else False)
        bad_scale = finite & ~zero & far_scale
        judged = finite & ~zero & ~bad_scale
        with np.errstate(over="ignore", invalid="ignore"):
            d = sc_p * g
        # a scale that decodes to 0 (NVFP4's E4M3 underflow, scale byte 0): every code decodes to +-0, the
        # decode of the oracle's codes (readings: "each decoded value equal to the decode of the reference
        # code or of an adjacent code"); x / 0 saturating at +-6, the formula read literally, is as
        # compatible as the oracle's codes 0 (docs/fp4.md)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            ref_codes = oracle.float_to_e2m1(np.where(d[..., None] == 0, np.float32(0), xs / d[..., None]))
        far = np.abs(_grid_index(oracle.e2m1_to_float(cp)) - _grid_index(oracle.e2m1_to_float(ref_codes))) > 1
        bad_codes = judged & (d != 0) & np.any(far, axis=-1)
        for r, h, j in np.argwhere(bad_zero | bad_scale | bad_codes):
            i, b, t = rows[r]
            where = f"{side} token {i} (block {b}, offset {t}) head {h} scale block {j}"
            p, q = int(sp[r, h, j]), int(sr[r, h, j])
            if bad_zero[r, h, j]:
                probs.append(f"{where}: all-zero block must store scale 0 and codes 0, got scale "
                             f"{p:#04x} codes {cp[r, h, j].tolist()}")
            elif bad_scale[r, h, j]:
                probs.append(f"{where}: scale byte {p:#04x} more than one step from the oracle's {q:#04x}")
            else:
                probs.append(f"{where}: codes {cp[r, h, j].tolist()} not within one step of the oracle's "
                             f"codes for scale {p:#04x}")
            if len(probs) > limit:
                return probs
        with np.errstate(over="ignore", invalid="ignore"):  # decode as the oracle's: (E2M1 x s) x g in FP32
            dec_p = (oracle.e2m1_to_float(cp) * sc_p[..., None]) * g[..., None]
            dec_r = (oracle.e2m1_to_float(cr) * sc_r[..., None]) * g[..., None]
        sel = judged[..., None]
        b64 = xs.astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            err_p += float(np.sum(np.where(sel, (dec_p.astype(np.float64) - b64) ** 2, 0.0)))
            err_r += float(np.sum(np.where(sel, (dec_r.astype(np.float64) - b64) ** 2, 0.0)))
        ref_pow += float(np.sum(np.where(sel, b64 ** 2, 0.0)))
    if ref_pow > 0 and not err_p <= metric_slack * metric_slack * err_r + 1e-30 * ref_pow:
        probs.append(f"relative RMSE {np.sqrt(err_p / ref_pow):.5f} exceeds {metric_slack:.2f} x the oracle's "
                     f"{np.sqrt(err_r / ref_pow):.5f}")
    return probs


def _ordered(bits: np.ndarray, nbits: int) -> np.ndarray:
    b = bits.astype(np.int64)
    sign = (b >> (nbits - 1)) & 1
    mag = b & ((1 << (nbits - 1)) - 1)
    return np.where(sign == 1, -mag, mag)


def gather_problems(got: dict, want: dict, out_dtype: DType, tier: str, limit: int = 4) -> list[str]:
    """"exact": every byte equal (a NaN of a dequantizing gather may be any NaN);
    "compatible": dequantized values within one ulp of the output dtype (NaN where the
    oracle has NaN); raw transfers and untouched rows byte-identical."""
    probs = []
    for k, e in want.items():
        g = got.get(k)
        if g is None or g.shape != e.shape:
            probs.append(f"{k}: output missing or of shape {None if g is None else g.shape}, expected {e.shape}")
            continue
        if out_dtype == DType.F4_E2M1 or k.endswith("_scales"):  # a raw transfer: a plain copy
            bad = np.argwhere(g.view(np.uint8) != e.view(np.uint8))
        elif tier == "exact":  # bit for bit, a NaN of the decode compared as a class (docs/numerics.md)
            nbits = e.dtype.itemsize * 8
            ut = {8: np.uint8, 16: np.uint16, 32: np.uint32}[nbits]
            with np.errstate(invalid="ignore"):
                both_nan = np.isnan(g.astype(np.float32)) & np.isnan(e.astype(np.float32))
            bad = np.argwhere((g.view(ut) != e.view(ut)) & ~both_nan)
        else:
            nbits = e.dtype.itemsize * 8
            ut = np.uint32 if nbits == 32 else np.uint16
            gb, eb = g.view(ut), e.view(ut)
            with np.errstate(invalid="ignore"):
                gn, en = np.isnan(g.astype(np.float32)), np.isnan(e.astype(np.float32))
            far = np.abs(_ordered(gb, nbits) - _ordered(eb, nbits)) > 1
            bad = np.argwhere(np.where(en | gn, en != gn, far))
        for idx in bad[:limit]:
            t = tuple(int(v) for v in idx)
            probs.append(f"{k}{t}: expected {e[t]!r}, got {g[t]!r}")
        if len(bad) > limit:
            probs.append(f"{k}: {len(bad)} elements differ in all")
    return probs


# ----------------------------------------------------------------------------- concurrent writes (R-THREADS)


def run_concurrent_writes(provider, cache: Fp4Cache, parts, *, memory=Memory.HOST, stream=None,
                          timeout_s: float = 60.0) -> tuple[list[int], Fp4Result]:
    """Write each ``(key, value, slots)`` of ``parts`` into ONE shared FP4 cache, one thread per
    part, all released together by a barrier right before the provider call (ctypes drops the
    GIL, so the calls overlap). Every struct and buffer lives in one arena; returns the statuses
    of the calls (None for a thread that did not return) and the cache as left by all of them."""
    import threading

    n_parts = len(parts)
    ro = set(READONLY_WRITE)
    for i in range(n_parts):
        ro |= {f"key {i}", f"value {i}", f"slots {i}"}
    arena = _Arena(Memory(memory), frozenset(ro))
    c = cache_struct(cache, arena)
    H, D = cache.num_kv_heads, cache.head_dim
    descs = []
    for i, (key, value, slots) in enumerate(parts):
        n = key.shape[0]
        dt = {v: k for k, v in IO_NP.items()}[np.dtype(key.dtype)]
        d = abi.kvx_write_desc_v1_2_t.new()
        d.io = _io(dt, memory, arena.put(f"key {i}", key), arena.put(f"value {i}", value), n, H, D)
        d.slots = abi.kvx_slot_mapping_t.new(dtype=int(DType.S64), token_count=n, invalid_slot=-1)
        d.slots.slots = arena.put(f"slots {i}", np.asarray(slots, np.int64))
        d.k_scale_desc = abi.kvx_scale_desc_t.new()
        d.v_scale_desc = abi.kvx_scale_desc_t.new()
        descs.append(d)
    from .threads import run_threads

    barrier = threading.Barrier(n_parts)

    def call(i: int) -> int:
        barrier.wait(timeout=timeout_s)
        return int(provider.write_kv(c, descs[i], stream))

    statuses = run_threads([lambda i=i: call(i) for i in range(n_parts)], timeout_s)
    buffers.synchronize(Memory(memory))
    return statuses, Fp4Result(0, _read_cache(cache, arena), {}, arena.violations(), arena.input_changes())
