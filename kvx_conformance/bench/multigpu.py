"""``kvx-conform bench --gpus 0,1,...``: the sweep split over GPUs, one process per GPU.

The preset's cases are dealt to the GPUs by estimated cost (bytes moved plus a fixed
per-case overhead, longest first to the least-loaded GPU: :func:`split`). Each GPU gets
one ``kvx-conform bench`` child process that sees only that GPU
(``CUDA_VISIBLE_DEVICES``), measures its own copy roofline at its start and end, and
times its cases against it. The parent joins the children's results documents
(:func:`join`): every case keeps its figures and names its ``gpu``; ``gpus`` holds each
GPU's roofline, device and case count; the copy roofline every child measures first is
the common probe, and ``gpu_probe.slow`` flags a GPU more than 5 % below the median of
the others (``gpus.slow_gpus``). One report and one results.json come out, as from a
one-GPU run (docs/benchmarks.md, docs/scale.md).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ..abi import gpus as _gpus
from ..results.shards import partition

#: bytes-equivalent of the fixed cost of one case (setup, warm-up, oracle check)
CASE_OVERHEAD_BYTES = 64e6
SLOW_TOLERANCE_PCT = 5.0


def split(cases, gpus: list[int]) -> dict[int, list]:
    """{gpu: its cases, in preset order}: balanced by estimated cost, deterministic."""
    tests = [(c.id, c.id) for c in cases]
    cost = {c.id: float(c.bytes_moved()) + CASE_OVERHEAD_BYTES for c in cases}
    parts = partition(tests, len(gpus), cost)
    out: dict[int, list] = {g: [] for g in gpus}
    for c, p in zip(cases, parts):
        out[gpus[p]].append(c)
    return out


def child_command(args, provider: str, gpu: int, ids_file: Path, out: Path) -> list[str]:
    """The ``kvx-conform bench`` command line of one GPU's child."""
    cmd = [sys.executable, "-m", "kvx_conformance.cli", "bench", provider, "--preset", args.preset,
           "--memory", args.memory_resolved, "--output-dir", str(out), "--case-ids", str(ids_file),
           "--repeats", str(args.repeats), "--rounds", str(args.rounds)]
    if args.reference:
        cmd += ["--reference", args.reference]
    if args.no_peers:
        cmd.append("--no-peers")
    if args.no_verify:
        cmd.append("--no-verify")
    if args.label:
        cmd += ["--label", f"{args.label} (GPU {gpu})"]
    cmd.append("--quiet")
    return cmd


def child_env(gpu: int, visible: list[str], base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    env[_gpus.ENV] = visible[gpu]
    env[_gpus.ENV_GPU] = str(gpu)
    return env


def _probe(doc: dict) -> float | None:
    roof = doc.get("roofline") or {}
    return (roof.get("start") or {}).get("bandwidth_Bps") or roof.get("bandwidth_Bps")


def join(children: dict[int, dict], order: list[str], command: list[str] | None = None,
         errors: dict[int, str] | None = None) -> dict:
    """One results document from the per-GPU documents ``{gpu: doc}``; ``order``: case ids in preset order."""
    from .run import summarize

    errors = errors or {}
    gpus_sorted = sorted(children)
    first = children[gpus_sorted[0]]
    by_id: dict[str, dict] = {}
    for g in gpus_sorted:
        for rec in children[g].get("cases", []):
            rec = dict(rec)
            rec["gpu"] = g
            by_id[rec["case"]["id"]] = rec
    cases = [by_id[i] for i in order if i in by_id]
    figures = {g: _probe(children[g]) for g in gpus_sorted}
    slow = _gpus.slow_gpus(figures, SLOW_TOLERANCE_PCT)
    rooflines = sorted(v for v in ((children[g].get("roofline") or {}).get("bandwidth_Bps") for g in gpus_sorted) if v)
    doc = {k: v for k, v in first.items() if k not in ("cases", "summary", "roofline", "elapsed_s")}
    doc["command"] = command or first.get("command")
    doc["label"] = (first.get("label") or "").removesuffix(f" (GPU {gpus_sorted[0]})") or None
    doc["roofline"] = dict(first.get("roofline") or {})
    if rooflines:
        doc["roofline"]["bandwidth_Bps"] = rooflines[len(rooflines) // 2]
        doc["roofline"]["method"] = ((first.get("roofline") or {}).get("method") or "") + \
            "; median of the GPUs' rooflines (each case's % roofline is against its own GPU's)"
    doc["gpus"] = {str(g): {"roofline": children[g].get("roofline"),
                            "gpu": (children[g].get("environment") or {}).get("gpu"),
                            "cases": len(children[g].get("cases", [])),
                            "elapsed_s": children[g].get("elapsed_s"),
                            "error": errors.get(g)} for g in gpus_sorted}
    doc["gpu_probe"] = {"what": "device-to-device copy bandwidth each GPU's process measures first (its roofline)",
                        "figures_Bps": {str(g): v for g, v in figures.items()},
                        "tolerance_pct": SLOW_TOLERANCE_PCT,
                        "slow": {str(g): v for g, v in slow.items()}}
    doc["cases"] = cases
    doc["elapsed_s"] = max(float(children[g].get("elapsed_s") or 0) for g in gpus_sorted)
    doc["summary"] = summarize(doc)
    return doc


def slow_lines(doc: dict) -> list[str]:
    out = []
    probe = doc.get("gpu_probe") or {}
    for g, v in (probe.get("slow") or {}).items():
        out.append(f"GPU {g} is {v['below_pct']:.1f}% slower than the other GPUs (copy {v['figure'] / 1e9:.0f} GB/s, "
                   f"others' median {v['others_median'] / 1e9:.0f} GB/s; tolerance {probe.get('tolerance_pct')}%): "
                   "check its clocks, power limit, PCIe/NVLink placement or other jobs on it")
    return out


def run_split(args, provider: str, out: Path, cases, gpus: list[int], visible: list[str]) -> tuple[int, dict | None]:
    """Run one child per GPU in parallel, join, write results.json and bench.html. (exit status, doc)."""
    from .report import write_report
    from .run import write_json

    out.mkdir(parents=True, exist_ok=True)
    plan = split(cases, gpus)
    procs: dict[int, tuple[subprocess.Popen, Path, Path]] = {}
    for g in gpus:
        if not plan[g]:
            continue
        d = out / f"gpu{g}"
        d.mkdir(parents=True, exist_ok=True)
        ids = d / "case-ids.json"
        ids.write_text(json.dumps([c.id for c in plan[g]]), encoding="utf-8")
        log = d / "bench.log"
        with open(log, "w", encoding="utf-8") as lf:
            procs[g] = (subprocess.Popen(child_command(args, provider, g, ids, d), env=child_env(g, visible),
                                         stdout=lf, stderr=subprocess.STDOUT), d, log)
        if not args.quiet:
            print(f"GPU {g}: {len(plan[g])} cases -> {d} (log {log})", flush=True)
    children: dict[int, dict] = {}
    errors: dict[int, str] = {}
    worst = 0
    for g, (p, d, log) in procs.items():
        rc = p.wait()
        worst = max(worst, rc)
        try:
            children[g] = json.loads((d / "results.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] if log.exists() else []
            errors[g] = f"exit status {rc}, no results" + (f": {tail[0]}" if tail else "")
            print(f"kvx-conform: GPU {g}: {errors[g]}", file=sys.stderr)
    if not children:
        return (worst or 1), None
    doc = join(children, [c.id for c in cases], command=["kvx-conform", *sys.argv[1:]], errors=errors)
    write_json(doc, out / "results.json")
    write_report(doc, out / "bench.html")
    if not args.quiet:
        for g in sorted(children):
            r = (children[g].get("roofline") or {}).get("bandwidth_Bps")
            print(f"GPU {g}: {len(children[g].get('cases', []))} cases, roofline "
                  + (f"{r / 1e9:.0f} GB/s" if r else "not measured"))
        s = doc["summary"]
        print(f"cases        {s['timed']}/{s['cases']} timed, {len(s['verification_failures'])} failed verification")
        print(f"results      {out / 'results.json'}")
        print(f"report       {out / 'bench.html'}")
    for line in slow_lines(doc):
        print(f"warning: {line}", file=sys.stderr)
    bad = doc["summary"]["errors"] or doc["summary"]["verification_failures"] or errors
    return (1 if bad else 0), doc
