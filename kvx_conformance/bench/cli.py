"""``kvx-conform bench [PROVIDER]``: bandwidth of write/gather against the in-run roofline.

Exit status: 0 every case timed and verified, or refused for an optional feature the
provider does not claim; 1 some case failed (not verified against the oracle, an error,
a claimed or baseline feature refused, nothing timed; with --strict any refusal); 2 usage;
3-8 provider load errors (docs/exit-codes.md); 10 memory type unavailable.
"""
from __future__ import annotations

import argparse
import fnmatch
import sys
import tempfile
from pathlib import Path

from .sweep import PRESETS, preset

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_MEMORY_UNAVAILABLE = 0, 1, 2, 10


def add_arguments(p: argparse.ArgumentParser, *, with_provider: bool = True) -> None:
    if with_provider:
        p.add_argument("provider", nargs="?", help="provider shared library (default: the bundled reference)")
    p.add_argument("--preset", default="quick", choices=PRESETS,
                   help="case set: quick (about a minute on CPU), standard (<= 5 min on an H100), full, "
                        "decode (decode-sized calls, warm graph replay, against an empty kernel's floor)")
    p.add_argument("--memory", default="auto", choices=["host", "device", "unified", "auto"],
                   help="memory type (auto: device where torch sees a GPU and the provider serves device "
                        "memory, a tiny valid validate and write answered OK; else host)")
    p.add_argument("--output-dir", default="kvx-bench", metavar="DIR",
                   help="where results.json and bench.html go (default ./%(default)s)")
    p.add_argument("--reference", metavar="PATH",
                   help="reference provider for the peer column (default: the bundled one)")
    p.add_argument("--no-peers", action="store_true", help="time the provider only (no reference / torch / numpy)")
    p.add_argument("--filter", action="append", default=[], metavar="GLOB",
                   help="only cases whose id matches this glob (repeatable), e.g. 'write-nhd-*'")
    p.add_argument("--repeats", type=int, default=11, metavar="N", help="timed rounds per measurement (device)")
    p.add_argument("--rounds", type=int, default=7, metavar="N", help="pytest-benchmark rounds at most (host)")
    p.add_argument("--label", metavar="TEXT", help="a label for this run (shown in the report)")
    p.add_argument("--no-verify", action="store_true", help="skip the oracle check after timing (not recommended)")
    p.add_argument("--quiet", action="store_true", help="no per-case lines")
    # several GPUs of one host (kvx_conformance/bench/multigpu.py, docs/scale.md)
    p.add_argument("--gpus", metavar="LIST",
                   help="device/unified memory: split the sweep over these GPU indexes (e.g. 0,1 or 0-3 or all), one "
                        "process per GPU, each against its own roofline; flags a GPU > 5%% slower than the others")
    p.add_argument("--case-ids", metavar="FILE", help=argparse.SUPPRESS)  # a --gpus child's share of the cases
    p.add_argument("--claims", metavar="FILE",
                   help="claims file (as for run): a refusal of a claimed optional feature fails the bench")
    p.add_argument("--strict", action="store_true",
                   help="every refused case fails the bench, optional features included")


def select(cases, globs):
    if not globs:
        return cases
    return [c for c in cases if any(fnmatch.fnmatch(c.id, g) or g in c.id for g in globs)]


def resolve_memory(requested: str, provider: str) -> tuple[str | None, str | None]:
    """The memory type to bench on, or why none: the choice of ``kvx-conform run``
    (``served.choose_memory``) from ``served.memory_answer`` on this machine."""
    from ..cases.served import choose_memory

    def answer_of(mem: str) -> str:
        try:
            import torch

            gpu = torch.cuda.is_available()
        except ImportError:
            gpu = False
        if not gpu:
            return "unavailable here: it needs torch with a CUDA GPU"
        from ..abi.header import Memory
        from ..abi.loader import load_provider
        from ..cases.served import memory_answer

        try:
            return memory_answer(load_provider(provider), Memory[mem.upper()])
        except Exception as e:  # noqa: BLE001 - buffers that cannot be made are facts about the machine
            return f"unavailable here: {type(e).__name__}: {e}"

    memory, error, _ = choose_memory(requested, answer_of, "bench")
    return memory, error


def run_bench(args: argparse.Namespace, provider: str, out: Path) -> tuple[int, dict | None]:
    from ..results.claims import InputFileError, load_claims
    from ..abi.loader import ProviderLoadError, load_provider
    from .report import write_report
    from .run import decode_table, results_document, roofline_line, run_device, run_host, write_json

    try:
        claims = load_claims(getattr(args, "claims", None))
    except InputFileError as e:
        print(f"kvx-conform: {e}", file=sys.stderr)
        return EXIT_USAGE, None
    try:
        load_provider(provider)
    except ProviderLoadError as e:
        print(f"kvx-conform: {e}", file=sys.stderr)
        return e.exit_code, None
    memory, err = resolve_memory(args.memory, provider)
    if err:
        print(f"kvx-conform: {err}", file=sys.stderr)
        return EXIT_MEMORY_UNAVAILABLE, None
    reference = None if args.no_peers else (args.reference or _bundled())
    cases = select(preset(args.preset, memory), args.filter)
    if getattr(args, "case_ids", None):
        import json

        wanted = set(json.loads(Path(args.case_ids).read_text(encoding="utf-8")))
        cases = [c for c in cases if c.id in wanted]
    if not cases:
        print("kvx-conform: no case matched --filter", file=sys.stderr)
        return EXIT_USAGE, None
    if getattr(args, "gpus", None) and memory != "host":
        split = _gpu_split(args, memory)
        if isinstance(split, str):
            print(f"kvx-conform: {split}", file=sys.stderr)
            return EXIT_USAGE, None
        if split is not None:
            from .multigpu import run_split

            if not args.quiet:
                print(f"kvx-conform bench: {len(cases)} cases, preset {args.preset}, memory {memory}, provider "
                      f"{provider}, split over GPUs {','.join(map(str, split[0]))}")
            return run_split(args, provider, out, cases, *split)
    if not args.quiet:
        print(f"kvx-conform bench: {len(cases)} cases, preset {args.preset}, memory {memory}, provider {provider}")
    if memory == "host":
        with tempfile.TemporaryDirectory(prefix="kvx-bench-") as tmp:
            body = run_host(provider, cases, reference_path=reference, peers=not args.no_peers, rounds=args.rounds,
                            quiet=args.quiet, workdir=Path(tmp))
    else:
        out.mkdir(parents=True, exist_ok=True)
        partial = out / "results.partial.jsonl"
        partial.unlink(missing_ok=True)
        body = run_device(provider, cases, reference_path=reference, peers=not args.no_peers,
                          repeats=args.repeats, quiet=args.quiet, verify=not args.no_verify, partial=partial)
        partial.unlink(missing_ok=True)
    doc = results_document(preset=args.preset, memory=memory, provider_path=provider, reference_path=reference,
                           body=body, command=["kvx-conform", *sys.argv[1:]], label=args.label,
                           claimed_features=sorted(claims.features))
    out.mkdir(parents=True, exist_ok=True)
    write_json(doc, out / "results.json")
    write_report(doc, out / "bench.html")
    s = doc["summary"]
    if not args.quiet:
        start = doc["roofline"].get("start") or {}
        print(("roofline     " + (roofline_line(start) if start.get("methods") else
                                  f"{doc['roofline']['bandwidth_Bps'] / 1e9:.0f} GB/s ({doc['roofline']['method']})"))
              if doc["roofline"].get("bandwidth_Bps") else "roofline     not measured")
        print(f"cases        {s['timed']}/{s['cases']} timed, {len(s['verification_failures'])} failed verification, "
              f"{len(s['refused'])} refused, {len(s['errors'])} not timed (errors)")
        if s["refused"]:
            print(f"refused      {len(s['refused'])} case(s) for optional features not claimed: "
                  f"{', '.join(s['refused_features'])}{' (--strict: failures)' if args.strict else ''}")
            for x in s["refused"]:
                print(f"  refused    {x['id']}: {x['status']} ({', '.join(x['features'])})")
        for cid in s["errors"]:
            print(f"  not timed  {cid}")
        rows = decode_table(doc)
        if rows:
            fl = s.get("floor_us")
            print("decode-sized calls, per call (" + (f"floor {fl:.3f} us: an empty kernel replayed the same way"
                                                      if fl is not None else "no floor on host memory") + ")")
            print(f"  {'case':<72s} {'us':>8s} {'over floor':>11s}")
            for r in rows:
                us = "-" if r["us"] is None else f"{r['us']:.3f}"
                ex = "-" if r["excess_us"] is None else f"{r['excess_us']:+.3f}"
                flag = "" if r["verified"] else "  NOT VERIFIED" if r["verified"] is False else ""
                print(f"  {r['id']:<72s} {us:>8s} {ex:>11s}{flag}")
        if s.get("large_pct_roofline_median") is not None:
            print(f"large cases  median {s['large_pct_roofline_median']:.1f}% of roofline, "
                  f"min {s['large_pct_roofline_min']:.1f}%")
        if s.get("large_pct_copy_same_bytes_median") is not None:
            print(f"             median {s['large_pct_copy_same_bytes_median']:.1f}% of a copy of each case's own bytes "
                  f"(min {s['large_pct_copy_same_bytes_min']:.1f}%; that copy: median "
                  f"{s['large_copy_same_bytes_pct_roofline_median']:.1f}% of roofline)")
        print(f"results      {out / 'results.json'}")
        print(f"report       {out / 'bench.html'}")
    bad = s["errors"] or s["verification_failures"] or (getattr(args, "strict", False) and s["refused"]) \
        or (s["cases"] and not s["timed"])
    return (EXIT_FAILED if bad else EXIT_OK), doc


def _gpu_split(args: argparse.Namespace, memory: str):
    """(gpus, visible names) for a split run, None to run here (one GPU: GPU 0), or an error line."""
    from ..abi.gpus import GpuSpecError, parse_gpus, visible_devices

    import torch

    count = torch.cuda.device_count()
    try:
        gpus = parse_gpus(args.gpus, count)
    except GpuSpecError as e:
        return str(e)
    if gpus == [0] or not gpus:
        return None
    args.memory_resolved = memory
    return gpus, visible_devices(count)


def _bundled() -> str | None:
    from ..abi.native import default_provider

    return default_provider()


class BenchCommand:
    name = "bench"

    @staticmethod
    def add_parser(sub) -> argparse.ArgumentParser:
        p = sub.add_parser(
            "bench", help="write/gather bandwidth against the in-run copy roofline; HTML report",
            formatter_class=argparse.RawDescriptionHelpFormatter,
            description=(
                "Time kvx_write_kv and kvx_gather_kv over a preset's sweep (tokens, layouts, dtypes, heads,\n"
                "head_dim, block sizes, table formats) on device memory (CUDA events, CUDA-graph replay, host\n"
                "call cost) or host memory (pytest-benchmark), beside the bundled reference and a torch/numpy\n"
                "peer; verify every timed call's memory against the oracle; write results.json and bench.html.\n"
                "A case refused (UNSUPPORTED / INVALID_ARGUMENT) for an optional feature the provider does not\n"
                "claim is listed as refused, not timed and not a failure (--strict: a failure).\n"
                "Exit status: 0 every case timed and verified or refused; 1 a case failed verification, was not\n"
                "timed otherwise, or nothing was timed; 2 usage; 3-8 load errors; 10 memory unavailable.\n"
                "Method and schema: docs/benchmarks.md."),
            epilog=("examples:\n"
                    "  kvx-conform bench --preset quick --memory host --output-dir out\n"
                    "  kvx-conform bench ./libacme_kvx.so --preset standard --memory device --output-dir acme-bench\n"
                    "  kvx-conform bench --preset standard --filter 'write-nhd-*'\n"
                    "  kvx-conform compare base/results.json new/results.json --max-regression 5\n"),
        )
        add_arguments(p)
        return p

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        provider = args.provider or _bundled()
        if provider is None:
            print("kvx-conform: no provider given and the bundled reference is not built", file=sys.stderr)
            return 3
        rc, _ = run_bench(args, provider, Path(args.output_dir))
        return rc


def bench_after_run(run_args: argparse.Namespace, provider: str, memory: str, out: Path) -> int:
    """``kvx-conform run --bench PRESET``: the bench command with its defaults, on the run's provider and memory."""
    p = argparse.ArgumentParser()
    add_arguments(p, with_provider=False)
    args = p.parse_args(["--preset", run_args.bench, "--memory", memory, "--output-dir", str(out)])
    print(f"== bench: preset {run_args.bench}, memory {memory}")
    rc, _ = run_bench(args, provider, out)
    return rc
