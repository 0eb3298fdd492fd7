"""``kvx-conform merge DIR... [--output-dir OUT]``: join shard runs into one certification.

Each DIR is the ``--output-dir`` of one ``kvx-conform run --shard K/N`` (or its
results.json). The parts are joined only when they describe one run split in N:

- the same provider (sha256), harness version, suites hash and settings (memory,
  quick, claims, expectations, seed, timeout, selection options, hypothesis budget,
  breaker threshold, suite): :data:`SAME`;
- the same split: N, the full selection's size and hash, the durations file's hash;
- every part complete, each K once, and their tests together exactly the selection
  (no test twice, none missing).

Anything else is refused with one line on stderr and exit status 14
(``EXIT_MERGE_REFUSED``, docs/exit-codes.md). The merged results.json is summarized by
the same code as a full run (``results.summarize``), then the certificate, JUnit XML
and report are written by the run's own writers, so ``kvx-conform verify`` checks the
merged certificate like any other. Exit status otherwise as ``run``: 0 certified, 1 not.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..abi.loader import EXIT_BAD_INPUT_FILE, EXIT_CERTIFIED, EXIT_MERGE_REFUSED, EXIT_NOT_CERTIFIED, EXIT_USAGE
from ..results.claims import Claims, Waiver
from ..results.record import (RUN_WIDE_PREFIX, SCHEMA_VERSION, KIND, TestRecord, _atomic_write_json, bundled_suite,
                              load_results, now_iso, summarize)
from ..results.shards import selection_hash

#: (label, getter) of what every part must share
SAME = [
    ("provider (sha256)", lambda d: (d.get("provider") or {}).get("sha256")),
    ("harness version", lambda d: (d.get("harness") or {}).get("version")),
    ("suites hash", lambda d: (d.get("config") or {}).get("suites_hash")),
    ("suite", lambda d: (d.get("config") or {}).get("suite")),
    ("memory", lambda d: (d.get("config") or {}).get("memory")),
    ("quick", lambda d: bool(d.get("quick"))),
    ("claims", lambda d: json.dumps({k: v for k, v in (d.get("claims") or {}).items() if k != "source"},
                                    sort_keys=True)),
    ("expectations (waivers)", lambda d: json.dumps(sorted((w.get("id"), w.get("reason"))
                                                           for w in d.get("waivers") or []))),
    ("seed", lambda d: (d.get("config") or {}).get("seed")),
    ("timeout", lambda d: (d.get("config") or {}).get("timeout_s")),
    ("selection (-k)", lambda d: (d.get("config") or {}).get("keyword")),
    ("selection (--id)", lambda d: sorted((d.get("config") or {}).get("ids") or [])),
    ("selection (--profile)", lambda d: sorted((d.get("config") or {}).get("profiles") or [])),
    ("hypothesis examples", lambda d: (d.get("config") or {}).get("hypothesis_max_examples")),
    ("breaker threshold", lambda d: (d.get("config") or {}).get("breaker_threshold")),
    ("shard count", lambda d: (d.get("shard") or {}).get("count")),
    ("full selection", lambda d: json.dumps((d.get("shard") or {}).get("selection"), sort_keys=True)),
    ("durations file", lambda d: ((d.get("shard") or {}).get("durations_from") or {}).get("sha256")),
]


class MergeRefused(Exception):
    """The parts cannot be joined; ``str(e)`` is one line."""


def _results_path(p: str) -> Path:
    path = Path(p)
    return path / "results.json" if path.is_dir() else path


def load_parts(paths: list[str]) -> list[tuple[str, dict]]:
    """(label, results document) per part; ValueError (one line) for an unreadable one."""
    return [(str(_results_path(p)), load_results(_results_path(p))) for p in paths]


def check_parts(parts: list[tuple[str, dict]]) -> None:
    """Raise MergeRefused with one line when the parts are not one run split in N."""
    if not parts:
        raise MergeRefused("no part given")
    for where, d in parts:
        if not d.get("shard"):
            raise MergeRefused(f"{where} is not a shard run (run it with --shard K/N)")
        if not d.get("complete"):
            raise MergeRefused(f"{where} (shard {d['shard'].get('index')}/{d['shard'].get('count')}) did not "
                               "finish (complete: false): run that shard again")
    first_where, first = parts[0]
    for label, get in SAME:
        want = get(first)
        for where, d in parts[1:]:
            got = get(d)
            if got != want:
                show = lambda v: (str(v)[:16] + "...") if isinstance(v, str) and len(v) > 40 else v  # noqa: E731
                raise MergeRefused(f"parts differ in {label}: {show(want)} in {first_where}, {show(got)} in {where}")
    n = first["shard"]["count"]
    seen: dict[int, str] = {}
    for where, d in parts:
        k = d["shard"]["index"]
        if k in seen:
            raise MergeRefused(f"shard {k}/{n} given twice: {seen[k]} and {where}")
        seen[k] = where
    missing = [k for k in range(1, n + 1) if k not in seen]
    if missing:
        raise MergeRefused(f"shard{'s' if len(missing) > 1 else ''} {', '.join(f'{k}/{n}' for k in missing)} "
                           f"missing: {len(missing)} of {n} parts not given, their tests would be left out")
    owner: dict[str, str] = {}
    for where, d in parts:
        for t in d.get("tests", []):
            if t["nodeid"].startswith(RUN_WIDE_PREFIX):
                continue  # a part's own run-wide record (each part may hold one): joined below
            if t["nodeid"] in owner:
                raise MergeRefused(f"test {t['id']} is in two parts ({owner[t['nodeid']]} and {where}): the parts "
                                   "overlap")
            owner[t["nodeid"]] = where
    sel = first["shard"]["selection"]
    if len(owner) != sel["tests"] or selection_hash(owner) != sel["sha256"]:
        raise MergeRefused(f"the parts hold {len(owner)} tests, the selection they were cut from has "
                           f"{sel['tests']} (different test ids): tests would be left out")


def merge_documents(parts: list[tuple[str, dict]]) -> dict:
    """One results document from checked parts, summarized as a full run would be."""
    parts = sorted(parts, key=lambda p: p[1]["shard"]["index"])
    first = parts[0][1]
    tests, run_wide = [], set()
    for _, d in parts:
        for t in d.get("tests", []):
            if t["nodeid"].startswith(RUN_WIDE_PREFIX):
                if t["nodeid"] in run_wide:
                    continue  # the first part's finding stands for the run
                run_wide.add(t["nodeid"])
            tests.append(TestRecord.from_dict(t))
    claims = Claims.from_dict(first.get("claims"))
    waivers = [Waiver(w["id"], w.get("reason", "")) for w in first.get("waivers") or []]
    cfg = dict(first.get("config") or {})
    partial = bool(cfg.get("keyword") or cfg.get("ids")) or not bundled_suite(first)
    summary = summarize(tests, claims, waivers, quick=bool(first.get("quick")), partial=partial, complete=True)
    breaker: dict = {}
    for _, d in parts:
        for e, b in (d.get("breaker") or {}).items():
            m = breaker.setdefault(e, {"tripped": False, "count": 0, "tests": [], "message": ""})
            m["tripped"] = m["tripped"] or bool(b.get("tripped"))
            m["count"] += int(b.get("count") or 0)
            m["tests"] += list(b.get("tests") or [])
            m["message"] = m["message"] or b.get("message", "")
    cfg.update(shard=None, durations_from=None,
               workers=sum(int((d.get("config") or {}).get("workers") or 0) for _, d in parts))
    header = {k: v for k, v in first.items() if k in ("harness", "command", "provider", "environment", "memory_types")}
    header["command"] = ["kvx-conform", "merge", *[w for w, _ in parts]]
    doc = {
        "schema_version": SCHEMA_VERSION, "kind": KIND, **header, "config": cfg,
        "complete": True,
        "started": min(d.get("started") or "" for _, d in parts),
        "updated": now_iso(),
        "duration_s": max(float(d.get("duration_s") or 0) for _, d in parts),
        "quick": bool(first.get("quick")),
        "claims": claims.to_dict() if not first.get("claims") else first["claims"],
        "total": sum(int(d.get("total") or 0) for _, d in parts),
        "finished": len(tests),
        **summary,
        "breaker": breaker,
        "collection_errors": [e for _, d in parts for e in d.get("collection_errors") or []],
        "merged_from": [{"path": w, "shard": d["shard"]["index"], "tests": len(d.get("tests", [])),
                         "duration_s": d.get("duration_s"), "verdict": d.get("verdict"),
                         "environment": d.get("environment"), "gpus": (d.get("config") or {}).get("gpus")}
                        for w, d in parts],
        "tests": [t.to_dict() for t in tests],
    }
    return doc


class MergeCommand:
    name = "merge"

    @staticmethod
    def add_parser(sub) -> argparse.ArgumentParser:
        p = sub.add_parser(
            "merge", help="join shard runs (run --shard K/N) into one results.json, certificate, JUnit and report",
            formatter_class=argparse.RawDescriptionHelpFormatter,
            description=__doc__.split("\n", 2)[2] if __doc__ else "",
            epilog="examples:\n"
                   "  kvx-conform run ./libacme_kvx.so --shard 1/3 --output-dir part1   # one per CI machine\n"
                   "  kvx-conform merge part1 part2 part3 --output-dir kvx-report\n"
                   "  kvx-conform verify kvx-report/certificate.json\n")
        p.add_argument("parts", nargs="+", metavar="DIR", help="output directory (or results.json) of each shard")
        p.add_argument("--output-dir", default="kvx-report", metavar="DIR",
                       help="where the merged results, certificate, JUnit XML and report go (default ./%(default)s)")
        p.add_argument("--junit-xml", metavar="PATH", help="JUnit XML file (default DIR/junit.xml)")
        return p

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        return merge(args.parts, Path(args.output_dir), junit=args.junit_xml)


def merge(paths: list[str], out: Path, junit: str | None = None) -> int:
    from ..results.certificate import write_certificate
    from ..report import write_report
    from ..report.junit import write_junit
    from .runner import summary_lines

    try:
        parts = load_parts(paths)
    except ValueError as e:
        print(f"kvx-conform: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT_FILE
    try:
        check_parts(parts)
    except MergeRefused as e:
        print(f"kvx-conform: merge refused: {e}", file=sys.stderr)
        return EXIT_MERGE_REFUSED
    out = out.resolve()
    inputs = {Path(w).resolve().parent for w, _ in parts}
    if out in inputs:
        print(f"kvx-conform: --output-dir {out} is one of the parts: choose another directory", file=sys.stderr)
        return EXIT_USAGE
    doc = merge_documents(parts)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"kvx-conform: cannot use output directory {out}: {e}", file=sys.stderr)
        return EXIT_USAGE
    _atomic_write_json(out / "results.json", doc)
    with open(out / "results.jsonl", "w", encoding="utf-8") as f:
        for t in doc["tests"]:
            f.write(json.dumps(t) + "\n")
    write_certificate(doc, out / "certificate.json")
    junit_path = Path(junit) if junit else out / "junit.xml"
    write_junit(doc, junit_path)
    write_report(doc, out / "report.html")
    print(f"kvx-conform merge: {len(parts)} shards, {len(doc['tests'])} tests")
    for line in summary_lines(doc):
        print(line)
    print(f"results      {out / 'results.json'}")
    print(f"certificate  {out / 'certificate.json'}")
    print(f"junit        {junit_path}")
    print(f"report       {out / 'report.html'}")
    return EXIT_CERTIFIED if doc.get("claimed_profiles_certified") else EXIT_NOT_CERTIFIED
