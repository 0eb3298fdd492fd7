"""What a KV cache holds for the decoder: cache formats, scale calibration, the store interface.

A :class:`CacheFormat` says what a cache entry becomes after a write and a read:
- F32 / F16 / BF16: the value rounded to the cache dtype (RNE, readings R-CONVERT);
- FP8 E4M3: ``x / scale`` clamped to +-448 and rounded (readings R-FP8), read back
  as ``code * scale``; one static F32 scale per tensor (per layer, K and V apart);
- NVFP4 / MXFP4: the FP4 codec round trip of ``kvx_conformance.reference_impl.fp4``
  (16-value blocks along ``head_dim``). A provider with the KVX 1.2 FP4 extension holds
  the codes in its own FP4 cache (path "provider-fp4"); otherwise the round trip is
  applied before an F32 write (path "oracle-fp4"). Both give the same values when the
  provider's codec is exact (the contiguous store below models both);
- INT8 / INT4: integer quantization applied by the harness around the provider's BF16
  cache (:mod:`.int_kv`): asymmetric per token and KV head (seed 002's TurboMind
  ``quant_policy`` 8 / 4, BF16 scale and zero point), the codes written into the BF16
  cache (exact: integers up to 256), the scales kept by the harness.

:func:`bits_per_value` and :func:`kv_bytes_per_token` give what each format stores, scales
counted: per-token and per-block scales are shared by their values, a per-tensor (per layer
and side) scale is amortized to zero. For INT8 / INT4 that is what an engine holding the
packed codes stores, not the BF16 container of the emulation.

Static scales are calibrated on the first write into each layer, as engines that
compute KV scales on their first forward pass do: FP8 ``amax / 448``, NVFP4's
global scale ``amax / (6 * 448)``. Both stores below share this calibration, so a
paged cache and a contiguous one holding the same format hold the same values.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import ml_dtypes
import numpy as np

from ..abi.dtypes import np_dtype
from ..abi.header import DType

FP8_E4M3_MAX = 448.0


@dataclass(frozen=True)
class CacheFormat:
    name: str
    dtype: DType  # dtype of the cache tensors handed to the provider
    fp4: str | None = None  # "nvfp4" | "mxfp4": an FP4 cache (the provider's, or the oracle codec + F32)
    int_bits: int | None = None  # 8 | 4: harness integer quantization, codes in the provider's ``dtype`` cache

    @property
    def gather_dtype(self) -> DType:
        """IO dtype of a gather: FP8 copies raw codes (v1.1), the others convert to F32."""
        return self.dtype if self.dtype in (DType.F8_E4M3, DType.F8_E5M2) else DType.F32


FORMATS: dict[str, CacheFormat] = {
    "F32": CacheFormat("F32", DType.F32),
    "F16": CacheFormat("F16", DType.F16),
    "BF16": CacheFormat("BF16", DType.BF16),
    "FP8-E4M3": CacheFormat("FP8-E4M3", DType.F8_E4M3),
    "NVFP4": CacheFormat("NVFP4", DType.F32, fp4="nvfp4"),
    "MXFP4": CacheFormat("MXFP4", DType.F32, fp4="mxfp4"),
    "INT8": CacheFormat("INT8", DType.BF16, int_bits=8),
    "INT4": CacheFormat("INT4", DType.BF16, int_bits=4),
}

#: bits of a per-token (scale, zero) pair of the INT formats: two BF16 numbers
INT_PARAM_BITS = 32
FP4_BLOCK_VALUES = 16  # values per FP4 block scale (one byte)
_DTYPE_BITS = {DType.F32: 32, DType.F16: 16, DType.BF16: 16, DType.F8_E4M3: 8, DType.F8_E5M2: 8}


def bits_per_value(fmt: CacheFormat, head_dim: int) -> float:
    """Stored bits per K or V value, scales included (per-tensor scales amortized to zero)."""
    if fmt.int_bits is not None:
        return fmt.int_bits + INT_PARAM_BITS / head_dim
    if fmt.fp4 is not None:
        return 4 + 8 / FP4_BLOCK_VALUES
    return float(_DTYPE_BITS[fmt.dtype])


def kv_bytes_per_token(fmt: CacheFormat, n_layers: int, n_kv_heads: int, head_dim: int) -> float:
    """KV-cache bytes one token takes over the whole model: K and V of every layer and KV head."""
    return n_layers * 2 * n_kv_heads * head_dim * bits_per_value(fmt, head_dim) / 8


def is_tensor(x) -> bool:
    """Whether ``x`` is a torch tensor (without importing torch)."""
    return type(x).__module__.startswith("torch")


def to_numpy(x) -> np.ndarray:
    """A numpy copy of a torch tensor (any device), or the array itself."""
    return x.detach().cpu().numpy() if is_tensor(x) else x


def like(a: np.ndarray, ref):
    """``a`` as a tensor on ``ref``'s device when ``ref`` is a torch tensor, else ``a``."""
    if not is_tensor(ref):
        return a
    import torch

    return torch.from_numpy(np.ascontiguousarray(a)).to(ref.device)


def _amax(x: np.ndarray) -> float:
    return float(np.max(np.abs(x))) if x.size else 0.0


@dataclass
class LayerScales:
    """Static per-tensor scales of one cache format, calibrated on each layer's first write."""

    fmt: CacheFormat
    k: dict[int, np.float32] = field(default_factory=dict)
    v: dict[int, np.float32] = field(default_factory=dict)

    def _calibrate(self, x: np.ndarray) -> np.float32:
        amax = _amax(x)
        if self.fmt.dtype == DType.F8_E4M3:
            return np.float32(amax / FP8_E4M3_MAX) if amax > 0 else np.float32(1.0)
        if self.fmt.fp4 == "nvfp4":
            from ..reference_impl import fp4  # noqa: PLC0415

            return np.float32(fp4.nvfp4_global_scale(x))
        return np.float32(1.0)

    def for_layer(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.float32, np.float32]:
        if layer not in self.k:
            self.k[layer], self.v[layer] = self._calibrate(k), self._calibrate(v)
        return self.k[layer], self.v[layer]


def fp4_round_trip(kind: str, x: np.ndarray, global_scale: np.float32) -> np.ndarray:
    """Encode then decode ``x [n, H, D]`` with the reference FP4 codec (16-value blocks along D).

    NVFP4 uses the per-tensor global scale ``global_scale``; MXFP4 is the KV variant
    of seed 002 (16-value blocks, ``ceil`` exponent rule). Output float32.
    """
    from ..reference_impl import fp4  # noqa: PLC0415 (imported only when an FP4 format is used)

    x32 = np.ascontiguousarray(x, dtype=np.float32)
    if kind == "nvfp4":
        codes, scales = fp4.nvfp4_encode(x32, global_scale=float(global_scale))
        out = fp4.nvfp4_decode(codes, scales, global_scale=float(global_scale))
    elif kind == "mxfp4":
        codes, scales = fp4.mxfp4_encode(x32)
        out = fp4.mxfp4_decode(codes, scales)
    else:
        raise ValueError(f"unknown FP4 codec {kind!r}")
    return np.ascontiguousarray(out, dtype=np.float32).reshape(x.shape)


def prepare_for_write(fmt: CacheFormat, x: np.ndarray, scale: np.float32) -> np.ndarray:
    """The IO tensor handed to the provider's write: FP4 formats are round-tripped first."""
    if fmt.fp4 is None:
        return x
    return fp4_round_trip(fmt.fp4, x, scale)


def cache_round_trip(fmt: CacheFormat, x: np.ndarray, scale: np.float32) -> np.ndarray:
    """What a cache of ``fmt`` gives back for ``x`` (float32): the contiguous model of a write + read."""
    if fmt.int_bits is not None:
        raise ValueError(f"{fmt.name} is applied around a BF16 cache by the harness (int_kv.IntKVStore)")
    x = prepare_for_write(fmt, np.asarray(x, dtype=np.float32), scale)
    if fmt.dtype == DType.F32:
        return np.array(x, dtype=np.float32)
    if fmt.dtype in (DType.F16, DType.BF16):
        return x.astype(np_dtype(fmt.dtype)).astype(np.float32)
    if fmt.dtype == DType.F8_E4M3:
        q = np.clip(x / scale, -FP8_E4M3_MAX, FP8_E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
        return dequantize_fp8(q, scale)
    raise ValueError(f"no round trip for cache dtype {fmt.dtype!r}")


def dequantize_fp8(codes: np.ndarray, scale: np.float32) -> np.ndarray:
    return codes.astype(np.float32) * np.float32(scale)


class KVStore(Protocol):
    """The decoder's view of a KV cache (one step = the new tokens of some sequences)."""

    def begin_step(self, seq_ids: list[int], counts: list[int]) -> list[int]:
        """Reserve room for ``counts[i]`` new tokens of ``seq_ids[i]``; returns their first positions."""

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store this layer's K/V ``[sum(counts), H, D]`` (float32, batch order) for the step."""

    def read(self, layer: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per step sequence, the whole context K/V ``[length, H, D]`` float32 (new tokens included)."""

    def end_step(self) -> None: ...

    def free(self, seq_id: int) -> None: ...


class ContiguousKVStore:
    """A plain per-sequence, per-layer cache: the comparison baseline.

    Takes and gives numpy arrays, or torch tensors (the torch decoder's): the rounding is
    the numpy model's either way (a tensor goes through the host), so a paged cache and
    this one hold the same values whichever decoder runs.
    """

    def __init__(self, n_layers: int, fmt: CacheFormat):
        self.fmt = fmt
        self.n_layers = n_layers
        self.scales = LayerScales(fmt)
        self._k: dict[int, list[list[np.ndarray]]] = {}
        self._v: dict[int, list[list[np.ndarray]]] = {}
        self._len: dict[int, int] = {}
        self._step: tuple[list[int], list[int]] | None = None

    def length(self, seq_id: int) -> int:
        return self._len.get(seq_id, 0)

    def begin_step(self, seq_ids: list[int], counts: list[int]) -> list[int]:
        for s in seq_ids:
            if s not in self._len:
                self._len[s] = 0
                self._k[s] = [[] for _ in range(self.n_layers)]
                self._v[s] = [[] for _ in range(self.n_layers)]
        self._step = (list(seq_ids), list(counts))
        return [self._len[s] for s in seq_ids]

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        seq_ids, counts = self._step
        ref, k, v = k, to_numpy(k), to_numpy(v)
        ks, vs = self.scales.for_layer(layer, k, v)
        kq, vq = like(cache_round_trip(self.fmt, k, ks), ref), like(cache_round_trip(self.fmt, v, vs), ref)
        at = 0
        for s, c in zip(seq_ids, counts):
            self._k[s][layer].append(kq[at:at + c])
            self._v[s][layer].append(vq[at:at + c])
            at += c

    def read(self, layer: int) -> list[tuple[np.ndarray, np.ndarray]]:
        seq_ids, _ = self._step
        return [(concat(self._k[s][layer]), concat(self._v[s][layer])) for s in seq_ids]

    def end_step(self) -> None:
        for s, c in zip(*self._step):
            self._len[s] += c
        self._step = None

    def free(self, seq_id: int) -> None:
        for d in (self._k, self._v, self._len):
            d.pop(seq_id, None)


def concat(parts: list):
    if parts and is_tensor(parts[0]):
        import torch

        return torch.cat(parts)
    return np.concatenate(parts)
