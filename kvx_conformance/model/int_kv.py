"""INT8 / INT4 KV caches: the harness's integer quantization around a provider's BF16 cache.

KVX has no integer cache dtype, yet FP4 caches exist to replace integer KV quantization
at the same memory (seed 002: TurboMind ``quant_policy`` 8 and 4; seed 001: ppl.nn's
int8/int4). :class:`IntKVStore` gives the model such a cache on top of any store:

* write: every new K/V vector (one token, one KV head, ``head_dim`` values) is quantized
  asymmetrically as in TurboMind (``int_token_encode`` of ``reference_impl/quant.py``:
  ``zero = BF16(min)``, ``scale = BF16((max - min) / (2**bits - 1))``, codes
  ``clip(RNE((x - zero) / scale), 0, 2**bits - 1)``); the codes go into the inner store
  (the provider's BF16 cache holds integers up to 256 exactly), the (scale, zero) pairs
  stay with the harness, indexed by sequence and position;
* read: the inner store's codes times the scale plus the zero point.

The storage counted for these formats (:func:`~.kv_store.bits_per_value`) is what an engine
holding the packed codes and the BF16 pairs stores: 8 or 4 bits per value plus 32 bits per
vector of ``head_dim`` values.

Numpy arrays go through the reference codec; torch tensors (the torch decoder's) through
:func:`encode_torch` / :func:`decode_torch`, the same operations in the same order
(bit-identical; ``tests/test_model_torch.py`` checks it).
"""
from __future__ import annotations

import numpy as np

from ..reference_impl import quant
from .kv_store import concat, is_tensor

PATH = "harness-int"


def encode_numpy(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(codes float32 [..., D], scale float32 [...], zero float32 [...])`` of ``x [..., D]``."""
    q, scale, zero = quant.int_token_encode(x, bits)
    return q.astype(np.float32), scale.astype(np.float32), zero.astype(np.float32)


def decode_numpy(q: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    return q.astype(np.float32) * scale[..., None] + zero[..., None]


def encode_torch(x, bits: int):
    """:func:`encode_numpy` on a float32 tensor (any device), operation for operation."""
    import torch

    levels = (1 << bits) - 1
    lo, hi = x.amin(dim=-1), x.amax(dim=-1)
    zero = lo.to(torch.bfloat16).to(torch.float32)
    scale = ((hi - lo) / torch.tensor(levels, dtype=torch.float32, device=x.device)).to(torch.bfloat16).to(torch.float32)
    s = scale[..., None]
    t = (x - zero[..., None]) / s
    t = torch.where(s > 0, t, torch.zeros((), dtype=torch.float32, device=x.device))
    q = torch.clamp(torch.round(t), 0, levels)  # round: half to even, as np.rint
    return q, scale, zero


def decode_torch(q, scale, zero):
    return q * scale[..., None] + zero[..., None]


class IntKVStore:
    """A :class:`~.kv_store.KVStore` holding ``bits``-bit codes in ``inner`` (a BF16 store)."""

    def __init__(self, inner, bits: int):
        if bits not in (4, 8):
            raise ValueError(f"integer KV quantization takes 4 or 8 bits, got {bits}")
        self.inner, self.bits = inner, bits
        self.path = PATH
        self.fp4_refusal = None
        #: per sequence, per layer: chunks of (k scale, k zero, v scale, v zero), in position order
        self._params: dict[int, list[list[tuple]]] = {}
        self._step: tuple[list[int], list[int]] | None = None
        self._n_layers: int | None = None

    def begin_step(self, seq_ids: list[int], counts: list[int]) -> list[int]:
        starts = self.inner.begin_step(seq_ids, counts)
        self._step = (list(seq_ids), list(counts))
        return starts

    def write(self, layer: int, k, v) -> None:
        torch_mode = is_tensor(k)
        enc = encode_torch if torch_mode else encode_numpy
        qk, sk, zk = enc(k, self.bits)
        qv, sv, zv = enc(v, self.bits)
        at = 0
        for s, c in zip(*self._step):
            per_layer = self._params.setdefault(s, {})
            per_layer.setdefault(layer, []).append(
                (sk[at:at + c], zk[at:at + c], sv[at:at + c], zv[at:at + c]))
            at += c
        self.inner.write(layer, qk, qv)

    def read(self, layer: int) -> list[tuple]:
        ctx = self.inner.read(layer)
        out = []
        for s, (kc, vc) in zip(self._step[0], ctx):
            chunks = self._params[s][layer]
            sk, zk, sv, zv = (concat([c[i] for c in chunks]) for i in range(4))
            dec = decode_torch if is_tensor(kc) else decode_numpy
            out.append((dec(kc, sk, zk), dec(vc, sv, zv)))
        return out

    def end_step(self) -> None:
        self.inner.end_step()
        self._step = None

    def free(self, seq_id: int) -> None:
        self.inner.free(seq_id)
        self._params.pop(seq_id, None)

    def check_guards(self) -> None:
        if hasattr(self.inner, "check_guards"):
            self.inner.check_guards()
