"""The model-evaluation section of the HTML report.

:func:`section_view` is what ``model_eval.html.j2`` renders when a results.json carries
``model_eval`` rows (``kvx-conform model-eval --add-to results.json``).
"""
from __future__ import annotations


_HEADERS = ("cache", "path", "perplexity", "delta vs BF16", "top-1 agreement", "KL vs BF16", "top-1 accuracy")


def _fig(v, spec: str) -> str:
    """A figure, or "-" where there is none (no BF16 baseline to compare with)."""
    return "-" if v is None else format(v, spec)


def section_view(rows: list[dict] | None) -> dict | None:
    """What model_eval.html.j2 renders; None when there are no rows."""
    if not rows:
        return None
    check = any("paged_equals_contiguous" in r for r in rows)
    headers = list(_HEADERS) + (["paged == contiguous"] if check else [])
    body = []
    for r in rows:
        if r.get("error"):  # the format's provider call faulted or crashed: marked, no figures
            body.append([r["cache"], r["path"] or "-", r["error"]] + [""] * (len(headers) - 3))
            continue
        cells = [r["cache"], r["path"], f"{r['perplexity']:.4f}", _fig(r["delta"], "+.4f"),
                 _fig(r["top1_agreement"], ".2%"), _fig(r["kl_vs_bf16"], ".2e"), f"{100 * r['top1_accuracy']:.2f}%"]
        if check:
            cells.append("yes" if r.get("paged_equals_contiguous") else "NO")
        body.append(cells)
    first = rows[0]
    notes = [f"{r['cache']}: the oracle codec was used because {r['fp4_provider_refusal']}"
             for r in rows if r.get("fp4_provider_refusal")]
    notes += [f"{r['cache']}: no figures, {r['error']} (each format ran in its own process; the others were "
              "measured)" for r in rows if r.get("error")]
    return {
        "headers": headers, "rows": body, "notes": notes,
        **{k: first[k] for k in ("model", "text", "tokens", "scored", "chunk", "block_size", "memory", "provider")},
    }
