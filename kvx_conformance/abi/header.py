"""ctypes mirror of ``csrc/include/kvx/kvx_abi.h`` (KVX ABI v1.1, and the 1.2 FP4 extension).

Every struct and enum of the header, field for field. The classes named as the C
typedefs (``kvx_cache_desc_t`` ...) are the v1.1 structs: the harness sends those to
every provider. KVX 1.2 appends one field to each top-level struct; the
``*_v1_2`` subclasses add it (ctypes appends a subclass's fields to its base's), and
:data:`STRUCTS_V1_2` maps each C typedef name to its 1.2 layout. The FP4 suite and
the accuracy runner use the 1.2 structs, and only with a provider that reports ABI
minor 2 or more (or to check that a 1.1 provider refuses them cleanly). ``tests/test_abi_layout.py``
holds this module against the ABI probe compiled from the header (size, alignment
and offset of every field, every enumerator value) and against the published v1.1
layout table.
"""
from __future__ import annotations

import ctypes
import enum

ABI_VERSION_MAJOR = 1
ABI_VERSION_MINOR = 2  # the header's; V1_1_SIZES stay the minimum every provider accepts
ABI_VERSION_PATCH = 0
MAX_TENSOR_DIMS = 5


class Status(enum.IntEnum):
    OK = 0
    INVALID_ARGUMENT = 1
    UNSUPPORTED = 2
    OUT_OF_RANGE = 3
    INCOMPATIBLE = 4
    INTERNAL_ERROR = 5


class DType(enum.IntEnum):
    INVALID = 0
    F16 = 1
    BF16 = 2
    F32 = 3
    F8_E4M3 = 4
    F8_E5M2 = 5
    S32 = 6
    S64 = 7
    U32 = 8
    U64 = 9
    U8 = 10
    F4_E2M1 = 11  # KVX 1.2: packed two per byte, element 2i in the low nibble
    UE8M0 = 12  # KVX 1.2: exponent byte, 2**(b - 127), 0xFF NaN


class Memory(enum.IntEnum):
    UNKNOWN = 0
    HOST = 1
    DEVICE = 2
    UNIFIED = 3


class Layout(enum.IntEnum):
    INVALID = 0
    BLOCK_NHD = 1
    BLOCK_HND = 2
    BLOCK_HND_PACKED = 3
    BLOCK_CUSTOM = 15


class TableFormat(enum.IntEnum):
    INVALID = 0
    PACKED = 1
    RAGGED = 2
    KV_OFFSETS = 3


class TableFlags(enum.IntFlag):
    NONE = 0
    KVCACHEINDEX = 1


class Fp4Format(enum.IntEnum):
    """KVX 1.2 ``kvx_fp4_format_t``."""

    NONE = 0
    NVFP4 = 1
    MXFP4 = 2
    MXFP4_OCP = 3


class ScaleGranularity(enum.IntEnum):
    NONE = 0
    PER_TENSOR = 1
    PER_BLOCK = 2
    PER_HEAD = 3
    PER_BLOCK_HEAD = 4


# C enums are 4-byte ints on every supported target.
c_enum = ctypes.c_int
_I64x5 = ctypes.c_int64 * MAX_TENSOR_DIMS


class _Sized(ctypes.Structure):
    """Base: every KVX struct starts with ``uint32_t size``; ``new()`` fills it."""

    @classmethod
    def new(cls, **fields):
        obj = cls()
        obj.size = ctypes.sizeof(cls)
        for name, value in fields.items():
            setattr(obj, name, value)
        return obj


class kvx_version_t(_Sized):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("abi_major", ctypes.c_uint32),
        ("abi_minor", ctypes.c_uint32),
        ("abi_patch", ctypes.c_uint32),
    ]


class kvx_tensor_desc_t(_Sized):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("dtype", c_enum),
        ("layout", c_enum),
        ("memory", c_enum),
        ("ndim", ctypes.c_uint32),
        ("shape", _I64x5),
        ("stride", _I64x5),
        ("data", ctypes.c_void_p),
    ]


class kvx_pool_desc_t(_Sized):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("memory", c_enum),
        ("bytes_per_block", ctypes.c_uint32),
        ("primary", ctypes.c_void_p),
        ("secondary", ctypes.c_void_p),
    ]


class kvx_cache_desc_t(_Sized):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("num_blocks", ctypes.c_uint32),
        ("block_size", ctypes.c_uint32),
        ("num_kv_heads", ctypes.c_uint32),
        ("head_dim", ctypes.c_uint32),
        ("k", kvx_tensor_desc_t),
        ("v", kvx_tensor_desc_t),
        ("pool", kvx_pool_desc_t),
    ]


class kvx_block_table_t(_Sized):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("format", c_enum),
        ("index_dtype", c_enum),
        ("indptr_dtype", c_enum),
        ("seq_count", ctypes.c_uint32),
        ("beam_width", ctypes.c_uint32),
        ("max_blocks_per_seq", ctypes.c_uint32),
        ("indices", ctypes.c_void_p),
        ("indptr", ctypes.c_void_p),
        ("indices_count", ctypes.c_uint32),
        ("indptr_count", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
    ]


class kvx_slot_mapping_t(_Sized):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("dtype", c_enum),
        ("token_count", ctypes.c_uint32),
        ("invalid_slot", ctypes.c_int64),
        ("slots", ctypes.c_void_p),
    ]


class kvx_seq_lens_t(_Sized):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("dtype", c_enum),
        ("seq_count", ctypes.c_uint32),
        ("lengths", ctypes.c_void_p),
    ]


class kvx_kv_io_desc_t(_Sized):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("key", kvx_tensor_desc_t),
        ("value", kvx_tensor_desc_t),
        ("num_tokens", ctypes.c_uint32),
        ("num_kv_heads", ctypes.c_uint32),
        ("head_dim", ctypes.c_uint32),
    ]


class kvx_scale_desc_t(_Sized):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("dtype", c_enum),
        ("granularity", c_enum),
        ("ndim", ctypes.c_uint32),
        ("shape", _I64x5),
        ("stride", _I64x5),
        ("data", ctypes.c_void_p),
    ]


class kvx_write_desc_t(_Sized):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("io", kvx_kv_io_desc_t),
        ("slots", kvx_slot_mapping_t),
        ("k_scale", ctypes.c_void_p),
        ("v_scale", ctypes.c_void_p),
        ("k_scale_desc", kvx_scale_desc_t),
        ("v_scale_desc", kvx_scale_desc_t),
    ]


class kvx_gather_desc_t(_Sized):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("io", kvx_kv_io_desc_t),
        ("block_table", kvx_block_table_t),
        ("seq_lens", kvx_seq_lens_t),
        ("max_seq_len", ctypes.c_uint32),
    ]


# ---------------------------------------------------------------------------- KVX 1.2


class kvx_fp4_cache_ext_t(_Sized):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("format", c_enum),
        ("k_scales", kvx_tensor_desc_t),
        ("v_scales", kvx_tensor_desc_t),
        ("k_global", kvx_scale_desc_t),
        ("v_global", kvx_scale_desc_t),
    ]


class kvx_fp4_io_scales_t(_Sized):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("key_scales", kvx_tensor_desc_t),
        ("value_scales", kvx_tensor_desc_t),
    ]


class kvx_cache_desc_v1_2_t(kvx_cache_desc_t):
    _fields_ = [("fp4", kvx_fp4_cache_ext_t)]


class kvx_write_desc_v1_2_t(kvx_write_desc_t):
    _fields_ = [("fp4", kvx_fp4_io_scales_t)]


class kvx_gather_desc_v1_2_t(kvx_gather_desc_t):
    _fields_ = [("fp4", kvx_fp4_io_scales_t)]


def all_fields(cls: type[ctypes.Structure]) -> list[tuple]:
    """Every field of a ctypes struct in memory order, base classes' first."""
    out: list[tuple] = []
    for klass in reversed(cls.__mro__):
        out.extend(klass.__dict__.get("_fields_", []))
    return out


#: Every public struct, by its C typedef name.
STRUCTS: dict[str, type[ctypes.Structure]] = {
    cls.__name__: cls
    for cls in (
        kvx_version_t,
        kvx_tensor_desc_t,
        kvx_pool_desc_t,
        kvx_cache_desc_t,
        kvx_block_table_t,
        kvx_slot_mapping_t,
        kvx_seq_lens_t,
        kvx_kv_io_desc_t,
        kvx_scale_desc_t,
        kvx_write_desc_t,
        kvx_gather_desc_t,
    )
}

#: The KVX 1.2 layout of every struct (the header's default build), by C typedef name.
STRUCTS_V1_2: dict[str, type[ctypes.Structure]] = {
    **STRUCTS,
    "kvx_cache_desc_t": kvx_cache_desc_v1_2_t,
    "kvx_write_desc_t": kvx_write_desc_v1_2_t,
    "kvx_gather_desc_t": kvx_gather_desc_v1_2_t,
    "kvx_fp4_cache_ext_t": kvx_fp4_cache_ext_t,
    "kvx_fp4_io_scales_t": kvx_fp4_io_scales_t,
}

#: Every enum, by its C typedef name, with the prefix of its enumerators.
ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {
    "kvx_status_t": (Status, "KVX_STATUS_"),
    "kvx_dtype_t": (DType, "KVX_DTYPE_"),
    "kvx_memory_type_t": (Memory, "KVX_MEMORY_"),
    "kvx_layout_t": (Layout, "KVX_LAYOUT_"),
    "kvx_block_table_format_t": (TableFormat, "KVX_BLOCK_TABLE_"),
    "kvx_block_table_flags_t": (TableFlags, "KVX_BLOCK_TABLE_FLAG_"),
    "kvx_scale_granularity_t": (ScaleGranularity, "KVX_SCALE_"),
    "kvx_fp4_format_t": (Fp4Format, "KVX_FP4_"),
}

#: Element size in bytes of each dtype that has one.
DTYPE_SIZE = {
    DType.F16: 2,
    DType.BF16: 2,
    DType.F32: 4,
    DType.F8_E4M3: 1,
    DType.F8_E5M2: 1,
    DType.S32: 4,
    DType.S64: 8,
    DType.U32: 4,
    DType.U64: 8,
    DType.U8: 1,
}

CACHE_DTYPES = (DType.F16, DType.BF16, DType.F32, DType.F8_E4M3, DType.F8_E5M2)
BASELINE_DTYPES = (DType.F16, DType.BF16, DType.F32)
FP8_DTYPES = (DType.F8_E4M3, DType.F8_E5M2)
INDEX_DTYPES = (DType.S32, DType.S64)

#: The v1.1 sizeof of every struct; a provider must refuse anything smaller.
V1_1_SIZES = {name: ctypes.sizeof(cls) for name, cls in STRUCTS.items()}

#: The KVX 1.2 sizeof of every struct (top-level ones are larger than in v1.1).
V1_2_SIZES = {name: ctypes.sizeof(cls) for name, cls in STRUCTS_V1_2.items()}
