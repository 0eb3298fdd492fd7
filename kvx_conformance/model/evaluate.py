"""Accuracy of KV-cache formats with a real model: perplexity and top-1 agreement vs BF16.

SmolLM2-135M reads a fixed English text (:mod:`.text`) in chunks (chunked prefill):
every attention reads K/V back from the provider's paged cache, so each format's
rounding reaches every score. Per cache format the row gives the perplexity, its
delta against the BF16 cache, top-1 next-token agreement with the BF16 run, the
mean KL divergence from the BF16 distribution, and the path the K/V took:
``provider`` (the provider's write/gather in that cache dtype), ``provider-fp4``
(the provider's KVX 1.2 FP4 cache) or ``oracle-fp4`` (the reference FP4 codec round
trip before the provider's F32 write, for a provider without the FP4 extension).

With ``check=True`` every format also runs on a plain contiguous cache of the same
format (:class:`~.kv_store.ContiguousKVStore`), and the row records whether the
logits are bit-identical (``paged_equals_contiguous``): the paged path adds nothing
but the cache dtype's rounding.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np

from .decoder import Decoder, log_softmax
from .kv_store import FORMATS, ContiguousKVStore
from .paged_kv import BLOCK_SIZE, PagedKVStore, blocks_needed

EVAL_FORMATS = ("F32", "BF16", "FP8-E4M3", "NVFP4", "MXFP4")
BASELINE = "BF16"
QUICK_TOKENS = 128
FULL_TOKENS = 512
CHUNK = 64
#: what every row holds (the issue's four first)
ROW_KEYS = ("cache", "perplexity", "delta", "top1_agreement", "kl_vs_bf16", "top1_accuracy", "path",
            "tokens", "scored", "chunk", "block_size", "memory", "seconds", "provider", "model", "text")


def eval_tokens(n: int) -> np.ndarray:
    from .text import eval_text
    from .tokenizer import encode

    ids = np.asarray(encode(eval_text()), dtype=np.int64)
    if n > len(ids):
        raise ValueError(f"the evaluation text has {len(ids)} tokens, {n} asked")
    return ids[:n]


def _run(store, weights, ids: np.ndarray, chunk: int) -> np.ndarray:
    dec = Decoder(weights)
    logits = []
    for a in range(0, len(ids), chunk):
        logits.append(dec.step(store, [0], [ids[a:a + chunk]], all_logits=True).logits[0])
    return np.concatenate(logits)


def score_format(provider, fmt, ids: np.ndarray, chunk: int = CHUNK, seed: int = 0, weights=None,
                 memory="host", fp4_path: str = "auto") -> tuple[np.ndarray, PagedKVStore]:
    """Logits ``[len(ids), vocab]`` with K/V through a paged cache, and the store used."""
    from ..abi.header import Memory

    if weights is None:
        from .weights import load_weights

        weights = load_weights()
    store = PagedKVStore(provider, weights.config, fmt, num_blocks=blocks_needed([len(ids)]) + 4, seed=seed,
                         memory=Memory[str(memory).upper()], fp4_path=fp4_path)
    logits = _run(store, weights, ids, chunk)
    store.check_guards()
    return logits, store


def _score_entry(provider, weights, ids: np.ndarray, name: str, chunk: int, memory: str, fp4_path: str,
                 check: bool) -> dict:
    """One cache format: its next-token logits (float32), path, time, and with ``check`` the
    comparison with a contiguous cache."""
    t0 = time.perf_counter()
    logits, store = score_format(provider, FORMATS[name], ids, chunk, weights=weights, memory=memory,
                                 fp4_path=fp4_path)
    entry = {"logits": logits[:-1], "path": store.path, "seconds": time.perf_counter() - t0,
             "fp4_refusal": store.fp4_refusal}
    if check:
        plain = _run(ContiguousKVStore(weights.config.n_layers, FORMATS[name]), weights, ids, chunk)
        entry["paged_equals_contiguous"] = bool(np.array_equal(logits.view(np.uint32), plain.view(np.uint32)))
        entry["max_abs_logit_diff"] = float(np.max(np.abs(logits - plain)))
    return entry


def _isolated_setup(provider_path: str, synthetic: bool, ids: np.ndarray, chunk: int, memory: str, fp4_path: str,
                    check: bool) -> dict:
    """The state of one format process (isolation.isolated_map): provider, weights, tokens."""
    from ..abi.loader import load_provider

    if synthetic:
        from .weights import synthetic_weights

        weights = synthetic_weights()
    else:
        from .weights import load_weights

        weights = load_weights()
    return {"provider": load_provider(provider_path), "weights": weights, "ids": ids, "chunk": chunk,
            "memory": memory, "fp4_path": fp4_path, "check": check}


def _isolated_format(state: dict, name: str) -> dict:
    """One cache format in the format process; a refused or failed provider call comes back as
    ``{"provider_call_error"}`` (the command then fails as in one process)."""
    from ..abi import health
    from .paged_kv import ProviderCallError

    health.set_test(f"model-eval/{name}")  # what the fake checker's pattern matches
    health.set_case(f"model-eval {name} cache, {len(state['ids'])} tokens, {state['memory']} memory")
    try:
        return _score_entry(state["provider"], state["weights"], state["ids"], name, state["chunk"], state["memory"],
                            state["fp4_path"], state["check"])
    except ProviderCallError as e:
        return {"provider_call_error": str(e)}


def run_model_eval(
    provider_path: str | Path | None = None,
    quick: bool = True,
    tokens: int | None = None,
    formats: tuple[str, ...] = EVAL_FORMATS,
    chunk: int = CHUNK,
    memory: str = "host",
    fp4_path: str = "auto",
    check: bool = False,
    synthetic: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """One row per cache format (see the module docstring); the BF16 row is the baseline.

    ``provider_path`` None means the bundled reference provider. ``synthetic``: random
    weights with the model's shapes and random tokens (no model package needed; the
    perplexities then say nothing). Raises
    :class:`~kvx_conformance.model.weights.ModelUnavailable` without the model packages.

    On device memory each format runs in its own process
    (:func:`~kvx_conformance.cases.isolation.isolated_map`): a format whose provider call leaves
    a device fault (or crashes) gets a row with ``device_fault`` (or ``crash``) and
    ``error`` and no figures (None), and the other formats run; when that format is the
    BF16 baseline, the comparisons with it (``delta``, ``top1_agreement``, ``kl_vs_bf16``)
    are None in every row.
    """
    from ..cases.isolation import failure, wanted
    from ..abi.loader import load_provider
    from ..abi.native import reference_provider

    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ValueError(f"unknown cache format(s) {unknown}; known: {', '.join(FORMATS)}")
    say = progress or (lambda _msg: None)
    n = tokens or (QUICK_TOKENS if quick else FULL_TOKENS)
    if n < 2:
        raise ValueError("at least 2 tokens are needed to score a next token")
    path = Path(provider_path) if provider_path is not None else reference_provider()
    provider = load_provider(path)
    isolate = wanted(str(memory).lower() != "host")
    t0 = time.perf_counter()
    weights = None
    if synthetic:
        from .weights import synthetic_weights

        weights = synthetic_weights()
        ids = np.random.default_rng(1).integers(0, weights.config.vocab_size, size=n)
        model_label, text_label = weights.source, f"uniform random token ids (default_rng(1), {n} tokens)"
    else:
        from .text import TOPICS, eval_text, text_id
        from .weights import load_weights, package_versions

        if not isolate:  # the format processes load their own
            weights = load_weights()
        ids = eval_tokens(n)
        model_label = f"SmolLM2-135M-Instruct Q4_1 GGUF ({_versions_label(package_versions())})"
        text_label = f"pydoc_data.topics {'+'.join(TOPICS)} sha256:{text_id(eval_text())}"
    say(f"model-eval: model loaded in {time.perf_counter() - t0:.1f} s ({model_label}); {n} tokens, chunks of {chunk}"
        + ("; each format in its own process" if isolate else ""))
    targets = ids[1:]
    names = list(dict.fromkeys([BASELINE, *formats]))
    scored: dict[str, dict] = {}

    def done(i: int, entry) -> None:
        name = names[i]
        bad = failure(entry)
        if bad is not None:
            scored[name] = bad
            say(f"model-eval: [{i + 1}/{len(names)}] {name} cache: {bad['error']}")
            return
        if "provider_call_error" in entry:
            scored[name] = entry
            return
        scored[name] = entry
        extra = f", paged == contiguous: {entry['paged_equals_contiguous']}" if check else ""
        say(f"model-eval: [{i + 1}/{len(names)}] {name} cache ({entry['path']}, {memory} memory) "
            f"{entry['seconds']:.1f} s{extra}")

    if isolate:
        from ..cases.isolation import isolated_map
        from .paged_kv import ProviderCallError

        outs = isolated_map(_isolated_format, names, setup=_isolated_setup,
                            setup_args=(str(path), synthetic, ids, chunk, memory, fp4_path, check), per_call=True,
                            on_result=done)
        for i, out in enumerate(outs):  # a format the processes never reached (their setup failed)
            if names[i] not in scored:
                done(i, out if isinstance(out, dict) else {"error": "no result"})
        for name in names:
            if "provider_call_error" in scored.get(name, {}):
                raise ProviderCallError(scored[name]["provider_call_error"])
    else:
        for i, name in enumerate(names):
            done(i, _score_entry(provider, weights, ids, name, chunk, memory, fp4_path, check))
    base = scored.get(BASELINE, {})
    base_lp = log_softmax(base["logits"]) if "logits" in base else None
    if base_lp is not None:
        base_top1 = base_lp.argmax(axis=-1)
        base_ppl = float(np.exp(-base_lp[np.arange(len(targets)), targets].mean()))
        base_p = np.exp(base_lp)
    rows = []
    for name in formats:
        e = scored[name]
        row = {
            "cache": name,
            "perplexity": None, "delta": None, "top1_agreement": None, "kl_vs_bf16": None, "top1_accuracy": None,
            "path": e.get("path"),
            "tokens": int(len(ids)),
            "scored": int(len(targets)),
            "chunk": chunk,
            "block_size": BLOCK_SIZE,
            "memory": str(memory).lower(),
            "seconds": round(e["seconds"], 2) if "seconds" in e else None,
            "provider": path.name,
            "model": model_label,
            "text": text_label,
        }
        if "logits" not in e:  # the format's provider call faulted or crashed: recorded, no figures
            row.update({k: e[k] for k in ("device_fault", "crash", "error") if k in e})
            rows.append(row)
            continue
        lp = log_softmax(e["logits"])
        nll = -lp[np.arange(len(targets)), targets]
        ppl = float(np.exp(nll.mean()))
        top1 = lp.argmax(axis=-1)
        row["perplexity"] = ppl
        row["top1_accuracy"] = float(np.mean(top1 == targets))
        if base_lp is not None:
            row["delta"] = ppl - base_ppl
            row["top1_agreement"] = float(np.mean(top1 == base_top1))
            row["kl_vs_bf16"] = float(np.mean(np.sum(base_p * (base_lp - lp), axis=-1)))
        if e["fp4_refusal"]:
            row["fp4_provider_refusal"] = e["fp4_refusal"]
        if check:
            row["paged_equals_contiguous"] = e["paged_equals_contiguous"]
            row["max_abs_logit_diff"] = e["max_abs_logit_diff"]
        rows.append(row)
    return rows


def _versions_label(versions: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in versions.items())


def _num(v, spec: str) -> str:
    """A 9-wide figure, or "-" where there is none (no BF16 baseline to compare with)."""
    return format(v, spec) if v is not None else f"{'-':>9}"


def format_table(rows: list[dict]) -> str:
    """A plain-text table of :func:`run_model_eval` rows (one line per cache format)."""
    check = any("paged_equals_contiguous" in r for r in rows)
    head = (f"{'cache':<10} {'path':<12} {'ppl':>9} {'delta':>9} {'top1 agr':>9} {'KL':>9} {'top1 acc':>9} "
            f"{'tokens':>7}" + ("  paged==contig" if check else ""))
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.get("error"):  # the format's provider call faulted or crashed: no figures
            lines.append(f"{r['cache']:<10} {r['path'] or '-':<12} {r['error']}")
            continue
        line = (f"{r['cache']:<10} {r['path']:<12} {r['perplexity']:>9.4f} {_num(r['delta'], '>+9.4f')} "
                f"{_num(r['top1_agreement'], '>9.2%')} {_num(r['kl_vs_bf16'], '>9.2e')} {r['top1_accuracy']:>9.2%} "
                f"{r['tokens']:>7}")
        if check:
            line += f"  {'yes' if r.get('paged_equals_contiguous') else 'NO'}"
        lines.append(line)
    if rows:
        r = rows[0]
        lines.append(f"baseline BF16 cache; provider {r['provider']} ({r['memory']} memory); {r['text']}; {r['model']}")
        for r in rows:
            if r.get("fp4_provider_refusal"):
                lines.append(f"{r['cache']}: oracle codec used because {r['fp4_provider_refusal']}")
        if any(r.get("error") for r in rows):
            lines.append("a format without figures: its provider call did not return (each format ran in its own "
                         "process; the others were measured)"
                         + ("; no BF16 baseline, so no delta, agreement or KL" if any(
                             r["delta"] is None and not r.get("error") for r in rows) else ""))
    return "\n".join(lines)
