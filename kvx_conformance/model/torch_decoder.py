"""The decoder of :mod:`.decoder` in torch: the same Llama, float32 math, on a GPU (or the CPU).

``kvx-conform model-eval --memory device`` runs the model here: the weights (the same
dequantized float32 tensors, :func:`~.weights.load_weights`) go to the GPU once, the K/V
of every layer go to the store as tensors (the paged store copies them into its device
buffers and gathers the context back, GPU to GPU) and the logits stay on the GPU for
scoring. Every operation mirrors the numpy decoder's: RMSNorm with the variance in
float32, rotary tables computed in float64 and rounded to float32, causal grouped-query
attention per sequence, SwiGLU. Matrix products run in full float32 (TF32 off:
``torch.backends.cuda.matmul.allow_tf32 = False``). Both decoders sum in other orders,
so the logits differ by float32 rounding only: ``tests/test_model_torch.py`` holds them
together (tolerance there).
"""
from __future__ import annotations

import math

import numpy as np

from .decoder import StepOutput, apply_rope, rope_tables
from .weights import ModelWeights


def _torch():
    import torch

    return torch


def full_float32() -> None:
    """Float32 products without TF32 (the torch default for matmul; cuDNN's default is TF32)."""
    torch = _torch()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


class TorchDecoder:
    """:class:`~.decoder.Decoder`'s ``step`` with torch tensors on ``device``.

    ``step`` returns, per sequence, float32 logits tensors on ``device``; the store gets
    and gives tensors (``PagedKVStore(..., tensors="torch")`` or a ``ContiguousKVStore``).
    """

    def __init__(self, weights: ModelWeights, device: str = "cuda"):
        torch = _torch()
        full_float32()
        self.w, self.cfg = weights, weights.config
        self.device = torch.device(device)

        def t(a: np.ndarray):
            return torch.from_numpy(np.array(a, dtype=np.float32)).to(self.device)  # a writable copy

        self.embed = t(weights.embed)
        self.lm_head = self.embed if weights.lm_head is weights.embed else t(weights.lm_head)
        self.out_norm = t(weights.out_norm)
        self.layers = [
            {name: t(getattr(lw, name)) for name in
             ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down")}
            for lw in weights.layers
        ]
        self.scale = torch.tensor(np.float32(1.0 / np.sqrt(self.cfg.head_dim)), device=self.device)
        self.eps = torch.tensor(np.float32(self.cfg.rms_eps), device=self.device)

    def rms_norm(self, x, weight):
        var = (x * x).mean(dim=-1, keepdim=True)
        return (x / (var + self.eps).sqrt()) * weight

    @staticmethod
    def silu(x):
        return x / (1.0 + (-x).exp())

    def apply_rope(self, x, cos, sin):
        return apply_rope(x, cos, sin, self.w.neox_rotary)

    def attention(self, q, k, v, first_pos: int):
        """Causal GQA for one sequence (as :func:`~.decoder.attention`): ``q [n, Hq, D]``,
        ``k, v [L, Hkv, D]``; returns ``[n, Hq * D]``."""
        torch = _torch()
        n, hq, d = q.shape
        L, hkv, _ = k.shape
        group = hq // hkv
        qg = q.reshape(n, hkv, group, d).permute(1, 2, 0, 3)  # [Hkv, g, n, D]
        kt = k.permute(1, 2, 0)  # [Hkv, D, L]
        scores = torch.matmul(qg, kt[:, None]) * self.scale  # [Hkv, g, n, L]
        qpos = first_pos + torch.arange(n, device=self.device)[:, None]
        allowed = torch.arange(L, device=self.device)[None, :] <= qpos
        scores = scores.masked_fill(~allowed, -math.inf)
        p = torch.softmax(scores, dim=-1)
        out = torch.matmul(p, v.permute(1, 0, 2)[:, None])  # [Hkv, g, n, D]
        return out.permute(2, 0, 1, 3).reshape(n, hq * d)

    def step(self, store, seq_ids: list[int], tokens: list, all_logits: bool = False) -> StepOutput:
        """As :meth:`~.decoder.Decoder.step`; the logits are float32 tensors on the device."""
        torch = _torch()
        cfg = self.cfg
        counts = [len(t) for t in tokens]
        starts = store.begin_step(seq_ids, counts)
        ids = np.concatenate([np.asarray(t, dtype=np.int64) for t in tokens])
        positions = np.concatenate([s + np.arange(c) for s, c in zip(starts, counts)])
        cos_np, sin_np = rope_tables(cfg, positions)
        cos, sin = torch.from_numpy(cos_np).to(self.device), torch.from_numpy(sin_np).to(self.device)
        bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
        x = self.embed[torch.from_numpy(ids).to(self.device)]
        for li, lw in enumerate(self.layers):
            h = self.rms_norm(x, lw["attn_norm"])
            q = (h @ lw["wq"].T).reshape(-1, cfg.n_heads, cfg.head_dim)
            k = (h @ lw["wk"].T).reshape(-1, cfg.n_kv_heads, cfg.head_dim)
            v = (h @ lw["wv"].T).reshape(-1, cfg.n_kv_heads, cfg.head_dim).contiguous()
            q = self.apply_rope(q, cos, sin)
            k = self.apply_rope(k, cos, sin)
            store.write(li, k, v)
            context = store.read(li)
            attn = torch.empty((len(ids), cfg.n_heads * cfg.head_dim), dtype=torch.float32, device=self.device)
            for i, (kc, vc) in enumerate(context):
                a, b = bounds[i], bounds[i + 1]
                attn[a:b] = self.attention(q[a:b], kc, vc, starts[i])
            x = x + attn @ lw["wo"].T
            h = self.rms_norm(x, lw["ffn_norm"])
            x = x + (self.silu(h @ lw["w_gate"].T) * (h @ lw["w_up"].T)) @ lw["w_down"].T
        store.end_step()
        if all_logits:
            rows = [x[bounds[i]:bounds[i + 1]] for i in range(len(counts))]
        else:
            rows = [x[bounds[i + 1] - 1: bounds[i + 1]] for i in range(len(counts))]
        return StepOutput([self.rms_norm(r, self.out_norm) @ self.lm_head.T for r in rows])
