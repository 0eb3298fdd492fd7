"""Metadata values as the provider reads them: the case's buffers reinterpreted per the C fields.

The executor stores slots, indices, indptr and lengths encoded in the case's dtypes;
the provider reads ``count`` entries of the dtype its descriptor names. These helpers
do the same (S32 values sign-extended to int64), so an override of a dtype or count
field is read exactly as a provider would read it.
"""
from __future__ import annotations

import numpy as np

from kvx_conformance.abi.dtypes import np_dtype
from kvx_conformance.abi.header import DType
from kvx_conformance.cases.case import GatherCase, WriteCase

from .cview import CaseError


def _read(buffer: np.ndarray | None, dtype: int, count: int, what: str) -> np.ndarray:
    """``count`` entries of ``dtype`` (S32/S64) from ``buffer``'s bytes, as int64."""
    if count == 0:
        return np.zeros(0, np.int64)
    if buffer is None:
        raise CaseError(f"{what}: the provider would read {count} entries from an absent buffer")
    raw = np.ascontiguousarray(buffer).view(np.uint8).reshape(-1)
    item = np_dtype(DType(dtype))
    need = count * item.itemsize
    if need > raw.size:
        raise CaseError(f"{what}: the descriptor says {count} x {item} but the case holds {raw.size} bytes")
    return raw[:need].view(item).astype(np.int64)


def slots(case: WriteCase, dtype: int, count: int) -> np.ndarray:
    return _read(case.slots.encoded(), dtype, count, "slots")


def indices(case: GatherCase, dtype: int, count: int) -> np.ndarray:
    t = case.table
    return _read(t.encoded_indices() if len(t.indices) else None, dtype, count, "block_table.indices")


def indptr(case: GatherCase, dtype: int, count: int) -> np.ndarray:
    return _read(case.table.encoded_indptr(), dtype, count, "block_table.indptr")


def lengths(case: GatherCase, dtype: int, count: int) -> np.ndarray:
    s = case.seq_lens
    return _read(s.encoded() if len(s.lengths) else None, dtype, count, "seq_lens.lengths")


def scale_values(values, count: int, what: str, stride: int = 1) -> np.ndarray:
    """F32 scale values as the provider reads them from the buffer the executor stored
    (``np.float32`` of the case's values): value ``i`` at element ``i * stride`` (R-FP8: a
    PER_HEAD descriptor's ``stride[0]``; 0 reads as 1)."""
    v = np.asarray(values, np.float32).reshape(-1)
    stride = stride or 1
    if stride < 0:
        raise CaseError(f"{what}: stride {stride}: the oracle reads scale values at strides >= 0 only")
    if count and (count - 1) * stride >= v.size:
        raise CaseError(f"{what}: the provider would read {count} scale values {stride} apart but the case "
                        f"holds {v.size} elements")
    return v[:(count - 1) * stride + 1:stride] if count else v[:0]
