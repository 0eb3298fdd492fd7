"""The accuracy section of the HTML report: tables per distribution and inline SVG plots.

``section_view(rows)`` is what ``accuracy.html.j2`` renders when a results.json carries an
``accuracy`` list (``kvx-conform accuracy --add-to``); the plots are plain SVG strings (no
scripts, no external files).
"""
from __future__ import annotations

import html
import math


#: Columns of the per-distribution tables: header, key, format.
COLUMNS = (
    ("method", "label", ""),
    ("bits/value", "bits_per_value", ".2f"),
    ("bytes/token", "bytes_per_token", ".0f"),
    ("x BF16", "compression_vs_bf16", ".2f"),
    ("rel RMSE", "rel_rmse", ".4f"),
    ("SNR dB", "snr_db", ".2f"),
    ("cosine", "cosine", ".5f"),
    ("max |err|", "max_abs_err", ".3g"),
    ("inliers", "rel_rmse_inliers", ".4f"),
    ("logit RMSE", "logit_rmse", ".4f"),
    ("attn err", "attn_rel_err", ".4f"),
    ("path", "path", ""),
)

_PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")


def _cell(v, fmt: str) -> str:
    if v is None:  # a row whose provider call faulted or crashed
        return ""
    if fmt == "":
        return str(v)
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return format(v, fmt)


def _measured(rows: list[dict]) -> list[dict]:
    """The rows with figures (not those whose provider call faulted or crashed)."""
    return [r for r in rows if r.get("snr_db") is not None]


def snr_plot(rows: list[dict], width: int = 640, bar_h: int = 12) -> str:
    """Grouped horizontal bars: SNR (dB) of every method, one group per distribution."""
    dists = list(dict.fromkeys(r["distribution"] for r in rows))
    methods = list(dict.fromkeys(r["label"] for r in rows))
    rows = _measured(rows)
    finite = [r["snr_db"] for r in rows if math.isfinite(r["snr_db"])]
    vmax = max(finite + [1.0])
    left, right, gap = 150, 60, 10
    group_h = len(methods) * bar_h + gap
    height = len(dists) * group_h + 30 + 16 * ((len(methods) + 2) // 3)
    scale = (width - left - right) / vmax
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           f'aria-label="SNR by method and distribution" font-family="sans-serif" font-size="11">']
    y = 10
    by = {(r["distribution"], r["label"]): r for r in rows}
    for d in dists:
        out.append(f'<text x="4" y="{y + group_h / 2:.0f}" font-weight="bold">{html.escape(d)}</text>')
        for i, m in enumerate(methods):
            r = by.get((d, m))
            if r is None:
                continue
            v = r["snr_db"] if math.isfinite(r["snr_db"]) else vmax
            w = max(v, 0.0) * scale
            color = _PALETTE[i % len(_PALETTE)]
            yy = y + i * bar_h
            out.append(f'<rect x="{left}" y="{yy}" width="{w:.1f}" height="{bar_h - 2}" fill="{color}">'
                       f'<title>{html.escape(m)} on {html.escape(d)}: {r["snr_db"]:.2f} dB ({r["path"]})</title></rect>')
            out.append(f'<text x="{left + w + 3:.1f}" y="{yy + bar_h - 3}">{r["snr_db"]:.1f}</text>')
        y += group_h
    out.append(f'<text x="{left}" y="{y + 4}" fill="#555">SNR dB (higher is better)</text>')
    y += 16
    for i, m in enumerate(methods):
        x = 4 + (i % 3) * (width // 3)
        yy = y + (i // 3) * 16
        out.append(f'<rect x="{x}" y="{yy}" width="10" height="10" fill="{_PALETTE[i % len(_PALETTE)]}"/>')
        out.append(f'<text x="{x + 14}" y="{yy + 9}">{html.escape(m)}</text>')
    out.append("</svg>")
    return "".join(out)


def size_vs_error_plot(rows: list[dict], distribution: str, width: int = 420, height: int = 260) -> str:
    """Scatter: bits per value against relative RMSE (log) for one distribution."""
    pts = [r for r in _measured(rows) if r["distribution"] == distribution and r["rel_rmse"] > 0]
    if not pts:
        return ""
    left, bottom, top, right = 50, 36, 12, 16
    xmax = max(r["bits_per_value"] for r in pts) * 1.1
    lo = math.log10(min(r["rel_rmse"] for r in pts)) - 0.2
    hi = math.log10(max(r["rel_rmse"] for r in pts)) + 0.2

    def px(b):
        return left + b / xmax * (width - left - right)

    def py(e):
        return top + (hi - math.log10(e)) / (hi - lo) * (height - top - bottom)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           f'aria-label="bits per value against relative RMSE" font-family="sans-serif" font-size="10">',
           f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#888"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#888"/>']
    for b in (4, 8, 12, 16):
        if b <= xmax:
            out.append(f'<text x="{px(b):.0f}" y="{height - bottom + 12}" text-anchor="middle">{b}</text>')
    for k in range(math.ceil(lo), math.floor(hi) + 1):
        out.append(f'<text x="{left - 4}" y="{py(10 ** k) + 3:.0f}" text-anchor="end">1e{k}</text>')
    out.append(f'<text x="{(left + width) / 2:.0f}" y="{height - 6}" text-anchor="middle">bits per value '
               f'(scales included)</text>')
    for i, r in enumerate(pts):
        x, y = px(r["bits_per_value"]), py(r["rel_rmse"])
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{_PALETTE[i % len(_PALETTE)]}">'
                   f'<title>{html.escape(r["label"])}: {r["bits_per_value"]:.2f} bits, rel RMSE {r["rel_rmse"]:.4f}'
                   f'</title></circle>')
        out.append(f'<text x="{x + 6:.1f}" y="{y + 3:.1f}">{html.escape(r["label"])}</text>')
    out.append("</svg>")
    return "".join(out)


def section_view(rows: list[dict] | None) -> dict | None:
    """What accuracy.html.j2 renders; None when there are no rows."""
    if not rows:
        return None
    dists = list(dict.fromkeys(r["distribution"] for r in rows))
    tables = []
    for d in dists:
        body = [[_cell(r[k], f) for _, k, f in COLUMNS] for r in rows if r["distribution"] == d]
        errors = [r.get("error") or "" for r in rows if r["distribution"] == d]
        tables.append({"distribution": d, "rows": body, "errors": errors})
    first = rows[0]
    paths = sorted({r["path"] for r in rows})
    return {
        "headers": [h for h, _, _ in COLUMNS],
        "tables": tables,
        "snr_svg": snr_plot(rows),
        "scatter_svg": size_vs_error_plot(rows, dists[0]),
        "scatter_dist": dists[0],
        "geometry": f"{first['tokens']} tokens x {first['kv_heads']} KV heads x head_dim {first['head_dim']}, "
                    f"{first['q_heads']} query heads, seed {first['seed']}",
        "paths": paths,
        "through_provider": sorted({r["label"] for r in rows if r["path"] == "provider"}),
        "failed": [f"{r['label']} on {r['distribution']}: {r['error']}" for r in rows if r.get("error")],
    }
