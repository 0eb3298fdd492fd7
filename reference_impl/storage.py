"""Flat storage buffers of a case, viewed in the dtype the C descriptor names."""
from __future__ import annotations

import numpy as np

from kvx_conformance.abi.dtypes import np_dtype
from kvx_conformance.abi.header import DType

from .cview import CaseError


def typed_view(array: np.ndarray, dtype: int, what: str) -> np.ndarray:
    """``array``'s bytes as a flat array of ``dtype`` (shares memory with ``array``)."""
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    item = np_dtype(DType(dtype))
    if raw.size % item.itemsize:
        raise CaseError(f"{what}: {raw.size} bytes do not hold whole {item} elements")
    return raw.view(item)


def check_bounds(offsets: np.ndarray, size: int, what: str) -> None:
    if offsets.size and (offsets.min() < 0 or offsets.max() >= size):
        raise CaseError(
            f"{what}: element offsets [{int(offsets.min())}, {int(offsets.max())}] fall outside the "
            f"case's buffer of {size} elements"
        )
