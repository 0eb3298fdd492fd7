"""The HTML conformance report: one self-contained file (CSS and script inline, no network).

``render_report(results) -> str`` builds it from a results.json document with the
jinja2 templates in ``templates/``; ``kvx-conform report results.json -o report.html``
re-renders it from a saved run.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from ..abi.buffers import LATER_TEST
from ..results.outcomes import PROFILES
from ..results.claims import OPT_IN_PROFILES
from ..results.record import bundled_suite

TEMPLATES = Path(__file__).with_name("templates")
OUTCOME_ORDER = ("pass", "fail", "unsupported", "skip", "crash", "timeout", "error", "flaky")
BAD = ("fail", "crash", "timeout", "error", "flaky")

#: Spec sections 3-10 (seed 000), the rows of the coverage matrix.
SPEC_CLAUSES: list[tuple[str, str]] = [
    ("3", "Versioning and negotiation"),
    ("4", "Memory model"),
    ("4.1", "Paged KV layout"),
    ("4.2", "Layout enum and strides"),
    ("4.3", "Dtypes and memory"),
    ("4.4", "Alignment"),
    ("5", "Page table and slot mapping"),
    ("5.1", "Block table formats"),
    ("5.2", "Slot mapping"),
    ("5.3", "Sequence lengths"),
    ("6", "Metadata (size fields)"),
    ("6.1", "Cache descriptor"),
    ("6.2", "Tensor descriptor"),
    ("6.3", "Block table"),
    ("6.4", "Slot mapping struct"),
    ("6.5", "Sequence lengths struct"),
    ("6.6", "Scale descriptor"),
    ("6.7", "Pool descriptor"),
    ("6.8", "IO descriptor"),
    ("6.9", "Write descriptor"),
    ("6.10", "Gather descriptor"),
    ("7", "API semantics"),
    ("7.1", "Validation rules"),
    ("7.2", "Thread safety and lifetime"),
    ("8", "Error codes"),
    ("9", "Conformance tests (minimum set)"),
    ("10", "Optional features"),
]
_CLAUSE_KEYS = {k for k, _ in SPEC_CLAUSES}
_CLAUSE_TOKEN = re.compile(r"(?<![\w.-])(\d+(?:\.\d+)*)(?![\w-])")


def clause_rows(clause: str) -> list[str]:
    """The matrix rows a clause string names ("7.1, 5.2" -> ["7.1", "5.2"]; "4.2.1" -> ["4.2"])."""
    rows: list[str] = []
    for tok in _CLAUSE_TOKEN.findall(clause or ""):
        parts = tok.split(".")
        while parts and ".".join(parts) not in _CLAUSE_KEYS:
            parts.pop()
        key = ".".join(parts)
        if key and key not in rows:
            rows.append(key)
    return rows


def _first_line(text: str | None) -> str:
    t = (text or "").strip()
    return t.splitlines()[0] if t else ""


def _short(sha: str | None, n: int = 16) -> str:
    return (sha or "")[:n]


def view_model(results: dict) -> dict:
    tests = results.get("tests", [])
    counts = {o: int((results.get("counts") or {}).get(o, 0)) for o in OUTCOME_ORDER}
    total = sum(counts.values())
    bar = [{"outcome": o, "n": counts[o], "pct": (100.0 * counts[o] / total) if total else 0.0}
           for o in OUTCOME_ORDER if counts[o]]

    matrix = []
    uncovered = []
    for key, title in SPEC_CLAUSES:
        row = {o: 0 for o in OUTCOME_ORDER}
        for t in tests:
            if key in clause_rows(t.get("clause", "")):
                row[t["outcome"]] = row.get(t["outcome"], 0) + 1
        n = sum(row.values())
        if n == 0:
            uncovered.append(key)
        matrix.append({"key": key, "title": title, "sub": "." in key, "counts": row, "total": n,
                       "bad": sum(row[o] for o in BAD)})
    other = [t for t in tests if not clause_rows(t.get("clause", ""))]

    level_rank = {"required": 0, "recommended": 1, "informational": 2}
    problems = sorted(
        (t for t in tests if t["outcome"] in BAD or (t["outcome"] == "skip" and t.get("breaker"))),
        key=lambda t: (level_rank.get(t.get("level"), 3), t.get("profile", ""), t["id"]),
    )
    failures = []
    for t in problems:
        f = t.get("failure") or {}
        failures.append({
            **t,
            "headline": f.get("what") or _first_line(t.get("message")) or t["outcome"],
            "expected": f.get("expected"), "got": f.get("got"),
            "case": f.get("case"), "fclause": f.get("clause") or t.get("clause"),
        })
    breaker = [{"entry": e, **b} for e, b in (results.get("breaker") or {}).items()]
    crashes = [t for t in tests if t["outcome"] in ("crash", "timeout")]
    flaky = [{**t, "tally_text": ", ".join(f"{n} {o}" for o, n in (t.get("tally") or {}).items())}
             for t in tests if t["outcome"] == "flaky"]
    reruns = sum(1 for t in tests if t.get("attempts"))
    prov = results.get("provider") or {}
    sizes = []
    probed = (prov.get("struct_sizes") or {})
    for entry, res in probed.items():
        for row in res.get("fields", []):
            got, hdr = row.get("accepts_from"), row.get("header")
            status = "not probed" if got is None else ("ok" if got == hdr else ("accepts smaller" if got < hdr else "needs larger"))
            sizes.append({"entry": entry, **row, "status": status, "baseline": res.get("baseline")})
    profiles = []
    for name, p in (results.get("profiles") or {}).items():
        profiles.append({"name": name, **p, "description": p.get("description") or PROFILES.get(name, "")})
    engines = _engines(results, tests)
    claimed = (results.get("claims") or {}).get("profiles", [])
    verdict = results.get("verdict") or "unknown"
    banner = "ok" if verdict == "certified" else ("warn" if verdict.startswith("not certifying") else "bad")
    if not results.get("complete"):
        banner = "warn" if banner == "ok" else banner
    from ..results.certificate import coverage

    return {
        "r": results,
        "coverage": coverage(results),
        "verdict": verdict,
        "banner": banner,
        "certifying": results.get("certifying", False),
        "quick": bool(results.get("quick")),
        "bundled_suite": bundled_suite(results),
        "complete": bool(results.get("complete")),
        "counts": counts,
        "total": total,
        "bar": bar,
        "outcomes": OUTCOME_ORDER,
        "matrix": matrix,
        "uncovered": uncovered,
        "other_clause_tests": len(other),
        "failures": failures,
        "breaker": breaker,
        "crashes": crashes,
        "flaky": flaky,
        "reruns": reruns,
        # writes after return (findings "later-test" are listed in results.json, charged to no test)
        "late_writes": [w for w in results.get("late_writes") or [] if w.get("where") != LATER_TEST],
        "device_faults": [t for t in crashes if (t.get("crash") or {}).get("kind") == "device-fault"],
        "waivers": results.get("waivers") or [],
        "warnings": results.get("warnings") or [],
        "profiles": profiles,
        "engines": engines,
        "claimed": claimed,
        "claims_explicit": bool((results.get("claims") or {}).get("explicit")),
        "not_claimed": results.get("not_claimed") or [],
        # each profile's own verdict: a profile not claimed (an opt-in one) is reported with it
        "profile_verdicts": {p["name"]: p.get("verdict", "?") for p in profiles},
        "opted_in": [p for p in claimed if p in OPT_IN_PROFILES],
        "not_served": results.get("not_served") or [],
        "provider": prov,
        "provider_name": os.path.basename(prov.get("path") or "") or "provider",
        "sha_short": _short(prov.get("sha256")),
        "sizes": sizes,
        "env": results.get("environment") or {},
        "config": results.get("config") or {},
        "tests": sorted(tests, key=lambda t: (t.get("profile", ""), t["id"])),
        "first_line": _first_line,
        "accuracy": _accuracy(results),
        "model_eval": _model_eval(results),
        "markup": _markup,
    }


def _accuracy(results: dict):
    """The accuracy section (``kvx-conform accuracy --add-to results.json``), or None."""
    from .accuracy import section_view

    return section_view(results.get("accuracy"))


def _model_eval(results: dict):
    """The model-evaluation section (``kvx-conform model-eval --add-to results.json``), or None."""
    from .model_eval import section_view

    return section_view(results.get("model_eval"))


def _markup(s: str):
    import markupsafe

    return markupsafe.Markup(s)


def _engines(results: dict, tests: list[dict]) -> list[dict]:
    """Rows of the "Engines" section: results.json's ``engines`` (recomputed from the
    tests for a results file written before the key existed)."""
    from ..results.engines import summarize_engines

    summary = results.get("engines")
    if summary is None:
        summary = summarize_engines(tests)
    return [{"key": k, **v} for k, v in summary.items()]


def render_report(results: dict) -> str:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env.get_template("report.html.j2").render(**view_model(results))


def write_report(results: dict, path: str | os.PathLike) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(render_report(results), encoding="utf-8")
    os.replace(tmp, p)
    return p


class ReportCommand:
    """``kvx-conform report``: re-render the HTML report of a saved run."""

    name = "report"

    @staticmethod
    def add_parser(sub) -> argparse.ArgumentParser:
        p = sub.add_parser(
            "report", help="re-render the HTML report from a results.json",
            description="Render the self-contained HTML conformance report (no network access needed to view it) "
                        "from a results.json written by `kvx-conform run`.",
            epilog="examples:\n"
                   "  kvx-conform report kvx-report/results.json\n"
                   "  kvx-conform report run1/results.json -o /tmp/acme-report.html\n",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("results", help="results.json of a run")
        p.add_argument("-o", "--output", help="HTML file to write (default: report.html beside results.json)")
        return p

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        from ..abi.loader import EXIT_BAD_INPUT_FILE
        from ..results.record import load_results

        try:
            doc = load_results(args.results)
        except ValueError as e:
            print(f"kvx-conform: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT_FILE
        out = Path(args.output) if args.output else Path(args.results).with_name("report.html")
        write_report(doc, out)
        print(f"report: {out}")
        return 0
