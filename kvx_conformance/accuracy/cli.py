"""``kvx-conform accuracy [PROVIDER] [--json]``: the KV-cache accuracy benchmark.

Without PROVIDER every method is measured through the numpy oracle. With one, the FP4
methods it stores (KVX 1.2 FP4 extension: NVFP4, MXFP4-16, OCP MXFP4-32) are measured
through it (write quantizes, gather dequantizes) and every other method through the
oracle; the ``path`` column says which. On device or unified memory each provider round
trip runs in its own process: one whose call leaves a device fault (or crashes) is
recorded in its row, without figures, and the others are measured (docs/device-faults.md).

Exit status: 0 every row was measured; 1 the provider failed an FP4 round trip (an
error status), or a row has no figures because its provider call left a device fault
or crashed; 9 the --add-to file cannot be read; 10 the memory type cannot be used here.
"""
from __future__ import annotations

import argparse
import json
import sys

EPILOG = """\
examples:
  kvx-conform accuracy                              oracle figures, text tables
  kvx-conform accuracy ./libacme_kvx.so --json      FP4 through the provider, one JSON row per (method, distribution)
  kvx-conform accuracy --quick --html acc.html      a small run as an HTML page (tables and plots)
  kvx-conform accuracy --add-to kvx-report/results.json   add the section to a run's report

exit status: 0 every row measured; 1 a provider round trip failed, faulted the device or crashed
(that row is recorded without figures, the rest are measured); 9 --add-to file unreadable; 10 memory
type unavailable.
"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "accuracy", help="KV-cache accuracy benchmark (FP4 vs BF16/FP8/INT8/INT4) through a provider or the oracle",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=__doc__.split("\n\n", 1)[1], epilog=EPILOG)
    p.add_argument("provider", nargs="?", help="provider shared library (default: none, the numpy oracle)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON (method, distribution, rel_rmse, "
                                                       "snr_db, cosine, ...)")
    p.add_argument("--quick", action="store_true", help="1024 tokens instead of 8192")
    p.add_argument("--memory", choices=("host", "device", "unified"), default="host",
                   help="memory type of the provider's buffers (default host)")
    p.add_argument("--html", metavar="FILE", help="also write the accuracy section as an HTML page")
    p.add_argument("--add-to", metavar="RESULTS_JSON",
                   help="store the rows under 'accuracy' in a run's results.json and re-render its report.html")
    return p


def main(args: argparse.Namespace) -> int:
    from ..abi.header import Memory
    from ..abi.loader import ProviderLoadError, load_provider
    from . import ProviderAccuracyError, format_table, run_accuracy

    provider = None
    if args.provider:
        try:
            provider = load_provider(args.provider)
        except ProviderLoadError as e:
            print(f"kvx-conform: {e}", file=sys.stderr)
            return e.exit_code
    memory = Memory[args.memory.upper()]
    if memory != Memory.HOST:
        from ..abi.buffers import memory_available
        from ..abi.loader import EXIT_MEMORY_UNAVAILABLE

        reason = memory_available(memory)
        if reason:
            print(f"kvx-conform: memory type {args.memory} is not available here: {reason}", file=sys.stderr)
            return EXIT_MEMORY_UNAVAILABLE
    try:
        rows = run_accuracy(provider, quick=args.quick, memory=memory)
    except ProviderAccuracyError as e:
        print(f"kvx-conform: the provider failed an FP4 round trip: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(format_table(rows))
    if args.html:
        from .report import standalone_html

        with open(args.html, "w", encoding="utf-8") as f:
            f.write(standalone_html(rows))
    if args.add_to:
        from pathlib import Path

        from ..report import write_report

        path = Path(args.add_to)
        try:
            results = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            from ..abi.loader import EXIT_BAD_INPUT_FILE

            print(f"kvx-conform: cannot read {path}: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT_FILE
        results["accuracy"] = rows
        path.write_text(json.dumps(results, indent=1), encoding="utf-8")
        write_report(results, path.with_name("report.html"))
    failed = [r for r in rows if r.get("error")]
    if failed:
        print(f"kvx-conform: {len(failed)} accuracy row(s) without figures: "
              + "; ".join(f"{r['method']} on {r['distribution']}: {r['error']}" for r in failed[:3])
              + ("; ..." if len(failed) > 3 else ""), file=sys.stderr)
        return 1
    return 0
