"""The torch decoder (kvx_conformance/model/torch_decoder.py) against the numpy decoder.

Runs where torch is importable (on the CPU here; the device script runs it on a GPU too,
tools/model_eval_gpu.sh) and skips cleanly elsewhere. Tolerance: with an F32 cache (no
cache rounding, so nothing amplifies the products' rounding) the logits of both decoders
agree within TOL_ABS + TOL_REL * |logit| (float32 summation order only; 6e-5 seen on CPU)
and every argmax is the same. Repro: python -m pytest tests/test_model_torch.py
"""
from __future__ import annotations

import numpy as np
import pytest

from kvx_conformance.abi import native
from kvx_conformance.model import model_unavailable
from kvx_conformance.model.threads import blas_threads

torch = pytest.importorskip("torch", reason="the torch decoder needs torch (optional extra; CI has none)")

from kvx_conformance.model.decoder import Decoder  # noqa: E402
from kvx_conformance.model.int_kv import decode_numpy, decode_torch, encode_numpy, encode_torch  # noqa: E402
from kvx_conformance.model.kv_store import FORMATS, ContiguousKVStore  # noqa: E402
from kvx_conformance.model.torch_decoder import TorchDecoder  # noqa: E402

_why = model_unavailable()
needs_model = pytest.mark.skipif(_why is not None, reason=_why or "")
REPRO = "repro: python -m pytest tests/test_model_torch.py -k {}"
TOL_ABS, TOL_REL = 1e-3, 1e-4
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with blas_threads(1):
        yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model():
    from kvx_conformance.model.weights import load_weights

    return load_weights()


def _logits_both(w, prompts, fmt="F32"):
    seqs = list(range(len(prompts)))
    a = Decoder(w).step(ContiguousKVStore(w.config.n_layers, FORMATS[fmt]), seqs, prompts, all_logits=True).logits
    td = TorchDecoder(w, DEVICE)
    b = td.step(ContiguousKVStore(w.config.n_layers, FORMATS[fmt]), seqs, prompts, all_logits=True).logits
    return a, [x.cpu().numpy() for x in b]


@needs_model
def test_torch_logits_match_numpy(model):
    """Two sequences of a short text (64 and 40 tokens, prefilled together) through both decoders."""
    from kvx_conformance.model.text import eval_text
    from kvx_conformance.model.tokenizer import encode

    ids = np.asarray(encode(eval_text()), dtype=np.int64)
    prompts = [ids[:64], ids[100:140]]
    want, got = _logits_both(model, prompts)
    for s, (a, b) in enumerate(zip(want, got)):
        err = np.abs(a - b) - (TOL_ABS + TOL_REL * np.abs(a))
        worst = np.unravel_index(np.argmax(err), err.shape)
        assert err.max() <= 0, (
            f"sequence {s}: torch logit {b[worst]} vs numpy {a[worst]} at position/token {worst} (tolerance "
            f"{TOL_ABS} + {TOL_REL}*|logit|, {DEVICE}); {REPRO.format('match_numpy')}")
        assert (a.argmax(-1) == b.argmax(-1)).all(), f"sequence {s}: argmax differs; {REPRO.format('match_numpy')}"


def test_torch_logits_match_numpy_synthetic():
    """The same on random weights (no model package): 2 layers, 3 sequences of different lengths."""
    from kvx_conformance.model.weights import synthetic_weights

    w = synthetic_weights(seed=5, n_layers=2, vocab_size=512)
    rng = np.random.default_rng(11)
    want, got = _logits_both(w, [rng.integers(0, 512, size=n) for n in (23, 9, 2)])
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, atol=TOL_ABS, rtol=TOL_REL, err_msg=REPRO.format("synthetic"))


@pytest.mark.parametrize("bits", [8, 4])
def test_int_codec_torch_equals_numpy(bits):
    """The harness's INT8 / INT4 codec gives the same codes, scales and values in torch as in numpy."""
    rng = np.random.default_rng(bits)
    x = (rng.standard_normal((37, 3, 64)) * rng.uniform(0.01, 30, size=(37, 3, 1))).astype(np.float32)
    x[5, 1] = 0.25  # a constant vector: scale 0
    q, s, z = encode_numpy(x, bits)
    qt, st, zt = encode_torch(torch.from_numpy(x).to(DEVICE), bits)
    for name, a, b in (("codes", q, qt), ("scale", s, st), ("zero", z, zt)):
        np.testing.assert_array_equal(b.cpu().numpy(), a, err_msg=f"{name}, {bits} bits; {REPRO.format('int_codec')}")
    back, back_t = decode_numpy(q, s, z), decode_torch(qt, st, zt).cpu().numpy()
    np.testing.assert_array_equal(back_t.view(np.uint32), back.view(np.uint32))
    assert q.max() == (1 << bits) - 1 and q.min() == 0 and np.all(back[5, 1] == 0.25)


@pytest.mark.parametrize("fmt", ["BF16", "FP8-E4M3", "MXFP4", "INT4"])
def test_torch_decoder_paged_equals_contiguous(fmt):
    """The torch decoder through the provider's paged cache (tensors in and out, host memory here,
    device memory on a GPU machine) gives the contiguous cache's logits bit for bit."""
    from kvx_conformance.abi.header import Memory
    from kvx_conformance.abi.loader import load_provider
    from kvx_conformance.model.evaluate import contiguous_store, make_store, score_windows
    from kvx_conformance.model.weights import synthetic_weights

    w = synthetic_weights(seed=2, n_layers=2, vocab_size=512)
    rng = np.random.default_rng(4)
    windows = [rng.integers(0, 512, size=n) for n in (40, 40, 17)]
    memory = "device" if DEVICE == "cuda" else "host"
    store = make_store(load_provider(native.reference_provider()), w.config, fmt, [40, 40, 17], memory,
                       tensors="torch")
    res = score_windows(TorchDecoder(w, DEVICE), store, windows, 16, check_store=contiguous_store(w.config, fmt))
    assert res["paged_equals_contiguous"], (f"{fmt}: max |diff| {res['max_abs_logit_diff']} ({Memory[memory.upper()].name} "
                                            f"memory); {REPRO.format('paged_equals_contiguous and ' + fmt)}")
    assert res["scored_per_window"] == [39, 39, 16] and np.isfinite(res["nll"]).all()
    store.check_guards()
