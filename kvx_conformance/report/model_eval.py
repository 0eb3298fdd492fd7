"""The model-evaluation section of the HTML report: the table, a chart, the significant differences.

:func:`section_view` is what ``model_eval.html.j2`` renders when a results.json carries
``model_eval`` rows (``kvx-conform model-eval --add-to results.json``);
:func:`delta_chart` is an inline SVG (no script, no external file) of each format's
perplexity delta against the BF16 cache, with its 95% interval, over the bits it stores
per value. Rows written before the intervals existed (``cache``, ``perplexity``,
``delta``, ``kl_vs_bf16``) are read too (:func:`normalize`).
"""
from __future__ import annotations

import html
import math

_HEADERS = ("format", "path", "bits/value", "KV KiB/token", "perplexity", "delta vs BF16", "delta 95% CI",
            "KL vs BF16", "top-1 agreement", "top-1 accuracy")
_LEGACY = {"cache": "format", "perplexity": "ppl", "delta": "delta_ppl", "kl_vs_bf16": "kl"}
_PALETTE = {"F32": "#4e79a7", "F16": "#76b7b2", "BF16": "#59a14f", "FP8-E4M3": "#edc948", "NVFP4": "#e15759",
            "MXFP4": "#f28e2b", "INT8": "#b07aa1", "INT4": "#9c755f"}


def normalize(row: dict) -> dict:
    """A row with the current keys (earlier rows said ``cache``, ``perplexity``, ``delta``, ``kl_vs_bf16``
    and had no bits, intervals or pairwise comparisons)."""
    r = {_LEGACY.get(k, k): v for k, v in row.items()}
    for k in ("bits_per_value", "kv_bytes_per_token", "delta_ppl_ci95", "kl_ci95", "top1_agreement_ci95"):
        r.setdefault(k, None)
    r.setdefault("pairwise", {})
    return r


def _fig(v, spec: str) -> str:
    """A figure, or "-" where there is none (no BF16 baseline to compare with)."""
    return "-" if v is None else format(v, spec)


def _ci(ci, spec: str) -> str:
    return "-" if not ci else f"[{format(ci[0], spec)}, {format(ci[1], spec)}]"


def delta_chart(rows: list[dict], width: int = 560, height: int = 300) -> str:
    """Delta perplexity vs BF16 (with its 95% interval) against bits per value (log2 axis)."""
    pts = [r for r in rows if r.get("delta_ppl") is not None and r.get("bits_per_value")]
    if not pts:
        return ""
    left, right, top, bottom = 56, 110, 14, 40
    lows = [min(r["delta_ppl"], (r["delta_ppl_ci95"] or [r["delta_ppl"]] * 2)[0]) for r in pts]
    highs = [max(r["delta_ppl"], (r["delta_ppl_ci95"] or [r["delta_ppl"]] * 2)[1]) for r in pts]
    ylo, yhi = min(lows + [0.0]), max(highs + [0.0])
    pad = 0.08 * (yhi - ylo or 1.0)
    ylo, yhi = ylo - pad, yhi + pad
    bits = [r["bits_per_value"] for r in pts]
    xlo, xhi = math.log2(min(bits)) - 0.25, math.log2(max(bits)) + 0.25

    def px(b: float) -> float:
        return left + (math.log2(b) - xlo) / (xhi - xlo) * (width - left - right)

    def py(v: float) -> float:
        return top + (yhi - v) / (yhi - ylo) * (height - top - bottom)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           f'aria-label="delta perplexity against bits per value" font-family="sans-serif" font-size="10">',
           f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#888"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#888"/>',
           f'<line x1="{left}" y1="{py(0):.1f}" x2="{width - right}" y2="{py(0):.1f}" stroke="#bbb" '
           f'stroke-dasharray="3,3"/>']
    for b in (4, 4.5, 8, 8.5, 16, 32):
        if xlo <= math.log2(b) <= xhi:
            out.append(f'<text x="{px(b):.1f}" y="{height - bottom + 12}" text-anchor="middle">{b:g}</text>')
    step = _nice_step((yhi - ylo) / 5)
    v = math.ceil(ylo / step) * step
    while v <= yhi:
        out.append(f'<text x="{left - 4}" y="{py(v) + 3:.1f}" text-anchor="end">{v:+.3g}</text>')
        v += step
    out.append(f'<text x="{(left + width - right) / 2:.0f}" y="{height - 8}" text-anchor="middle">bits per value '
               f'(scales counted, log scale)</text>')
    out.append(f'<text x="12" y="{(top + height - bottom) / 2:.0f}" text-anchor="middle" '
               f'transform="rotate(-90 12 {(top + height - bottom) / 2:.0f})">delta perplexity vs BF16</text>')
    same_bits: dict[float, int] = {}
    for r in pts:  # formats at equal bits side by side (FP4 and INT4 both store 4.5)
        k = same_bits.get(r["bits_per_value"], 0)
        same_bits[r["bits_per_value"]] = k + 1
        x = px(r["bits_per_value"]) + 9 * k
        color = _PALETTE.get(r["format"], "#555")
        ci = r["delta_ppl_ci95"]
        tip = f'{r["format"]}: {r["bits_per_value"]:g} bits, delta {r["delta_ppl"]:+.4f}'
        if ci:
            tip += f' (95% CI {ci[0]:+.4f} to {ci[1]:+.4f})'
            out.append(f'<line x1="{x:.1f}" y1="{py(ci[0]):.1f}" x2="{x:.1f}" y2="{py(ci[1]):.1f}" stroke="{color}" '
                       f'stroke-width="2"/>')
            for end in ci:
                out.append(f'<line x1="{x - 3:.1f}" y1="{py(end):.1f}" x2="{x + 3:.1f}" y2="{py(end):.1f}" '
                           f'stroke="{color}" stroke-width="1.5"/>')
        out.append(f'<circle cx="{x:.1f}" cy="{py(r["delta_ppl"]):.1f}" r="3.5" fill="{color}" '
                   f'data-format="{html.escape(r["format"])}"><title>{html.escape(tip)}</title></circle>')
    for i, r in enumerate(pts):  # legend
        y = top + 4 + 14 * i
        color = _PALETTE.get(r["format"], "#555")
        out.append(f'<rect x="{width - right + 12}" y="{y}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{width - right + 26}" y="{y + 9}">{html.escape(r["format"])} '
                   f'({r["bits_per_value"]:g})</text>')
    out.append("</svg>")
    return "".join(out)


def _nice_step(raw: float) -> float:
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def significance(rows: list[dict]) -> list[dict]:
    """Every pair of measured formats other than BF16: perplexity difference, interval, verdict."""
    measured = [r for r in rows if r.get("ppl") is not None and r["format"] != "BF16" and r.get("pairwise")]
    out = []
    for i, a in enumerate(measured):
        for b in measured[i + 1:]:
            p = a["pairwise"].get(b["format"])
            if p is not None:
                out.append({"a": a["format"], "b": b["format"], "diff": f"{p['ppl_diff']:+.4f}",
                            "ci": _ci(p["ci95"], "+.4f"), "significant": p["significant"]})
    return out


def section_view(rows: list[dict] | None) -> dict | None:
    """What model_eval.html.j2 renders; None when there are no rows."""
    if not rows:
        return None
    rows = [normalize(r) for r in rows]
    check = any("paged_equals_contiguous" in r for r in rows)
    headers = list(_HEADERS) + (["paged == contiguous"] if check else [])
    body = []
    for r in rows:
        lead = [r["format"], r["path"] or "-", _fig(r["bits_per_value"], ".2f"),
                _fig(None if r["kv_bytes_per_token"] is None else r["kv_bytes_per_token"] / 1024, ".2f")]
        if r.get("error"):  # the format's provider call faulted or crashed: marked, no figures
            body.append(lead + [r["error"]] + [""] * (len(headers) - 5))
            continue
        cells = lead + [f"{r['ppl']:.4f}", _fig(r["delta_ppl"], "+.4f"), _ci(r["delta_ppl_ci95"], "+.4f"),
                        _fig(r["kl"], ".2e"), _fig(r["top1_agreement"], ".2%"), f"{100 * r['top1_accuracy']:.2f}%"]
        if check:
            cells.append("yes" if r.get("paged_equals_contiguous") else "NO")
        body.append(cells)
    first = rows[0]
    notes = [f"{r['format']}: the oracle codec was used because {r['fp4_provider_refusal']}"
             for r in rows if r.get("fp4_provider_refusal")]
    notes += [f"{r['format']}: no figures, {r['error']} (the formats ran in a child process, a fresh one after a "
              "fault; the others were measured)" for r in rows if r.get("error")]
    b = first.get("bootstrap")
    return {
        "headers": headers, "rows": body, "notes": notes,
        "chart_svg": delta_chart(rows),
        "significance": significance(rows),
        "bootstrap": (f"paired bootstrap, {b['resamples']} resamples of {b['blocks']} blocks of {b['block_tokens']} "
                      f"tokens (seed {b['seed']})") if b else None,
        "texts": first.get("texts") or [],
        "windows": first.get("windows"), "window": first.get("window"), "decoder": first.get("decoder", "numpy"),
        **{k: first[k] for k in ("model", "text", "tokens", "scored", "chunk", "block_size", "memory", "provider")},
    }
