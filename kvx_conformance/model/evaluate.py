"""Accuracy of KV-cache formats with a real model: perplexity, KL and top-1 agreement vs BF16, with intervals.

SmolLM2-135M reads windows of English prose (:func:`~.text.corpus`: texts shipped with
Python and numpy, cut by :func:`~.text.take_windows`), all windows decoded together as
sequences of one batch in prefill chunks: every attention reads K/V back from the
provider's paged cache, so each format's rounding reaches every score. Per cache format
one row: perplexity, its delta against the BF16 cache with a paired-bootstrap 95%
interval (:mod:`.bootstrap`), mean KL divergence from the BF16 distribution and top-1
next-token agreement with the BF16 run (each with its interval), which other formats it
differs from significantly, the bits it stores per value and the KV bytes per token
(:func:`~.kv_store.bits_per_value`), and the path the K/V took: ``provider`` (the
provider's write/gather in that cache dtype), ``provider-fp4`` (the provider's KVX 1.2
FP4 cache), ``oracle-fp4`` (the reference FP4 codec round trip before the provider's F32
write, for a provider without the FP4 extension) or ``harness-int`` (INT8 / INT4: the
harness's per-token integer codes in the provider's BF16 cache, :mod:`.int_kv`).

Decoders: numpy on host memory (:class:`~.decoder.Decoder`), torch with device memory
(:class:`~.torch_decoder.TorchDecoder` on the GPU: the weights, the K/V and the logits
stay there); ``decoder="torch"`` on host memory runs the torch decoder on the CPU.
Defaults scale with it: 32768 tokens in windows of 4096, chunks of 512 on device; 1024
tokens in windows of 256, chunks of 64 on host (:func:`defaults`).

With ``check=True`` every format also runs on a plain contiguous cache of the same
format (:class:`~.kv_store.ContiguousKVStore`), step by step beside the paged one, and
the row records whether the logits are bit-identical (``paged_equals_contiguous``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .bootstrap import BLOCK_TOKENS, RESAMPLES, SEED, block_ids, paired_bootstrap
from .decoder import Decoder, log_softmax
from .int_kv import IntKVStore
from .kv_store import FORMATS, ContiguousKVStore, bits_per_value, is_tensor, kv_bytes_per_token
from .paged_kv import BLOCK_SIZE, PagedKVStore, blocks_needed

EVAL_FORMATS = ("F32", "BF16", "FP8-E4M3", "NVFP4", "MXFP4", "INT8", "INT4")
BASELINE = "BF16"
QUICK_TOKENS = 128


@dataclass(frozen=True)
class Defaults:
    tokens: int
    window: int
    chunk: int


#: per decoder: evaluation tokens, window, prefill chunk
HOST_DEFAULTS = Defaults(tokens=1024, window=256, chunk=64)
DEVICE_DEFAULTS = Defaults(tokens=32768, window=4096, chunk=512)
#: what every row holds (the per-format fields first)
ROW_KEYS = ("format", "path", "bits_per_value", "kv_bytes_per_token", "ppl", "delta_ppl", "delta_ppl_ci95", "kl",
            "kl_ci95", "top1_agreement", "top1_agreement_ci95", "top1_accuracy", "significant_vs", "pairwise",
            "tokens", "scored", "windows", "window", "chunk", "block_size", "memory", "decoder", "seconds",
            "provider", "model", "text", "texts", "bootstrap")


def defaults(decoder: str) -> Defaults:
    return DEVICE_DEFAULTS if decoder == "torch" else HOST_DEFAULTS


def resolve_decoder(decoder: str, memory: str) -> str:
    """``auto``: torch with device memory, numpy otherwise."""
    if decoder == "auto":
        return "torch" if str(memory).lower() == "device" else "numpy"
    if decoder not in ("numpy", "torch"):
        raise ValueError(f"decoder must be auto, numpy or torch, not {decoder!r}")
    return decoder


# ----------------------------------------------------------------------------- the evaluation text


def corpus_windows(n_tokens: int, window: int) -> tuple[list, list[dict]]:
    """The windows (:class:`~.text.Window`) and each text's provenance (name, source, sha256,
    characters, tokens read, windows). Texts are tokenized up to what the windows can need."""
    from .text import corpus, take_windows
    from .tokenizer import encode

    texts = corpus()

    def tokens_of(text: str, n: int | None) -> np.ndarray:
        if n is not None and len(text) > 8 * n:  # about 4.4 characters a token: cut at a paragraph
            cut = text.rfind("\n\n", 0, 8 * n)
            text = text[:cut if cut > 0 else 8 * n]
        return np.asarray(encode(text), dtype=np.int64)

    try:
        ids = {t.name: tokens_of(t.text, n_tokens) for t in texts}
        wins = take_windows(ids, n_tokens, window)
    except ValueError:  # a text's cut was too short: read them whole
        ids = {t.name: tokens_of(t.text, None) for t in texts}
        wins = take_windows(ids, n_tokens, window)
    prov = []
    for t in texts:
        mine = [w for w in wins if w.text == t.name]
        prov.append({"name": t.name, "source": t.source, "sha256": t.sha256, "characters": len(t.text),
                     "tokens_used": int(sum(len(w.ids) for w in mine)), "windows": len(mine)})
    return wins, prov


# ----------------------------------------------------------------------------- one format


def make_store(provider, cfg, name: str, lengths: list[int], memory: str = "host", fp4_path: str = "auto",
               tensors: str = "numpy", seed: int = 0):
    """The paged store of cache format ``name`` for sequences of ``lengths`` (INT8 / INT4: the
    harness's codes around the provider's BF16 cache)."""
    from ..abi.header import Memory

    fmt = FORMATS[name]
    cache_fmt = FORMATS["BF16"] if fmt.int_bits is not None else fmt
    store = PagedKVStore(provider, cfg, cache_fmt, num_blocks=blocks_needed(lengths) + 4, seed=seed,
                         memory=Memory[str(memory).upper()], fp4_path=fp4_path, tensors=tensors)
    return IntKVStore(store, fmt.int_bits) if fmt.int_bits is not None else store


def contiguous_store(cfg, name: str):
    fmt = FORMATS[name]
    if fmt.int_bits is not None:
        return IntKVStore(ContiguousKVStore(cfg.n_layers, FORMATS["BF16"]), fmt.int_bits)
    return ContiguousKVStore(cfg.n_layers, fmt)


def _token_figures(logits, targets: np.ndarray, base):
    """Per scored token: NLL, argmax, and against the baseline ``base`` = (log-probs, argmax)
    the KL(base || this) and agreement; plus this run's log-probs (float64) and argmax."""
    if is_tensor(logits):
        import torch

        lp = torch.log_softmax(logits.to(torch.float64), dim=-1)
        tgt = torch.from_numpy(targets).to(lp.device)
        nll = -lp.gather(1, tgt[:, None])[:, 0]
        top1 = lp.argmax(dim=-1)
        kl = agree = None
        if base is not None:
            blp, btop = base
            kl = (blp.exp() * (blp - lp)).sum(dim=-1).cpu().numpy()
            agree = (top1 == btop).cpu().numpy()
        return nll.cpu().numpy(), top1.cpu().numpy(), kl, agree, (lp, top1)
    lp = log_softmax(logits)
    nll = -lp[np.arange(len(targets)), targets]
    top1 = lp.argmax(axis=-1)
    kl = agree = None
    if base is not None:
        blp, btop = base
        kl = np.sum(np.exp(blp) * (blp - lp), axis=-1)
        agree = top1 == btop
    return nll, top1, kl, agree, (lp, top1)


def _bits_equal(a, b) -> tuple[bool, float]:
    if is_tensor(a):
        import torch

        return bool(torch.equal(a.view(torch.int32), b.view(torch.int32))), float((a - b).abs().max())
    return bool(np.array_equal(a.view(np.uint32), b.view(np.uint32))), float(np.max(np.abs(a - b)))


def score_windows(decoder, store, windows: list[np.ndarray], chunk: int, base: dict | None = None,
                  keep: bool = False, check_store=None) -> dict:
    """Run every window as one sequence of a batch (sequence id = window index), ``chunk``
    tokens of each per step, and score each next token.

    ``base``: the baseline's kept figures (``keep=True`` on the baseline's run), keyed by
    (window, step). Returns per-token arrays in window order (``nll``, ``correct``, and with
    ``base`` ``kl`` and ``agree``), ``kept`` with ``keep``, and with ``check_store`` whether
    every logit equals the contiguous run's bit for bit."""
    lengths = [len(w) for w in windows]
    parts: list[list[tuple]] = [[] for _ in windows]
    kept: dict = {}
    equal, max_diff = True, 0.0
    for step, a in enumerate(range(0, max(lengths), chunk)):
        active = [i for i in range(len(windows)) if a < lengths[i]]
        toks = [windows[i][a:a + chunk] for i in active]
        logits = decoder.step(store, active, toks, all_logits=True).logits
        if check_store is not None:
            plain = decoder.step(check_store, active, toks, all_logits=True).logits
            for g, w in zip(logits, plain):
                same, diff = _bits_equal(g, w)
                equal, max_diff = equal and same, max(max_diff, diff)
        for i, lg in zip(active, logits):
            n = min(len(windows[i][a:a + chunk]), lengths[i] - 1 - a)  # the window's last token predicts nothing
            if n <= 0:
                continue
            targets = np.asarray(windows[i][a + 1:a + 1 + n], dtype=np.int64)
            nll, top1, kl, agree, mine = _token_figures(lg[:n], targets, None if base is None else base[(i, step)])
            if keep:
                kept[(i, step)] = mine
            correct = (top1 == targets)
            parts[i].append((nll, correct, kl, agree))
    out = {
        "nll": np.concatenate([p[0] for w in parts for p in w]),
        "correct": np.concatenate([p[1] for w in parts for p in w]),
        "scored_per_window": [int(sum(len(p[0]) for p in w)) for w in parts],
    }
    if base is not None:
        out["kl"] = np.concatenate([p[2] for w in parts for p in w])
        out["agree"] = np.concatenate([p[3] for w in parts for p in w])
    if keep:
        out["kept"] = kept
    if check_store is not None:
        out["paged_equals_contiguous"], out["max_abs_logit_diff"] = equal, max_diff
    return out


def _decoder(state: dict):
    if state.get("decoder_obj") is None:
        if state["decoder"] == "torch":
            from .torch_decoder import TorchDecoder

            state["decoder_obj"] = TorchDecoder(state["weights"], "cuda" if state["memory"] == "device" else "cpu")
        else:
            state["decoder_obj"] = Decoder(state["weights"])
    return state["decoder_obj"]


def _score_entry(state: dict, name: str) -> dict:
    """One cache format: per-token figures, path, time; the baseline's kept figures go to
    ``state["baseline"]``."""
    dec = _decoder(state)
    cfg = state["weights"].config
    windows = state["windows"]
    if name != BASELINE and state.get("baseline") is None and state["flags"].get("baseline_ok"):
        _score_entry(state, BASELINE)  # a fresh process after another format's fault: the baseline again
    t0 = time.perf_counter()
    store = make_store(state["provider"], cfg, name, [len(w) for w in windows], state["memory"], state["fp4_path"],
                       "torch" if state["decoder"] == "torch" else "numpy")
    check = contiguous_store(cfg, name) if state["check"] else None
    is_base = name == BASELINE
    res = score_windows(dec, store, windows, state["chunk"], base=None if is_base else state.get("baseline"),
                        keep=is_base, check_store=check)
    store.check_guards()
    if is_base:
        state["baseline"] = res.pop("kept")
        res["kl"] = np.zeros(len(res["nll"]))
        res["agree"] = np.ones(len(res["nll"]), dtype=bool)
    res.update(path=store.path, seconds=time.perf_counter() - t0, fp4_refusal=store.fp4_refusal)
    return res


def _isolated_setup(provider_path: str, synthetic: bool, windows: list, chunk: int, memory: str, fp4_path: str,
                    check: bool, decoder: str, flags: dict) -> dict:
    """The state of one format process (isolation.isolated_map): provider, weights, windows."""
    from ..abi.loader import load_provider

    if synthetic:
        from .weights import synthetic_weights

        weights = synthetic_weights()
    else:
        from .weights import load_weights

        weights = load_weights()
    return {"provider": load_provider(provider_path), "weights": weights, "windows": windows, "chunk": chunk,
            "memory": memory, "fp4_path": fp4_path, "check": check, "decoder": decoder, "flags": dict(flags)}


def _isolated_format(state: dict, name: str) -> dict:
    """One cache format in the format process; a refused or failed provider call comes back as
    ``{"provider_call_error"}`` (the command then fails as in one process)."""
    from ..abi import health
    from .paged_kv import ProviderCallError

    health.set_test(f"model-eval/{name}")  # what the fake checker's pattern matches
    health.set_case(f"model-eval {name} cache, {sum(len(w) for w in state['windows'])} tokens, "
                    f"{state['memory']} memory")
    try:
        return _score_entry(state, name)
    except ProviderCallError as e:
        return {"provider_call_error": str(e)}


# ----------------------------------------------------------------------------- the command's rows


def run_model_eval(
    provider_path: str | Path | None = None,
    quick: bool = True,
    tokens: int | None = None,
    formats: tuple[str, ...] = EVAL_FORMATS,
    chunk: int | None = None,
    memory: str = "host",
    fp4_path: str = "auto",
    check: bool = False,
    synthetic: bool = False,
    progress: Callable[[str], None] | None = None,
    window: int | None = None,
    decoder: str = "auto",
    resamples: int = RESAMPLES,
) -> list[dict]:
    """One row per cache format (see the module docstring); the BF16 row is the baseline.

    ``tokens``/``window``/``chunk`` None: the decoder's :func:`defaults` (``quick`` with
    ``tokens`` None: :data:`QUICK_TOKENS`). ``provider_path`` None means the bundled
    reference provider. ``synthetic``: random weights with the model's shapes and random
    tokens (no model package needed; the perplexities then say nothing). Raises
    :class:`~kvx_conformance.model.weights.ModelUnavailable` without the model packages.

    On device memory each format runs in a child process
    (:func:`~kvx_conformance.cases.isolation.isolated_map`, one process for all formats
    while none faults): a format whose provider call leaves a device fault (or crashes)
    gets a row with ``device_fault`` (or ``crash``) and ``error`` and no figures (None),
    and the other formats run (a fresh process scores the baseline again first); when that
    format is the BF16 baseline, the comparisons with it are None in every row.
    """
    from ..abi.native import reference_provider
    from ..cases.isolation import failure, wanted

    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ValueError(f"unknown cache format(s) {unknown}; known: {', '.join(FORMATS)}")
    say = progress or (lambda _msg: None)
    memory = str(memory).lower()
    dec_name = resolve_decoder(decoder, memory)
    d = defaults(dec_name)
    n = tokens or (QUICK_TOKENS if quick and dec_name == "numpy" else d.tokens)
    window = window or d.window
    chunk = chunk or d.chunk
    if n < 2:
        raise ValueError("at least 2 tokens are needed to score a next token")
    path = Path(provider_path) if provider_path is not None else reference_provider()
    isolate = wanted(memory != "host")
    t0 = time.perf_counter()
    weights = None
    if synthetic:
        from .text import take_windows
        from .weights import synthetic_weights

        weights = synthetic_weights()
        ids = np.random.default_rng(1).integers(0, weights.config.vocab_size, size=n)
        wins = take_windows({"synthetic": ids}, n, min(window, n))
        model_label, text_label = weights.source, f"uniform random token ids (default_rng(1), {n} tokens)"
        provenance = [{"name": "synthetic", "source": "numpy default_rng(1) integers", "sha256": None,
                       "characters": 0, "tokens_used": n, "windows": len(wins)}]
    else:
        from .weights import load_weights, package_versions

        if not isolate:  # the format process loads its own
            weights = load_weights()
        wins, provenance = corpus_windows(n, window)
        model_label = f"SmolLM2-135M-Instruct Q4_1 GGUF ({_versions_label(package_versions())})"
        text_label = "; ".join(f"{p['name']} sha256:{p['sha256'][:12]} ({p['tokens_used']} tokens)"
                               for p in provenance if p["tokens_used"])
    windows = [w.ids for w in wins]
    if dec_name == "torch":
        _need_torch()
    say(f"model-eval: model loaded in {time.perf_counter() - t0:.1f} s ({model_label}); {n} tokens in "
        f"{len(windows)} windows of up to {window}, chunks of {chunk}, {dec_name} decoder"
        + ("; the formats run in a child process" if isolate else ""))
    names = list(dict.fromkeys([BASELINE, *formats]))
    scored: dict[str, dict] = {}
    flags = {"baseline_ok": False}

    def done(i: int, entry) -> None:
        name = names[i]
        bad = failure(entry)
        if bad is not None:
            scored[name] = bad
            say(f"model-eval: [{i + 1}/{len(names)}] {name} cache: {bad['error']}")
            return
        scored[name] = entry
        if "provider_call_error" in entry:
            return
        if name == BASELINE:
            flags["baseline_ok"] = True  # a later format process (after a fault) scores it again
        extra = f", paged == contiguous: {entry['paged_equals_contiguous']}" if check else ""
        say(f"model-eval: [{i + 1}/{len(names)}] {name} cache ({entry['path']}, {memory} memory) "
            f"{entry['seconds']:.1f} s{extra}")

    if isolate:
        from ..cases.isolation import isolated_map
        from .paged_kv import ProviderCallError

        # flags travel in setup_args, which each new format process receives as it is then
        outs = isolated_map(_isolated_format, names, setup=_isolated_setup,
                            setup_args=(str(path), synthetic, windows, chunk, memory, fp4_path, check, dec_name, flags),
                            per_call=True, on_result=done)
        for i, out in enumerate(outs):  # a format the processes never reached (their setup failed)
            if names[i] not in scored:
                done(i, out if isinstance(out, dict) else {"error": "no result"})
        for name in names:
            if "provider_call_error" in scored.get(name, {}):
                raise ProviderCallError(scored[name]["provider_call_error"])
    else:
        from ..abi.loader import load_provider

        state = {"provider": load_provider(path), "weights": weights, "windows": windows, "chunk": chunk,
                 "memory": memory, "fp4_path": fp4_path, "check": check, "decoder": dec_name, "flags": flags}
        for i, name in enumerate(names):
            done(i, _score_entry(state, name))
    common = {
        "tokens": int(sum(len(w) for w in windows)), "windows": len(windows), "window": window, "chunk": chunk,
        "block_size": BLOCK_SIZE, "memory": memory, "decoder": dec_name + (" (cuda)" if dec_name == "torch" and
                                                                              memory == "device" else ""),
        "provider": path.name, "model": model_label, "text": text_label, "texts": provenance,
    }
    return _rows(formats, scored, weights_config(weights, synthetic), common, resamples)


def _need_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise RuntimeError("the torch decoder needs torch: pip install 'kvx-conform[torch]'") from None


def weights_config(weights, synthetic: bool):
    if weights is not None:
        return weights.config
    from .weights import _config, _reader

    return _config(_reader().fields)


def _rows(formats, scored: dict, cfg, common: dict, resamples: int) -> list[dict]:
    measured = {name: e for name, e in scored.items() if "nll" in e}
    base = measured.get(BASELINE)
    figures = {name: {"nll": e["nll"], "kl": e.get("kl") if base else None, "agree": e.get("agree") if base else None}
               for name, e in measured.items()}
    scored_per_window = next(iter(measured.values()))["scored_per_window"] if measured else []
    blocks = block_ids(scored_per_window)
    intervals = paired_bootstrap(figures, BASELINE, blocks, resamples=resamples) if measured else {}
    base_ppl = float(np.exp(np.mean(base["nll"]))) if base else None
    rows = []
    for name in formats:
        e = scored[name]
        fmt = FORMATS[name]
        row = {
            "format": name, "path": e.get("path"),
            "bits_per_value": bits_per_value(fmt, cfg.head_dim),
            "kv_bytes_per_token": kv_bytes_per_token(fmt, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim),
            "ppl": None, "delta_ppl": None, "delta_ppl_ci95": None, "kl": None, "kl_ci95": None,
            "top1_agreement": None, "top1_agreement_ci95": None, "top1_accuracy": None,
            "significant_vs": [], "pairwise": {},
            **{k: common[k] for k in ("tokens",)},
            "scored": int(sum(scored_per_window)),
            **{k: common[k] for k in ("windows", "window", "chunk", "block_size", "memory", "decoder")},
            "seconds": round(e["seconds"], 2) if "seconds" in e else None,
            **{k: common[k] for k in ("provider", "model", "text", "texts")},
            "bootstrap": {"resamples": resamples, "block_tokens": BLOCK_TOKENS, "blocks": int(blocks.max()) + 1
                          if blocks.size else 0, "seed": SEED, "level": 0.95},
        }
        if "nll" not in e:  # the format's provider call faulted or crashed: recorded, no figures
            row.update({k: e[k] for k in ("device_fault", "crash", "error") if k in e})
            rows.append(row)
            continue
        ppl = float(np.exp(np.mean(e["nll"])))
        row["ppl"] = ppl
        row["top1_accuracy"] = float(np.mean(e["correct"]))
        iv = intervals[name]
        if base is not None:
            row["delta_ppl"] = 0.0 if name == BASELINE else ppl - base_ppl
            row["delta_ppl_ci95"] = iv["delta_ppl_ci95"]
            row["kl"] = float(np.mean(e["kl"]))
            row["kl_ci95"] = iv["kl_ci95"]
            row["top1_agreement"] = float(np.mean(e["agree"]))
            row["top1_agreement_ci95"] = iv["top1_agreement_ci95"]
        row["pairwise"] = iv["pairwise"]
        row["significant_vs"] = [o for o, p in iv["pairwise"].items() if p["significant"]]
        if e.get("fp4_refusal"):
            row["fp4_provider_refusal"] = e["fp4_refusal"]
        if "paged_equals_contiguous" in e:
            row["paged_equals_contiguous"] = e["paged_equals_contiguous"]
            row["max_abs_logit_diff"] = e["max_abs_logit_diff"]
        rows.append(row)
    return rows


def _versions_label(versions: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in versions.items())


# ----------------------------------------------------------------------------- the table


def _num(v, spec: str, width: int = 9) -> str:
    """A figure, or "-" where there is none (no BF16 baseline to compare with)."""
    return format(v, spec) if v is not None else f"{'-':>{width}}"


def _ci_text(ci, spec: str) -> str:
    return f"[{format(ci[0], spec)}, {format(ci[1], spec)}]" if ci else "-"


def significance_lines(rows: list[dict]) -> list[str]:
    """One line per pair of measured formats other than the baseline: the perplexity difference,
    its interval, and whether it is significant."""
    out = []
    measured = [r for r in rows if r.get("ppl") is not None and r["format"] != BASELINE]
    for i, a in enumerate(measured):
        for b in measured[i + 1:]:
            p = a["pairwise"].get(b["format"])
            if p is None:
                continue
            verdict = "significant" if p["significant"] else "not significant"
            out.append(f"{a['format']} - {b['format']}: {p['ppl_diff']:+.4f} ppl, 95% CI "
                       f"{_ci_text(p['ci95'], '+.4f')}: {verdict}")
    return out


def format_table(rows: list[dict]) -> str:
    """A plain-text table of :func:`run_model_eval` rows (one line per cache format), then the
    significance of the differences between formats."""
    check = any("paged_equals_contiguous" in r for r in rows)
    head = (f"{'format':<9} {'path':<12} {'bits':>5} {'KiB/tok':>7} {'ppl':>9} {'delta':>9} {'delta 95% CI':>20} "
            f"{'KL':>9} {'top1 agr':>8} {'top1 acc':>8} {'tokens':>7}" + ("  paged==contig" if check else ""))
    lines = [head, "-" * len(head)]
    for r in rows:
        lead = f"{r['format']:<9} {r['path'] or '-':<12} {r['bits_per_value']:>5.2f} {r['kv_bytes_per_token'] / 1024:>7.2f}"
        if r.get("error"):  # the format's provider call faulted or crashed: no figures
            lines.append(f"{lead} {r['error']}")
            continue
        line = (f"{lead} {r['ppl']:>9.4f} {_num(r['delta_ppl'], '>+9.4f')} "
                f"{_ci_text(r['delta_ppl_ci95'], '+.3f'):>20} {_num(r['kl'], '>9.2e')} "
                f"{_num(r['top1_agreement'], '>8.2%', 8)} {r['top1_accuracy']:>8.2%} {r['tokens']:>7}")
        if check:
            line += f"  {'yes' if r.get('paged_equals_contiguous') else 'NO'}"
        lines.append(line)
    if rows:
        r = rows[0]
        lines.append(f"baseline BF16 cache; provider {r['provider']} ({r['memory']} memory, {r['decoder']} decoder); "
                     f"{r['tokens']} tokens ({r['scored']} scored) in {r['windows']} windows of up to {r['window']}, "
                     f"chunks of {r['chunk']}; {r['model']}")
        lines.append(f"text: {r['text']}")
        b = r["bootstrap"]
        lines.append(f"95% intervals: paired bootstrap, {b['resamples']} resamples of {b['blocks']} blocks of "
                     f"{b['block_tokens']} tokens (seed {b['seed']}); bits and KiB/token count the scales")
        sig = significance_lines(rows)
        if sig:
            lines.append("differences between formats (perplexity, first minus second):")
            lines.extend("  " + s for s in sig)
        for r in rows:
            if r.get("fp4_provider_refusal"):
                lines.append(f"{r['format']}: oracle codec used because {r['fp4_provider_refusal']}")
        if any(r.get("error") for r in rows):
            lines.append("a format without figures: its provider call did not return (the formats ran in a child "
                         "process, a fresh one after a fault; the others were measured)"
                         + ("; no BF16 baseline, so no delta, agreement or KL" if any(
                             r["delta_ppl"] is None and not r.get("error") for r in rows) else ""))
    return "\n".join(lines)
