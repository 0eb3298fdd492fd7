"""The model's byte-level BPE tokenizer, built with ``tokenizers`` from the GGUF metadata.

The GGUF file stores the vocabulary (``tokenizer.ggml.tokens``), the merge list
(``tokenizer.ggml.merges``, "left right" strings in rank order), token types
(CONTROL tokens such as ``<|endoftext|>`` are special) and the pre-tokenizer name
``smollm``: GPT-2's split with every digit on its own (llama.cpp reads "smollm" as
``\\p{N}`` then the GPT-2 pattern), i.e. ``Digits(individual_digits=True)`` followed
by the byte-level pre-tokenizer. BOS is not prepended (``add_bos_token`` is false).
"""
from __future__ import annotations

import functools

from .weights import _missing, _reader

CONTROL_TOKEN_TYPE = 3  # gguf.TokenType.CONTROL
USER_DEFINED_TOKEN_TYPE = 4


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise _missing("the tokenizers package (byte-level BPE)") from None
    return tokenizers


@functools.lru_cache(maxsize=1)
def load_tokenizer():
    """A ``tokenizers.Tokenizer`` equivalent to the model's own (cached per process)."""
    tk = _tokenizers()
    fields = _reader().fields
    pre = fields["tokenizer.ggml.pre"].contents() if "tokenizer.ggml.pre" in fields else "gpt2"
    if fields["tokenizer.ggml.model"].contents() != "gpt2" or pre not in ("smollm", "gpt2"):
        raise ValueError(f"unsupported tokenizer in the GGUF file: model/pre {pre!r}")
    tokens: list[str] = fields["tokenizer.ggml.tokens"].contents()
    types: list[int] = fields["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"].contents()]
    vocab = {t: i for i, t in enumerate(tokens)}
    model = tk.models.BPE(vocab=vocab, merges=merges, fuse_unk=False)
    tok = tk.Tokenizer(model)
    byte_level = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        tok.pre_tokenizer = tk.pre_tokenizers.Sequence([tk.pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = tk.decoders.ByteLevel()
    special = [t for t, ty in zip(tokens, types) if ty in (CONTROL_TOKEN_TYPE, USER_DEFINED_TOKEN_TYPE)]
    tok.add_special_tokens([tk.AddedToken(t, special=True, normalized=False) for t in special])
    return tok


def encode(text: str) -> list[int]:
    return load_tokenizer().encode(text, add_special_tokens=False).ids


def decode(ids) -> str:
    return load_tokenizer().decode([int(i) for i in ids], skip_special_tokens=False)
