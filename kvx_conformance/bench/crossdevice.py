"""Two bench runs on different devices, side by side per case (``kvx-conform compare A B``).

Raw bandwidths of two devices are not comparable against one roofline: each case is shown
with its time and its percentage of **its own device's** in-run copy roofline, and the ratio
between the devices (``speed_b_over_a``: A's time / B's time, above 1 when B is faster;
``pct_b_over_a``: B's percentage of its roofline / A's, above 1 when B comes closer to its
own memory's limit). A case whose working set fits in a device's L2 is marked and left out
of the large-case statistics (not held to the DRAM roofline; docs/benchmarks.md).

``side_by_side(a, b)`` builds the comparison, ``text(res)`` the console table and
``render(res)`` the self-contained HTML page (inline CSS and one inline PNG, no script).
"""
from __future__ import annotations

import statistics
from pathlib import Path

TEMPLATES = Path(__file__).with_name("templates")
LARGE_BYTES = 256e6


def device(doc: dict) -> dict:
    """What ran: the device (GPU, or the CPU of a host run), driver, versions, roofline, provider."""
    env = doc.get("environment") or {}
    gpu = env.get("gpu") or {}
    roof = doc.get("roofline") or {}
    start = roof.get("start") or {}
    prov = doc.get("provider") or {}
    return {"name": gpu.get("name") or env.get("cpu") or "?", "driver": env.get("cuda_driver"),
            "sm_count": gpu.get("sm_count"), "l2_bytes": gpu.get("l2_bytes"), "memory_bytes": gpu.get("memory_bytes"),
            "capability": gpu.get("capability"), "torch": env.get("torch"), "torch_cuda": env.get("torch_cuda"),
            "nvcc": env.get("nvcc"), "roofline_Bps": roof.get("bandwidth_Bps"), "roofline_method": roof.get("method"),
            "roofline_winner": roof.get("winner") or start.get("winner"),
            "roofline_methods": [{"id": m.get("id"), "bandwidth_Bps": m.get("bandwidth_Bps")}
                                 for m in start.get("methods") or []],
            "created": doc.get("created"), "preset": doc.get("preset"), "memory": doc.get("memory"),
            "label": doc.get("label"), "provider": prov.get("name"), "provider_sha256": prov.get("sha256"),
            "harness": (doc.get("harness") or {}).get("version")}


def different_devices(a: dict, b: dict) -> bool:
    return device(a)["name"] != device(b)["name"]


def _side(rec: dict, roof: float | None) -> dict:
    from .run import l2_resident

    p = (rec.get("impls") or {}).get("provider") or {}
    bw = p.get("bandwidth_Bps")
    pct = p.get("pct_roofline")
    if pct is None and bw and roof:
        pct = 100.0 * bw / roof
    return {"time_s": p.get("time_s"), "bandwidth_Bps": bw, "pct_roofline": pct,
            "pct_sector_roofline": p.get("pct_sector_roofline"), "l2_resident": l2_resident(rec),
            "verified": (p.get("verified") or {}).get("ok"), "error": rec.get("error") or p.get("error")}


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def side_by_side(a: dict, b: dict) -> dict:
    """Per case in both runs (A's order): each device's figures and the ratios between them."""
    ra, rb = (a.get("roofline") or {}).get("bandwidth_Bps"), (b.get("roofline") or {}).get("bandwidth_Bps")
    bm = {r["case"]["id"]: r for r in b.get("cases", [])}
    rows = []
    for r in a.get("cases", []):
        c = r["case"]
        if c["id"] not in bm:
            continue
        x, y = _side(r, ra), _side(bm[c["id"]], rb)
        speed = x["time_s"] / y["time_s"] if x["time_s"] and y["time_s"] and x["bandwidth_Bps"] and y["bandwidth_Bps"] \
            else None
        pr = y["pct_roofline"] / x["pct_roofline"] if x["pct_roofline"] and y["pct_roofline"] else None
        rows.append({"id": c["id"], "op": c.get("op"), "layout": c.get("layout"), "dtype": c.get("dtype"),
                     "io": c.get("io_dtype"), "tokens": c.get("tokens"), "rows": c.get("rows"),
                     "bytes_moved": c.get("bytes_moved"), "large": (c.get("bytes_moved") or 0) >= LARGE_BYTES,
                     "a": x, "b": y, "speed_b_over_a": speed, "pct_b_over_a": pr})
    ids_a = {r["case"]["id"] for r in a.get("cases", [])}
    large = [r for r in rows if r["large"] and not r["a"]["l2_resident"] and not r["b"]["l2_resident"]
             and r["speed_b_over_a"]]
    small = [r for r in rows if (r["rows"] or 0) <= 256 and r["speed_b_over_a"]]

    def pcts(rs, side):
        return [r[side]["pct_roofline"] for r in rs if r[side]["pct_roofline"] is not None]

    summary = {
        "cases": len(rows), "compared": sum(1 for r in rows if r["speed_b_over_a"]),
        "roofline_b_over_a": rb / ra if ra and rb else None,
        "speed_b_over_a_median": _median([r["speed_b_over_a"] for r in rows if r["speed_b_over_a"]]),
        "large_cases": len(large),
        "large_speed_b_over_a_median": _median([r["speed_b_over_a"] for r in large]),
        "large_pct_a_median": _median(pcts(large, "a")), "large_pct_b_median": _median(pcts(large, "b")),
        "large_pct_a_min": min(pcts(large, "a"), default=None), "large_pct_b_min": min(pcts(large, "b"), default=None),
        "small_cases": len(small),
        "small_us_a_median": _median([r["a"]["time_s"] * 1e6 for r in small]),
        "small_us_b_median": _median([r["b"]["time_s"] * 1e6 for r in small]),
        "l2_resident_a": sum(1 for r in rows if r["a"]["l2_resident"]),
        "l2_resident_b": sum(1 for r in rows if r["b"]["l2_resident"]),
    }
    da, db = device(a), device(b)
    warnings = []
    for k, what in (("preset", "presets"), ("memory", "memory types"), ("provider_sha256", "providers")):
        if da[k] != db[k]:
            warnings.append(f"the runs differ in {what}: {da[k]} / {db[k]}")
    return {"a": da, "b": db, "rows": rows, "summary": summary, "warnings": warnings,
            "only_a": sorted(ids_a - set(bm)), "only_b": sorted(set(bm) - ids_a)}


def _f(x, spec: str, dash: str = "-") -> str:
    return dash if x is None else format(x, spec)


def text(res: dict) -> str:
    a, b, s = res["a"], res["b"], res["summary"]
    out = []
    for tag, d in (("A", a), ("B", b)):
        out.append(f"{tag}: {d['name']}, driver {d['driver'] or '?'}, {d['sm_count'] or '?'} SMs, L2 "
                   f"{_f((d['l2_bytes'] or 0) / 1e6 or None, '.0f', '?')} MB; roofline "
                   f"{_f((d['roofline_Bps'] or 0) / 1e9 or None, '.0f')} GB/s ({d['roofline_winner'] or d['roofline_method'] or '?'}); "
                   f"{d['preset']} preset, {d['memory']} memory, {d['created']}")
    for w in res["warnings"]:
        out.append(f"warning: {w}")
    out.append(f"{'case':<72} {'A us':>9} {'A %roof':>7} {'B us':>9} {'B %roof':>7} {'B/A speed':>9} {'B/A %':>6}")
    for r in res["rows"]:
        def pct(x):
            return (_f(x["pct_roofline"], ".1f") + ("L" if x["l2_resident"] else " ")) if x["bandwidth_Bps"] else "-"
        out.append(f"{r['id']:<72} {_f(r['a']['time_s'] and r['a']['time_s'] * 1e6, '9.2f'):>9} {pct(r['a']):>7} "
                   f"{_f(r['b']['time_s'] and r['b']['time_s'] * 1e6, '9.2f'):>9} {pct(r['b']):>7} "
                   f"{_f(r['speed_b_over_a'], '.3f'):>9} {_f(r['pct_b_over_a'], '.3f'):>6}")
    out.append("L: the working set fits in that device's L2 (not held to its DRAM roofline)")
    out.append(f"{s['cases']} cases in both runs ({len(res['only_a'])} only in A, {len(res['only_b'])} only in B); "
               f"roofline B/A {_f(s['roofline_b_over_a'], '.3f')}; speed B/A median {_f(s['speed_b_over_a_median'], '.3f')}")
    if s["large_cases"]:
        out.append(f"large cases (>= 256 MB, working set beyond L2 on both): {s['large_cases']}, speed B/A median "
                   f"{_f(s['large_speed_b_over_a_median'], '.3f')}; % of own roofline median A "
                   f"{_f(s['large_pct_a_median'], '.1f')} / B {_f(s['large_pct_b_median'], '.1f')}, lowest A "
                   f"{_f(s['large_pct_a_min'], '.1f')} / B {_f(s['large_pct_b_min'], '.1f')}")
    if s["small_cases"]:
        out.append(f"calls of <= 256 rows: {s['small_cases']}, median A {_f(s['small_us_a_median'], '.2f')} us / "
                   f"B {_f(s['small_us_b_median'], '.2f')} us")
    return "\n".join(out)


def plot(res: dict) -> str | None:
    """% of own roofline on A against B, one point per case beyond the L2 on both (inline PNG)."""
    pts = [r for r in res["rows"] if r["a"]["pct_roofline"] and r["b"]["pct_roofline"]
           and not r["a"]["l2_resident"] and not r["b"]["l2_resident"]]
    if not pts:
        return None
    from .figures import plt as _plt, png as _png

    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.2, 5.6))
    for op, marker in (("write", "o"), ("gather", "s")):
        for large, color in ((True, "#1f77b4"), (False, "#bbbbbb")):
            sel = [r for r in pts if r["op"] == op and r["large"] == large]
            if sel:
                ax.scatter([r["a"]["pct_roofline"] for r in sel], [r["b"]["pct_roofline"] for r in sel], s=14,
                           marker=marker, color=color, label=f"{op}, {'≥' if large else '<'} 256 MB", alpha=0.8)
    hi = max(105.0, max(max(r["a"]["pct_roofline"], r["b"]["pct_roofline"]) for r in pts) + 2)
    ax.plot([0, hi], [0, hi], color="black", lw=1, ls="--", label="same % on both")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel(f"A: % of its copy roofline ({res['a']['name']})")
    ax.set_ylabel(f"B: % of its copy roofline ({res['b']['name']})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return _png(fig)


def render(res: dict, label_a: str | None = None, label_b: str | None = None) -> str:
    from .figures import jinja_env

    env = jinja_env(TEMPLATES)
    return env.get_template("crossdevice.html.j2").render(res=res, a=res["a"], b=res["b"], s=res["summary"],
                                                          label_a=label_a, label_b=label_b, plot=plot(res))
