"""``kvx-conform compare BASE.json NEW.json``: bandwidth changes between two bench runs; CI gates.

Given two conformance results.json files instead (kind kvx-conform-results), it lists the
tests that changed by id (newly failing, newly passing, flaky, changed, added, removed) and
exits 1 when a test that passed in BASE now fails, crashes, times out or errors, or a
required test that passed does not pass any more (kvx_conformance/results/compare.py).

Cases are matched by id. ``--max-regression PCT`` fails (exit 1) when a case's
bandwidth dropped by more than PCT percent; ``--fail-below PCT`` fails when a case of
NEW reaches less than PCT percent of NEW's in-run roofline (a case whose working set fits
in the L2 is not held to it). ``--min-bytes N`` limits both gates to cases moving at least
N bytes (small calls are launch-bound and noisy).
Two bench runs on different devices (their GPU names differ; ``--side-by-side`` forces it)
are shown side by side per case instead: each device's time and percentage of its own
device's roofline, and the ratio between the devices (kvx_conformance/bench/crossdevice.py);
``--html FILE`` writes that comparison as a self-contained page. The gates still apply.
Exit status: 0 pass, 1 a gate failed, 2 usage, 9 unreadable or invalid results file.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

EXIT_OK, EXIT_GATE, EXIT_USAGE, EXIT_BAD_INPUT = 0, 1, 2, 9
LARGE_BYTES = 256e6


def load(path: str) -> dict:
    from .run import SCHEMA

    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    if not isinstance(doc, dict) or str(doc.get("schema", "")).split("/")[0] != SCHEMA.split("/")[0]:
        raise ValueError(f"{path} is not a kvx-conform bench results file (schema {SCHEMA})")
    return doc


def _bw(r: dict) -> float | None:
    return ((r.get("impls") or {}).get("provider") or {}).get("bandwidth_Bps")


def _pct(r: dict) -> float | None:
    return ((r.get("impls") or {}).get("provider") or {}).get("pct_roofline")


def compare(base: dict, new: dict, *, max_regression: float | None = None, fail_below: float | None = None,
            min_bytes: float = 0.0) -> dict:
    from .run import l2_resident

    b = {r["case"]["id"]: r for r in base.get("cases", [])}
    rows, regressions, below = [], [], []
    for r in new.get("cases", []):
        cid = r["case"]["id"]
        nb = _bw(r)
        gated = r["case"]["bytes_moved"] >= min_bytes
        if fail_below is not None and gated and not l2_resident(r):  # an L2-resident case: not held to DRAM
            pct = _pct(r)
            if nb is None or pct is None or pct < fail_below:
                below.append({"id": cid, "pct_roofline": pct})
        if cid not in b:
            continue
        ob = _bw(b[cid])
        change = 100.0 * (nb - ob) / ob if nb and ob else None
        row = {"id": cid, "base_Bps": ob, "new_Bps": nb, "change_pct": change, "gated": gated}
        rows.append(row)
        lost = nb is None and ob is not None  # timed in the base, not any more (refused, failed or wrong)
        if max_regression is not None and gated and (lost or (change is not None and change < -max_regression)):
            regressions.append(row)
    return {"rows": rows, "regressions": regressions, "below": below,
            "only_base": sorted(set(b) - {r["case"]["id"] for r in new.get("cases", [])}),
            "only_new": sorted({r["case"]["id"] for r in new.get("cases", [])} - set(b))}


def agreement(a: dict, b: dict, min_bytes: float = LARGE_BYTES, tolerance_pct: float = 3.0) -> dict:
    """Run-to-run spread on large cases: |a - b| / mean(a, b) per case, the max, and whether all are within."""
    bm = {r["case"]["id"]: r for r in b.get("cases", [])}
    rows = []
    for r in a.get("cases", []):
        cid = r["case"]["id"]
        if r["case"]["bytes_moved"] < min_bytes or cid not in bm:
            continue
        x, y = _bw(r), _bw(bm[cid])
        if not x or not y:
            continue
        rows.append({"id": cid, "a_Bps": x, "b_Bps": y, "diff_pct": 100.0 * abs(x - y) / ((x + y) / 2)})
    ra, rb = a.get("roofline", {}).get("bandwidth_Bps"), b.get("roofline", {}).get("bandwidth_Bps")
    worst = max((r["diff_pct"] for r in rows), default=None)
    return {"rows": sorted(rows, key=lambda r: -r["diff_pct"]), "max_diff_pct": worst,
            "median_diff_pct": statistics.median(r["diff_pct"] for r in rows) if rows else None,
            "within": bool(rows) and worst <= tolerance_pct, "tolerance_pct": tolerance_pct,
            "min_bytes": min_bytes, "cases": len(rows),
            "roofline_diff_pct": 100.0 * abs(ra - rb) / ((ra + rb) / 2) if ra and rb else None}


class CompareCommand:
    name = "compare"

    @staticmethod
    def add_parser(sub) -> argparse.ArgumentParser:
        p = sub.add_parser(
            "compare", help="bandwidth changes between two bench results.json files, or test changes between "
                            "two conformance results.json files; CI gates",
            formatter_class=argparse.RawDescriptionHelpFormatter,
            description=__doc__.split("\n", 2)[2] if __doc__ else "",
            epilog="examples:\n"
                   "  kvx-conform compare base/results.json new/results.json\n"
                   "  kvx-conform compare base/results.json new/results.json --max-regression 5 --min-bytes 256e6\n"
                   "  kvx-conform compare base/results.json new/results.json --fail-below 90 --min-bytes 256e6\n"
                   "  kvx-conform compare h100/results.json h200/results.json --html devices.html   # two devices\n"
                   "  kvx-conform compare kvx-report-v1/results.json kvx-report/results.json   # conformance\n")
        p.add_argument("base")
        p.add_argument("new")
        p.add_argument("--max-regression", type=float, metavar="PCT",
                       help="fail when a case's bandwidth dropped by more than PCT percent")
        p.add_argument("--fail-below", type=float, metavar="PCT",
                       help="fail when a case of NEW is below PCT percent of its roofline")
        p.add_argument("--min-bytes", type=float, default=0.0, metavar="N",
                       help="gates apply to cases moving at least N bytes (default 0: all)")
        p.add_argument("--agreement", action="store_true",
                       help="also print run-to-run agreement on large cases (>= 256 MB moved)")
        p.add_argument("--side-by-side", action="store_true",
                       help="bench results: show the runs side by side per case, each against its own roofline "
                            "(the default when the two runs' devices differ)")
        p.add_argument("--html", metavar="FILE",
                       help="bench results: write the side-by-side comparison of the two runs as a self-contained page")
        p.add_argument("--json", action="store_true", help="print the comparison as JSON")
        p.add_argument("--fail-on-flaky", action="store_true",
                       help="conformance results: a test that passed in BASE and is flaky in NEW fails the gate")
        return p

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        from ..results.compare import is_conformance_results, main as compare_conformance

        kinds = [is_conformance_results(p) for p in (args.base, args.new)]
        if all(kinds):
            return compare_conformance(args)
        if any(kinds):
            print("kvx-conform: one file is conformance results, the other is not: compare two results.json "
                  "files of the same kind (run / run, or bench / bench)", file=sys.stderr)
            return EXIT_BAD_INPUT
        try:
            base, new = load(args.base), load(args.new)
        except ValueError as e:
            print(f"kvx-conform: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        res = compare(base, new, max_regression=args.max_regression, fail_below=args.fail_below,
                      min_bytes=args.min_bytes)
        if args.agreement:
            res["agreement"] = agreement(base, new)
        from . import crossdevice

        sbs = getattr(args, "side_by_side", False) or crossdevice.different_devices(base, new)
        devices = crossdevice.side_by_side(base, new) if sbs or getattr(args, "html", None) else None
        if getattr(args, "html", None):
            Path(args.html).write_text(crossdevice.render(devices, args.base, args.new), encoding="utf-8")
        if sbs:
            res["devices"] = devices
        if args.json:
            print(json.dumps(res, indent=1))
        elif sbs:
            print(crossdevice.text(devices))
            for r in res["regressions"]:
                ch = "not timed" if r["change_pct"] is None else f"{r['change_pct']:+.1f}%"
                print(f"REGRESSION: {r['id']} ({ch})")
            for r in res["below"]:
                pct = "none" if r["pct_roofline"] is None else f"{r['pct_roofline']:.1f}%"
                print(f"BELOW {args.fail_below:g}% of roofline: {r['id']} ({pct})")
            if args.max_regression is not None or args.fail_below is not None:
                print(f"{len(res['regressions'])} regression(s), {len(res['below'])} case(s) below the floor")
        else:
            print(f"{'case':<72} {'base GB/s':>10} {'new GB/s':>10} {'change':>8}")
            for r in res["rows"]:
                ch = "-" if r["change_pct"] is None else f"{r['change_pct']:+.1f}%"
                flag = "  REGRESSION" if r in res["regressions"] else ""
                print(f"{r['id']:<72} {(r['base_Bps'] or 0) / 1e9:10.1f} {(r['new_Bps'] or 0) / 1e9:10.1f} {ch:>8}{flag}")
            for r in res["below"]:
                pct = "none" if r["pct_roofline"] is None else f"{r['pct_roofline']:.1f}%"
                print(f"BELOW {args.fail_below:g}% of roofline: {r['id']} ({pct})")
            if res["only_base"] or res["only_new"]:
                print(f"unmatched cases: {len(res['only_base'])} only in base, {len(res['only_new'])} only in new")
            if args.agreement:
                a = res["agreement"]
                if a["cases"]:
                    print(f"agreement on {a['cases']} large cases: max {a['max_diff_pct']:.2f}%, median "
                          f"{a['median_diff_pct']:.2f}% ({'within' if a['within'] else 'NOT within'} "
                          f"{a['tolerance_pct']:g}%)")
                else:
                    print("agreement: no large case in both runs")
            print(f"{len(res['regressions'])} regression(s), {len(res['below'])} case(s) below the floor")
        if getattr(args, "html", None):
            print(f"side by side: {args.html}")
        return EXIT_GATE if res["regressions"] or res["below"] else EXIT_OK
