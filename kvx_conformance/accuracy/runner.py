"""Accuracy benchmark: every KV storage method on every synthetic distribution, one row each.

``run_accuracy()`` measures the numpy oracle's codecs (``path = "oracle"``). With a
provider, the FP4 methods (NVFP4, MXFP4-16, OCP MXFP4-32) are measured through it
(KVX 1.2 "fp4" profile: :func:`provider_roundtrip` writes into its FP4 cache, which
quantizes, and gathers back into F32, which dequantizes; ``path = "provider"``); a
method the provider does not support (every non-FP4 method: KVX has no cache dtype
for them; FP4 on a v1.1 provider or one answering UNSUPPORTED) is measured through
the oracle (``path = "oracle"``).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..reference_impl import quant
from . import metrics
from .distributions import DISTRIBUTIONS, sample
from .paged_attention import build_paged, paged_decode_attention

__all__ = [
    "BenchConfig",
    "FULL",
    "QUICK",
    "ProviderAccuracyUnavailable",
    "provider_roundtrip",
    "run_accuracy",
    "format_table",
    "ROW_KEYS",
    "MEASURED",
]


@dataclass(frozen=True)
class BenchConfig:
    tokens: int  # K and V tokens per distribution (split over num_seqs sequences)
    kv_heads: int
    q_heads: int
    head_dim: int
    block_size: int
    num_seqs: int
    decode_steps: int  # independent decode queries per sequence for the attention error
    logit_queries: int
    seed: int = 20250101


FULL = BenchConfig(tokens=8192, kv_heads=2, q_heads=8, head_dim=128, block_size=16, num_seqs=8, decode_steps=8, logit_queries=64)
QUICK = BenchConfig(tokens=1024, kv_heads=2, q_heads=4, head_dim=128, block_size=16, num_seqs=4, decode_steps=2, logit_queries=16)

ROW_KEYS: tuple[str, ...] = (
    "method", "label", "distribution", "path",
    "rel_rmse", "snr_db", "cosine", "max_abs_err", "rel_rmse_inliers", "logit_rmse", "attn_rel_err",
    "bits_per_value", "bytes_per_token", "compression_vs_bf16", "compression_vs_fp8",
    "tokens", "kv_heads", "q_heads", "head_dim", "seed",
)


class ProviderAccuracyUnavailable(NotImplementedError):
    """The provider cannot store this method (no KVX 1.2 FP4 extension, UNSUPPORTED, or not an FP4 method)."""


class ProviderAccuracyError(RuntimeError):
    """The provider failed an FP4 write or gather it claims to support (a status other than OK/UNSUPPORTED)."""


#: Accuracy methods a provider's FP4 cache can store, by KVX 1.2 format name.
PROVIDER_FORMATS = {"nvfp4": "nvfp4", "mxfp4_16": "mxfp4", "mxfp4_32_ocp": "mxfp4_ocp"}


def provider_roundtrip(provider: Any, method_name: str, x: np.ndarray, memory: Any = None,
                       block_size: int = 16) -> np.ndarray:
    """Write ``x [tokens, kv_heads, head_dim]`` (FP32) into ``provider``'s FP4 cache stored as
    ``method_name`` (kvx_write_kv quantizes), gather it back into F32 (kvx_gather_kv
    dequantizes) and return it. The blocks are shuffled physical blocks; NVFP4 uses the
    per-tensor global scale of ``quant.nvfp4`` (``amax / (6 * 448)``), so a conforming
    provider reproduces the oracle's figures.

    Raises :class:`ProviderAccuracyUnavailable` for a method or provider without an FP4
    cache (the caller falls back to the oracle) and :class:`ProviderAccuracyError` for a
    provider that answers anything but OK or UNSUPPORTED.
    """
    from ..cases import fp4 as fx
    from ..abi.header import DType, Memory, Status
    from ..reference_impl import fp4 as oracle_fp4

    fmt_name = PROVIDER_FORMATS.get(method_name)
    if fmt_name is None:
        raise ProviderAccuracyUnavailable(f"{method_name!r} is not an FP4 format: no KVX cache dtype stores it")
    if fx.provider_minor(provider) < 2:
        raise ProviderAccuracyUnavailable(f"provider has no KVX 1.2 FP4 extension (ABI minor "
                                          f"{fx.provider_minor(provider)}) for {method_name!r}")
    mem = Memory.HOST if memory is None else Memory(memory)
    x = np.ascontiguousarray(x, dtype=np.float32)
    T, H, D = x.shape
    fmt = fx.FORMATS[fmt_name]
    g = oracle_fp4.nvfp4_global_scale(x) if fmt_name == "nvfp4" else None
    nb = -(-T // block_size)
    blocks = np.random.default_rng(T * 31 + D).permutation(nb).astype(np.int64)
    cache = fx.new_cache(fmt, nb, block_size, H, D, k_global=g, v_global=g)
    t = np.arange(T, dtype=np.int64)
    slots = blocks[t // block_size] * block_size + t % block_size
    w = fx.run_write(provider, cache, x, x, slots, memory=mem)
    if w.status == Status.UNSUPPORTED:
        raise ProviderAccuracyUnavailable(f"provider answered UNSUPPORTED for a {fmt_name} cache write")
    if w.status != Status.OK or w.violations:
        raise ProviderAccuracyError(f"{fmt_name} write: status {Status(w.status).name}, {w.violations}")
    r = fx.run_gather(provider, w.cache, blocks[None, :].astype(np.int32), [T], T, DType.F32, memory=mem)
    if r.status == Status.UNSUPPORTED:
        raise ProviderAccuracyUnavailable(f"provider answered UNSUPPORTED for a {fmt_name} dequantizing gather")
    if r.status != Status.OK or r.violations:
        raise ProviderAccuracyError(f"{fmt_name} gather: status {Status(r.status).name}, {r.violations}")
    return r.out["k"].reshape(T, H, D)


def _seq_lens(tokens: int, num_seqs: int, rng: np.random.Generator) -> np.ndarray:
    """Uneven lengths adding up to ``tokens`` (each at least 1)."""
    cuts = np.sort(rng.choice(np.arange(1, tokens), size=num_seqs - 1, replace=False))
    return np.diff(np.concatenate(([0], cuts, [tokens]))).astype(np.int64)


@dataclass(frozen=True)
class _AttentionCase:
    """Sequence split, physical block layout, queries and the reference output of one distribution."""

    lens: np.ndarray
    layout_seed: int
    q: np.ndarray  # [num_seqs, decode_steps, q_heads, head_dim]
    ref: np.ndarray

    def rel_err(self, cfg: BenchConfig, k_hat: np.ndarray, v_hat: np.ndarray) -> float:
        got = build_paged(k_hat, v_hat, self.lens, cfg.block_size, np.random.default_rng(self.layout_seed))
        out = paged_decode_attention(self.q, got.k_cache, got.v_cache, got.block_table, got.seq_lens)
        return metrics.rel_err(self.ref, out)


def _attention_case(cfg: BenchConfig, k: np.ndarray, v: np.ndarray, key: tuple[int, ...]) -> _AttentionCase:
    rng = np.random.default_rng(key + (1,))
    lens = _seq_lens(cfg.tokens, cfg.num_seqs, rng)
    layout_seed = int(rng.integers(2**31))
    q = rng.standard_normal((cfg.num_seqs, cfg.decode_steps, cfg.q_heads, cfg.head_dim))
    ref = build_paged(k, v, lens, cfg.block_size, np.random.default_rng(layout_seed))
    out = paged_decode_attention(q, ref.k_cache, ref.v_cache, ref.block_table, ref.seq_lens)
    return _AttentionCase(lens, layout_seed, q, out)


#: the measured figures of a row (None in a row whose provider call faulted or crashed)
MEASURED: tuple[str, ...] = ("rel_rmse", "snr_db", "cosine", "max_abs_err", "rel_rmse_inliers", "logit_rmse",
                             "attn_rel_err")


def _row(cfg: BenchConfig, m: quant.QuantMethod, dist: str, path: str) -> dict:
    """A row's method, distribution, sizes and geometry; the figures are added by the caller."""
    bf16 = quant.method("bf16").bytes_per_token(cfg.kv_heads, cfg.head_dim)
    fp8 = quant.method("fp8_e4m3_tensor").bytes_per_token(cfg.kv_heads, cfg.head_dim)
    nbytes = m.bytes_per_token(cfg.kv_heads, cfg.head_dim)
    row = {"method": m.name, "label": m.label, "distribution": dist, "path": path}
    row.update({k: None for k in MEASURED})
    row.update({
        "bits_per_value": m.bits_per_value(cfg.head_dim),
        "bytes_per_token": nbytes,
        "compression_vs_bf16": bf16 / nbytes,
        "compression_vs_fp8": fp8 / nbytes,
        "tokens": cfg.tokens,
        "kv_heads": cfg.kv_heads,
        "q_heads": cfg.q_heads,
        "head_dim": cfg.head_dim,
        "seed": cfg.seed,
    })
    return row


def _rows_for(
    cfg: BenchConfig,
    dist: str,
    path: str,
    roundtrip_of: Callable[[quant.QuantMethod], Callable[[np.ndarray], np.ndarray] | None],
    given: dict[str, Any] | None = None,
) -> list[dict]:
    """``given``: per method name, the provider's ``(k_hat, v_hat)`` measured elsewhere (the
    isolated run), or the failure fields of a call that faulted or crashed (no figures)."""
    ks = sample(dist, cfg.tokens, cfg.kv_heads, cfg.head_dim, cfg.seed, stream=0)
    vs = sample(dist, cfg.tokens, cfg.kv_heads, cfg.head_dim, cfg.seed, stream=1)
    k, v = ks.x, vs.x
    both = np.stack([k, v]).astype(np.float64)
    attention = _attention_case(cfg, k, v, ks.seed)
    inliers = np.stack([~ks.outliers, ~vs.outliers])[:, None]  # [2, 1, H, D]
    q_logit = np.random.default_rng(ks.seed + (2,)).standard_normal((cfg.logit_queries, cfg.kv_heads, cfg.head_dim))
    rows = []
    for m in quant.METHODS:
        got_m = (given or {}).get(m.name)
        if isinstance(got_m, dict):  # the provider's call faulted or crashed: recorded, no figures
            rows.append({**_row(cfg, m, dist, path), **got_m})
            continue
        m_path = path
        if got_m is not None:
            k_hat, v_hat = got_m
        else:
            rt = roundtrip_of(m)
            if rt is None:  # the provider does not store this method: the oracle measures it
                rt, m_path = m.roundtrip, "oracle"
            k_hat, v_hat = rt(k), rt(v)
        k_hat = np.asarray(k_hat, dtype=np.float32)
        v_hat = np.asarray(v_hat, dtype=np.float32)
        got = np.stack([k_hat, v_hat]).astype(np.float64)
        row = _row(cfg, m, dist, m_path)
        row.update({
            "rel_rmse": metrics.rel_rmse(both, got),
            "snr_db": metrics.snr_db(both, got),
            "cosine": metrics.cosine(both, got),
            "max_abs_err": metrics.max_abs_err(both, got),
            "rel_rmse_inliers": metrics.rel_rmse(both, got, keep=inliers),
            "logit_rmse": metrics.logit_rmse(q_logit, k, k_hat),
            "attn_rel_err": attention.rel_err(cfg, k_hat, v_hat),
        })
        rows.append(row)
    return rows


def _isolated_setup(provider_path: str) -> Any:
    """The state of one case process (isolation.isolated_map): the provider."""
    from ..abi.loader import load_provider

    return load_provider(provider_path)


def _isolated_roundtrip(provider: Any, item: tuple) -> dict:
    """One FP4 method on one distribution through the provider, in the case process: K and V
    written and gathered back (``{"k", "v"}``), or why the provider does not store it."""
    from ..abi import health

    method, dist, cfg, memory = item
    health.set_test(f"accuracy/{method}/{dist}")  # what the fake checker's pattern matches
    health.set_case(f"accuracy {method} on {dist}, {cfg.tokens} tokens")
    try:
        return {m: provider_roundtrip(provider, method, sample(dist, cfg.tokens, cfg.kv_heads, cfg.head_dim,
                                                                cfg.seed, stream=i).x, memory)
                for i, m in enumerate(("k", "v"))}
    except ProviderAccuracyUnavailable as e:
        return {"unavailable": str(e)}
    except ProviderAccuracyError as e:
        return {"provider_error": str(e)}


def _run_isolated(provider: Any, cfg: BenchConfig, memory: Any) -> list[dict]:
    """run_accuracy's provider rows with each (FP4 method, distribution) in a case process
    (:func:`~kvx_conformance.cases.isolation.isolated_map`): a round trip whose provider call
    leaves a device fault or crashes is recorded in its row (``device_fault`` / ``crash``,
    ``error``, no figures) and a fresh process runs the rest."""
    from ..cases.isolation import failure, isolated_map

    items = [(name, dist, cfg, memory) for dist in DISTRIBUTIONS for name in PROVIDER_FORMATS]
    outs = isolated_map(_isolated_roundtrip, items, setup=_isolated_setup, setup_args=(str(provider.path),),
                        per_call=True)
    given: dict[str, dict[str, Any]] = {d: {} for d in DISTRIBUTIONS}
    for (name, dist, _, _), out in zip(items, outs):
        bad = failure(out)
        if bad is not None:
            given[dist][name] = bad
        elif "provider_error" in out:
            raise ProviderAccuracyError(out["provider_error"])
        elif "unavailable" not in out:
            given[dist][name] = (out["k"], out["v"])
    rows: list[dict] = []
    for dist in DISTRIBUTIONS:
        rows += _rows_for(cfg, dist, "provider", lambda m: None, given[dist])
    return rows


def provider_methods(provider: Any, memory: Any = None) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """The methods ``provider`` stores (probed with one small round trip each), as round-trip functions."""
    out = {}
    probe = np.random.default_rng(0).standard_normal((32, 1, 32)).astype(np.float32)
    for name in PROVIDER_FORMATS:
        try:
            provider_roundtrip(provider, name, probe, memory)
        except ProviderAccuracyUnavailable:
            continue
        out[name] = functools.partial(provider_roundtrip, provider, name, memory=memory)
    return out


def run_accuracy(provider: Any = None, quick: bool = False, config: BenchConfig | None = None,
                 memory: Any = None) -> list[dict]:
    """One row per (method, distribution) with the keys in :data:`ROW_KEYS`.

    Without a provider every row is the oracle's. With one, the FP4 methods it stores
    are measured through it (``path = "provider"``) and every other method through the
    oracle (``path = "oracle"``); still one row per (method, distribution).

    On device or unified memory each provider round trip runs in a case process
    (:func:`_run_isolated`): a row whose provider call left a device fault or crashed
    holds ``device_fault`` or ``crash`` and ``error`` and no figures (the :data:`MEASURED`
    keys are None), and the other rows are measured.
    """
    cfg = config or (QUICK if quick else FULL)
    from ..abi.header import Memory
    from ..cases.isolation import wanted

    if provider is not None and wanted(memory is not None and Memory(memory) != Memory.HOST):
        return _run_isolated(provider, cfg, memory)
    through = provider_methods(provider, memory) if provider is not None else {}
    rows: list[dict] = []
    for dist in DISTRIBUTIONS:
        if through:
            rows += _rows_for(cfg, dist, "provider", lambda m: through.get(m.name))
        else:
            rows += _rows_for(cfg, dist, "oracle", lambda m: m.roundtrip)
    return rows


def _fmt(x: float, spec: str) -> str:
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return format(x, spec)


_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # header, key, format
    ("method", "label", "<22"),
    ("bits/val", "bits_per_value", ">8.2f"),
    ("B/token", "bytes_per_token", ">8.0f"),
    ("xBF16", "compression_vs_bf16", ">6.2f"),
    ("xFP8", "compression_vs_fp8", ">5.2f"),
    ("relRMSE", "rel_rmse", ">8.4f"),
    ("SNR dB", "snr_db", ">7.2f"),
    ("cosine", "cosine", ">8.5f"),
    ("max|err|", "max_abs_err", ">9.3g"),
    ("inliers", "rel_rmse_inliers", ">8.4f"),
    ("logitRMSE", "logit_rmse", ">9.4f"),
    ("attn err", "attn_rel_err", ">8.4f"),
    ("path", "path", "<8"),
)


def format_table(rows: list[dict]) -> str:
    """Fixed-width text table, one block per distribution (in row order)."""
    if not rows:
        return "(no accuracy rows)"
    widths = [len(h) for h, _, _ in _COLUMNS]
    cells_by_dist: dict[str, list[list[str]]] = {}
    errors: dict[int, str | None] = {}  # a row without figures: marked with its error after the columns
    for r in rows:
        cells = []
        for h, key, f in _COLUMNS:
            val = r[key]
            if val is None:  # a row whose provider call faulted or crashed: its error instead of figures
                cells.append("")
                continue
            cells.append(format(val, f) if isinstance(val, str) else _fmt(val, f))
        cells_by_dist.setdefault(r["distribution"], []).append(cells)
        errors[id(cells)] = r.get("error")
    for cells_list in cells_by_dist.values():
        for cells in cells_list:
            widths = [max(w, len(c)) for w, c in zip(widths, cells)]
    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in (0, len(cells) - 1) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    header = line([h for h, _, _ in _COLUMNS])
    first = rows[0]
    out = [
        f"KV accuracy: {first['tokens']} tokens x {first['kv_heads']} KV heads x head_dim {first['head_dim']}"
        f" (GQA {first['q_heads']} query heads), seed {first['seed']}; relRMSE/SNR/cosine/max|err| over K and V,"
        " inliers = relRMSE without outlier channels, logitRMSE on K, attn err = paged decode attention",
    ]
    for dist, cells_list in cells_by_dist.items():
        out += ["", f"[{dist}]", header, "-" * len(header)]
        out += [line(c) + (f"  {errors[id(c)]}" if errors[id(c)] else "") for c in cells_list]
    failed = [r for r in rows if r.get("error")]
    if failed:
        out += ["", f"{len(failed)} row(s) without figures: the provider's call did not return (each round trip "
                    "ran in its own process; the other rows were measured)"]
    return "\n".join(out)
