"""The ``kvx-conform`` console script.

Subcommands are registered in :data:`COMMANDS`: name -> ``"module"`` or
``"module:attribute"``, naming an object with ``add_parser(subparsers)`` and
``main(args) -> int``. To add one (``bench``, ``accuracy``, ``model-eval``,
``compare``, ``verify``), add a line there; nothing else changes.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

from . import __version__

COMMANDS: dict[str, str] = {
    "run": "kvx_conformance.harness.runner:RunCommand",
    "list": "kvx_conformance.harness.listing:ListCommand",
    "info": "kvx_conformance.cli:InfoCommand",
    "report": "kvx_conformance.report:ReportCommand",
    "bench": "kvx_conformance.bench.cli:BenchCommand",
    "accuracy": "kvx_conformance.accuracy.cli",
    "model-eval": "kvx_conformance.model.cli:ModelEvalCommand",
    "compare": "kvx_conformance.bench.compare:CompareCommand",
    "verify": "kvx_conformance.harness.verify:VerifyCommand",
    "merge": "kvx_conformance.harness.merge:MergeCommand",
}

EPILOG = """\
examples:
  kvx-conform run ./libacme_kvx.so --claims claims.yaml     certify a provider
  kvx-conform run --quick                                   quick check of the bundled reference
  kvx-conform info ./libacme_kvx.so                         version, entry points, struct sizes
  kvx-conform list --profile core                           the tests, their clauses and levels
  kvx-conform report kvx-report/results.json -o r.html      re-render a report
  kvx-conform verify kvx-report/certificate.json            check a certificate against provider and suites
  kvx-conform run ./libacme_kvx.so --shard 2/3 --output-dir p2   one of three CI machines
  kvx-conform merge p1 p2 p3 --output-dir kvx-report        join the shards into one certificate
  kvx-conform bench ./libacme_kvx.so --preset standard      bandwidth against the copy roofline (GPU)
  kvx-conform compare base.json new.json --max-regression 5 CI gate on bandwidth
  kvx-conform accuracy ./libacme_kvx.so --json              FP4 / FP8 / INT KV-cache accuracy
  kvx-conform model-eval ./libacme_kvx.so                   SmolLM2-135M perplexity through the paged cache

`kvx-conform COMMAND --help` explains each command. Exit codes: docs/exit-codes.md.
"""


def resolve(spec: str):
    module, _, attr = spec.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


class InfoCommand:
    """``kvx-conform info PROVIDER``: what a provider is, without running tests."""

    @staticmethod
    def add_parser(sub) -> argparse.ArgumentParser:
        p = sub.add_parser(
            "info", help="describe a provider: version, entry points, struct sizes, memory types",
            formatter_class=argparse.RawDescriptionHelpFormatter,
            description="Load PROVIDER in a subprocess and print its ABI version, its KVX entry points, the "
                        "smallest struct `size` each entry point accepts (found by probing) beside the v1.1 "
                        "header's sizeof, and which memory types it serves here.",
            epilog="examples:\n"
                   "  kvx-conform info ./libacme_kvx.so\n"
                   "  kvx-conform info ./libacme_kvx.so --json\n",
        )
        p.add_argument("provider", nargs="?", help="provider shared library (default: the bundled reference)")
        p.add_argument("--json", action="store_true", help="print JSON")
        p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="give up after S seconds")
        return p

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        from .abi.loader import EXIT_NOT_FOUND, ProviderLoadError
        from .harness.preflight import format_info, run_preflight
        from .abi.native import default_provider

        provider = args.provider or default_provider()
        if provider is None:
            print("kvx-conform: no provider given and the bundled reference is not built", file=sys.stderr)
            return EXIT_NOT_FOUND
        try:
            info = run_preflight(provider, timeout=args.timeout, memory_check=True)
        except ProviderLoadError as e:
            print(f"kvx-conform: {e}", file=sys.stderr)
            return e.exit_code
        if args.json:
            print(json.dumps({**info.to_dict(), "size_findings": info.size_findings()}, indent=1))
        else:
            print("\n".join(format_info(info)))
            for finding in info.size_findings():
                print(f"finding: {finding}")
        return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvx-conform",
        description="Conformance and benchmark suite for KVX paged KV-cache providers (KVX ABI v1.1, and the v1.2 FP4 extension).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kvx-conform {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, spec in COMMANDS.items():
        cmd = resolve(spec)
        sp = cmd.add_parser(sub)
        sp.set_defaults(_command=cmd)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_command", None) is None:
        parser.print_help()
        return 2
    return int(args._command.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
