"""Element offsets (docs/spec-readings.md R-CACHE, R-GATHER; kvx-abi-1.1 KV_OFFSETS).

All functions broadcast their index arguments (numpy integer arrays or ints) and
return int64 element offsets from the tensor's base pointer.
"""
from __future__ import annotations

import numpy as np

from kvx_conformance.abi.header import Layout


def cache_offsets(layout: Layout, stride: tuple[int, ...], pack: int, b, t, h, d) -> np.ndarray:
    """Offset of element (block b, token t, head h, dim d) of a cache tensor.

    - NHD / CUSTOM: ``b*s0 + t*s1 + h*s2 + d*s3``
    - HND:          ``b*s0 + h*s1 + t*s2 + d*s3``
    - HND_PACKED:   ``b*s0 + h*s1 + (d // pack)*s2 + t*s3 + (d % pack)*s4``
    """
    b, t, h, d = (np.asarray(x, dtype=np.int64) for x in (b, t, h, d))
    s = [np.int64(x) for x in stride]
    if layout in (Layout.BLOCK_NHD, Layout.BLOCK_CUSTOM):
        return b * s[0] + t * s[1] + h * s[2] + d * s[3]
    if layout == Layout.BLOCK_HND:
        return b * s[0] + h * s[1] + t * s[2] + d * s[3]
    if layout == Layout.BLOCK_HND_PACKED:
        return b * s[0] + h * s[1] + (d // pack) * s[2] + t * s[3] + (d % pack) * s[4]
    raise ValueError(f"no addressing for layout {layout!r}")


def io_offsets(shape: tuple[int, ...], stride: tuple[int, ...], row, h, d) -> np.ndarray:
    """Offset of (row, head h, dim d) of an IO tensor.

    3-D ``[num_tokens, H, D]``: ``row*s0 + h*s1 + d*s2``. 4-D padded gather output
    ``[seq_count * beam_width, max_seq_len, H, D]``: row ``r`` is
    ``(r // max_seq_len, r % max_seq_len)``.
    """
    row, h, d = (np.asarray(x, dtype=np.int64) for x in (row, h, d))
    s = [np.int64(x) for x in stride]
    if len(shape) == 3:
        return row * s[0] + h * s[1] + d * s[2]
    if len(shape) == 4:
        msl = np.int64(shape[1])
        return (row // msl) * s[0] + (row % msl) * s[1] + h * s[2] + d * s[3]
    raise ValueError(f"IO tensors are 3-D or 4-D, not {len(shape)}-D")


def pool_offsets(block, t, h, d, num_kv_heads: int, block_size: int, head_dim: int) -> np.ndarray:
    """Offset, in cache elements, of (pool block, token t, head h, dim d) from the pool base.

    A KV_OFFSETS block is ``bytes_per_block`` bytes holding HND ``[H, block_size, D]``
    contiguous (kvx-abi-1.1).
    """
    block, t, h, d = (np.asarray(x, dtype=np.int64) for x in (block, t, h, d))
    per_block = np.int64(num_kv_heads * block_size * head_dim)
    return block * per_block + h * np.int64(block_size * head_dim) + t * np.int64(head_dim) + d


def farthest_offset(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Largest |offset| reachable (exact Python int, to detect int64 overflow)."""
    if any(n <= 0 for n in shape):
        return 0
    return sum((n - 1) * abs(s) for n, s in zip(shape, stride))
