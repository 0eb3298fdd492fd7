"""The HTML bandwidth report: one self-contained file (inline CSS, inline PNG plots, no script).

``render(doc, second=None)`` builds it from a bench results document; with ``second``
(another run of the same preset) it adds the run-to-run agreement table.
``kvx-conform bench-report results.json [--second other.json] -o bench.html`` is
available through :func:`main` (``python -m kvx_conformance.bench.report``).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from . import figures

TEMPLATES = Path(__file__).with_name("templates")
DTYPE_ORDER = ["f16", "bf16", "f32", "fp8_e4m3", "fp8_e5m2"]
COLORS = {"f16": "#1f77b4", "bf16": "#ff7f0e", "f32": "#2ca02c", "fp8_e4m3": "#d62728", "fp8_e5m2": "#9467bd"}


_plt = figures.plt
_png = figures.png
fmt_bytes = figures.fmt_bytes


def _prov(r: dict, impl: str = "provider") -> dict:
    return r.get("impls", {}).get(impl, {}) or {}


def _gbs(x):
    return None if x is None else x / 1e9


def token_series(doc: dict) -> dict:
    """{(op, layout, dtype, table): [(tokens, record)]} of the token sweep, sorted by tokens."""
    out = defaultdict(list)
    for r in doc.get("cases", []):
        c = r["case"]
        if c.get("sweep") != "tokens":
            continue
        out[(c["op"], c["layout"], c["dtype"], c["table"])].append((c["tokens"], r))
    for k in out:
        out[k].sort(key=lambda x: x[0])
    return dict(out)


def plot_bandwidth(doc: dict) -> str | None:
    series = token_series(doc)
    if not series:
        return None
    plt = _plt()
    panels = sorted({(k[0], k[1], k[3]) for k in series})
    ncol = 3
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 3.4 * nrow), squeeze=False)
    roof = _gbs(doc["roofline"].get("bandwidth_Bps"))
    for ax, (op, lay, table) in zip(axes.flat, panels):
        for dt in DTYPE_ORDER + sorted({k[2] for k in series} - set(DTYPE_ORDER)):
            pts = series.get((op, lay, dt, table))
            if not pts:
                continue
            xs, ys, lo, hi = [], [], [], []
            for t, r in pts:
                p = _prov(r)
                if p.get("bandwidth_Bps"):
                    xs.append(t)
                    ys.append(_gbs(p["bandwidth_Bps"]))
                    lo.append(_gbs(p.get("bandwidth_p10_Bps") or p["bandwidth_Bps"]))
                    hi.append(_gbs(p.get("bandwidth_p90_Bps") or p["bandwidth_Bps"]))
            if xs:
                ax.plot(xs, ys, marker="o", ms=3, label=dt, color=COLORS.get(dt))
                ax.fill_between(xs, lo, hi, alpha=0.2, color=COLORS.get(dt))
            tq = [(t, _gbs(_prov(r, "torch").get("bandwidth_Bps") or _prov(r, "numpy").get("bandwidth_Bps")))
                  for t, r in pts]
            tq = [(t, y) for t, y in tq if y]
            if tq and dt == "f16":
                ax.plot([t for t, _ in tq], [y for _, y in tq], ls=":", marker="x", ms=3, color="grey",
                        label="torch/numpy f16")
        if roof:
            ax.axhline(roof, color="black", ls="--", lw=1, label=f"copy roofline {roof:.0f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{op} {lay} ({table})", fontsize=10)
        ax.set_xlabel("tokens (write) / rows gathered")
        ax.set_ylabel("GB/s (read + written)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    return _png(fig)


def plot_latency(doc: dict) -> str | None:
    rows = [r for r in doc.get("cases", []) if r["case"]["rows"] <= 256 and r["case"].get("sweep") == "tokens"
            and r["case"]["dtype"] == "f16" and _prov(r).get("time_s")]
    if not rows:
        return None
    plt = _plt()
    device = doc.get("memory") != "host"
    fig, axes = plt.subplots(1, 2 if device else 1, figsize=(13 if device else 7, 4.2), squeeze=False)
    groups = defaultdict(list)
    for r in rows:
        c = r["case"]
        groups[(c["op"], c["layout"], c["table"])].append(r)
    ax = axes[0][0]
    for (op, lay, table), rs in sorted(groups.items()):
        rs.sort(key=lambda r: r["case"]["tokens"])
        ax.plot([r["case"]["tokens"] for r in rs], [_prov(r)["time_s"] * 1e6 for r in rs], marker="o", ms=4,
                label=f"{op} {lay} ({table})")
    if device:
        ax.axhline(4.0, color="red", ls=":", lw=1, label="4 µs target")
    ax.set_title("device time per call (CUDA-graph replay)" if device else "time per call (pytest-benchmark)",
                 fontsize=10)
    if device:
        bx = axes[0][1]
        for (op, lay, table), rs in sorted(groups.items()):
            rs.sort(key=lambda r: r["case"]["tokens"])
            xs = [r["case"]["tokens"] for r in rs]
            ev = [(_prov(r).get("events") or {}).get("median_s") for r in rs]
            hs = [(_prov(r).get("host") or {}).get("median_s") for r in rs]
            if all(ev):
                line, = bx.plot(xs, [e * 1e6 for e in ev], marker="x", ms=4, ls="--", label=f"{op} {lay}: eager")
                if all(hs):
                    bx.plot(xs, [h * 1e6 for h in hs], marker="s", ms=3, ls=":", color=line.get_color(),
                            label=f"{op} {lay}: host cost")
        bx.set_title("eager back-to-back calls (events) and the host cost of one ctypes call", fontsize=10)
    for a in axes[0]:
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel("tokens / rows")
        a.set_ylabel("µs per call")
        a.grid(alpha=0.3, which="both")
        if a.get_legend_handles_labels()[0]:  # a panel with no series (e.g. host runs) has no legend
            a.legend(fontsize=6, loc="upper left", bbox_to_anchor=(0, -0.15), ncol=2, frameon=False)
    return _png(fig)


def heat_rows(doc: dict):
    series = token_series(doc)
    tokens = sorted({t for pts in series.values() for t, _ in pts})
    rows = []
    for key in sorted(series, key=lambda k: (k[0], k[1], DTYPE_ORDER.index(k[2]) if k[2] in DTYPE_ORDER else 99, k[3])):
        vals = {t: _prov(r).get("pct_roofline") for t, r in series[key]}
        rows.append((" ".join(key), [vals.get(t) for t in tokens]))
    return tokens, rows


def plot_heat(doc: dict) -> str | None:
    tokens, rows = heat_rows(doc)
    if not rows or not doc["roofline"].get("bandwidth_Bps"):
        return None
    import numpy as np

    plt = _plt()
    data = np.array([[np.nan if v is None else v for v in vals] for _, vals in rows], dtype=float)
    fig, ax = plt.subplots(figsize=(1.0 + 0.75 * len(tokens), 0.8 + 0.28 * len(rows)))
    im = ax.imshow(data, aspect="auto", cmap="viridis", vmin=0, vmax=100)
    ax.set_xticks(range(len(tokens)))
    ax.set_xticklabels([str(t) for t in tokens], rotation=45, fontsize=7)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([n for n, _ in rows], fontsize=7)
    for i in range(data.shape[0]):
        for j in range(data.shape[1]):
            if not np.isnan(data[i, j]):
                ax.text(j, i, f"{data[i, j]:.0f}", ha="center", va="center", fontsize=6,
                        color="white" if data[i, j] < 60 else "black")
    ax.set_xlabel("tokens / rows")
    fig.colorbar(im, ax=ax, label="% of copy roofline")
    return _png(fig)


def plot_peers(doc: dict) -> str | None:
    series = token_series(doc)
    picks = []
    for key, pts in sorted(series.items()):
        t, r = pts[-1]
        if _prov(r).get("bandwidth_Bps"):
            picks.append((f"{key[0]} {key[1]} {key[2]}\n{key[3]} t{t}", r))
    if not picks:
        return None
    plt = _plt()
    impls = [i for i in ("provider", "reference", "torch", "numpy") if any(_prov(r, i).get("bandwidth_Bps")
                                                                          for _, r in picks)]
    fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(picks) * len(impls)), 4))
    w = 0.8 / len(impls)
    for k, impl in enumerate(impls):
        ys = [_gbs(_prov(r, impl).get("bandwidth_Bps")) or 0 for _, r in picks]
        ax.bar([i + k * w for i in range(len(picks))], ys, width=w, label=impl)
    roof = _gbs(doc["roofline"].get("bandwidth_Bps"))
    if roof:
        ax.axhline(roof, color="black", ls="--", lw=1, label="copy roofline")
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(picks))])
    ax.set_xticklabels([n for n, _ in picks], rotation=60, fontsize=6, ha="right")
    ax.set_ylabel("GB/s")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return _png(fig)


def summary_table(doc: dict) -> list[dict]:
    """One row per (op, layout, dtype, table) of the token sweep, at its largest size."""
    out = []
    for key, pts in sorted(token_series(doc).items()):
        t, r = pts[-1]
        p = _prov(r)
        out.append(_row(r, p))
    return out


def _row(r: dict, p: dict) -> dict:
    from .run import l2_resident

    c = r["case"]
    src = p.get("graph") or p.get("events") or p.get("host_timer") or {}
    tq = _prov(r, "torch") or _prov(r, "numpy")
    ref = _prov(r, "reference")
    ver = p.get("verified") or {}
    return {
        "id": c["id"], "op": c["op"], "layout": c["layout"], "dtype": c["dtype"], "io": c["io_dtype"],
        "table": c["table"], "tokens": c["tokens"], "heads": c["heads"], "head_dim": c["head_dim"],
        "block_size": c["block_size"], "bytes": fmt_bytes(c["bytes_moved"]),
        "gbs": _gbs(p.get("bandwidth_Bps")), "pct": p.get("pct_roofline"), "pct_sector": p.get("pct_sector_roofline"),
        "p10": _gbs(p.get("bandwidth_p10_Bps")), "p90": _gbs(p.get("bandwidth_p90_Bps")),
        "cv": src.get("cv"), "us": p["time_s"] * 1e6 if p.get("time_s") else None,
        "eager_us": (p.get("events") or {}).get("median_s", 0) * 1e6 or None,
        "host_us": (p.get("host") or {}).get("median_s", 0) * 1e6 or None,
        "source": p.get("time_source"), "nsets": r.get("nsets"),
        "ws": fmt_bytes(r.get("working_set_bytes")) if r.get("working_set_bytes") else "-",
        "l2_resident": l2_resident(r),
        "peer": _gbs(tq.get("bandwidth_Bps")), "peer_what": tq.get("what", ""),
        "ref": _gbs(ref.get("bandwidth_Bps")),
        "ratio_peer": r.get("ratios", {}).get("provider_over_torch") or r.get("ratios", {}).get("provider_over_numpy"),
        "ratio_ref": r.get("ratios", {}).get("provider_over_reference"),
        "pct_copy": (100.0 * r["ratios"]["provider_over_copy"]) if (r.get("ratios") or {}).get("provider_over_copy")
        else None,
        "copy_what": (f"a copy of the case's bytes: {_gbs(_prov(r, 'copy').get('bandwidth_Bps')):.1f} GB/s, "
                      f"{_prov(r, 'copy').get('pct_roofline', 0):.1f}% of the roofline"
                      if _prov(r, "copy").get("bandwidth_Bps") else ""),
        "verified": ver.get("ok"), "verified_rows": f"{ver.get('rows_checked', 0)}/{ver.get('rows_total', 0)}",
        "problems": "; ".join(ver.get("problems", [])),
        "error": r.get("error") or p.get("error") or p.get("graph_error"),
        "gpu": r.get("gpu"),  # a --gpus run: the GPU that timed this case
    }


def targets(doc: dict) -> list[dict]:
    """The performance targets (docs/benchmarks.md, "Targets"), held against this run (device memory only).
    Cases whose working set fits in the L2 are not held to the roofline targets (only to the µs one)."""
    from .run import l2_resident

    if doc.get("memory") == "host":
        return []
    cases = [r for r in doc.get("cases", []) if _prov(r).get("bandwidth_Bps")]
    dram = [r for r in cases if not l2_resident(r)]
    big = [r for r in dram if r["case"]["bytes_moved"] >= 256e6 and r["case"]["heads"] == 8
           and r["case"]["head_dim"] == 128 and r["case"]["block_size"] == 16]
    out = []

    def add(what, rows, key, goal, unit="%", better="high"):
        vals = [(_prov(r).get(key), r["case"]["id"]) for r in rows if _prov(r).get(key) is not None]
        if not vals:
            return
        worst = min(vals) if better == "high" else max(vals)
        ok = worst[0] >= goal if better == "high" else worst[0] <= goal
        out.append({"what": what, "goal": f"{'≥' if better == 'high' else '≤'} {goal:g} {unit}", "cases": len(vals),
                    "worst": worst[0], "worst_id": worst[1], "unit": unit, "met": ok})

    base = ("f16", "bf16", "f32")
    add("gather, NHD/HND/HND_PACKED, F16/BF16/F32, ≥ 256 MB", [r for r in big if r["case"]["op"] == "gather" and
        r["case"]["dtype"] in base and r["case"]["table"] == "packed"], "pct_roofline", 95)
    add("write, NHD/HND random slots, F16/BF16/F32, ≥ 256 MB", [r for r in big if r["case"]["op"] == "write" and
        r["case"]["dtype"] in base and r["case"]["layout"] in ("nhd", "hnd")], "pct_roofline", 95)
    add("write, HND_PACKED prefill slots, F16/BF16/F32, ≥ 256 MB", [r for r in big if r["case"]["op"] == "write" and
        r["case"]["dtype"] in base and r["case"]["layout"] == "hnd_packed" and r["case"]["table"] == "prefill"],
        "pct_roofline", 95)
    add("write, HND_PACKED random slots, against the 32-byte sector bound", [
        r for r in big if r["case"]["op"] == "write" and r["case"]["layout"] == "hnd_packed"
        and r["case"]["table"] == "random" and r["case"]["dtype"] in base], "pct_sector_roofline", 95)
    add("FP8 (E4M3) write from F16, ≥ 256 MB", [r for r in dram if r["case"]["op"] == "write" and
        r["case"]["dtype"].startswith("fp8") and r["case"]["bytes_moved"] >= 256e6 and
        not (r["case"]["layout"] == "hnd_packed" and r["case"]["table"] == "random")], "pct_roofline", 90)
    small = [r for r in cases if r["case"]["rows"] <= 256 and _prov(r).get("graph")]
    for r in small:
        _prov(r)["_us"] = _prov(r)["time_s"] * 1e6
    add("calls of 1 to 256 tokens, device time under graph replay", small, "_us", 4.0, unit="µs", better="low")
    host = [r for r in cases if r["case"]["rows"] <= 256 and (_prov(r).get("host") or {}).get("median_s")]
    for r in host:
        _prov(r)["_host_us"] = _prov(r)["host"]["median_s"] * 1e6
    if host:
        vals = [_prov(r)["_host_us"] for r in host]
        out.append({"what": "host cost of one ctypes call (calls of 1 to 256 tokens), median", "goal": "reported",
                    "cases": len(vals), "worst": statistics.median(vals), "worst_id": "", "unit": "µs", "met": None})
    return out


def all_rows(doc: dict) -> list[dict]:
    return [_row(r, _prov(r)) for r in doc.get("cases", [])]


def render(doc: dict, second: dict | None = None, second_label: str | None = None) -> str:
    from .compare import agreement

    from .run import decode_table, rederive

    doc = rederive(json.loads(json.dumps(doc)))
    env = figures.jinja_env(TEMPLATES)
    tpl = env.get_template("bench.html.j2")
    agree = agreement(doc, second) if second else None
    return tpl.render(
        doc=doc, s=doc.get("summary", {}), env_=doc.get("environment", {}), roof=doc.get("roofline", {}),
        summary_rows=summary_table(doc), rows=all_rows(doc), targets=targets(doc),
        plot_bw=plot_bandwidth(doc), plot_lat=plot_latency(doc), plot_heat=plot_heat(doc), plot_peers=plot_peers(doc),
        agree=agree, second=second, second_label=second_label, decode=decode_table(doc),
        json_env=json.dumps(doc.get("environment", {}), indent=1, default=str),
    )


def write_report(doc: dict, path: Path, second: dict | None = None, second_label: str | None = None) -> None:
    Path(path).write_text(render(doc, second, second_label), encoding="utf-8")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvx_conformance.bench.report",
                                description="Render bench.html from results.json (optionally with a second run)")
    p.add_argument("results")
    p.add_argument("--second", help="results.json of a second run of the same preset (agreement table)")
    p.add_argument("-o", "--output", default="bench.html")
    a = p.parse_args(argv)
    doc = json.loads(Path(a.results).read_text(encoding="utf-8"))
    second = json.loads(Path(a.second).read_text(encoding="utf-8")) if a.second else None
    write_report(doc, Path(a.output), second, a.second)
    print(a.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
