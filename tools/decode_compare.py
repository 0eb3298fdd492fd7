"""Side by side: the decode preset's per-call times and excess over the floor of several bench runs.

``python tools/decode_compare.py NAME=results.json [NAME=results.json ...]`` prints one row per
case (µs per call, and in brackets the excess over that run's floor) and each run's floor; the
runs must come from ``kvx-conform bench --preset decode --memory device`` (docs/benchmarks.md).
"""
from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    runs = []
    for a in argv:
        name, _, path = a.partition("=")
        with open(path, encoding="utf-8") as f:
            runs.append((name, json.load(f)))
    floors = [((d.get("floor") or {}).get("time_s") or 0) * 1e6 for _, d in runs]
    print("floor (us): " + "  ".join(f"{n} {f:.3f}" for (n, _), f in zip(runs, floors)))
    ids = [r["case"]["id"] for r in runs[0][1]["cases"]]
    per = [{r["case"]["id"]: r for r in d["cases"]} for _, d in runs]
    print(f"{'case':<66s}" + "".join(f"{n:>18s}" for n, _ in runs))
    for cid in ids:
        cells = []
        for m in per:
            p = (m.get(cid) or {}).get("impls", {}).get("provider", {})
            t, x = p.get("time_s"), p.get("excess_over_floor_s")
            ok = (p.get("verified") or {}).get("ok")
            cells.append("-" if t is None else f"{t * 1e6:7.3f} ({x * 1e6:+.2f}){'' if ok else '!'}")
        short = cid.replace("-h8-d128-bs16", "").replace("-nb8192-warm50-device", "")
        print(f"{short:<66s}" + "".join(f"{c:>18s}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
