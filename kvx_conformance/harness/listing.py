"""``kvx-conform list``.

Collect the suites through the plugin (no provider needed) and print every test's stable id, clause,
level and profile.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
from pathlib import Path

from ..abi.loader import EXIT_HARNESS_ERROR, EXIT_NO_TESTS
from ..results.outcomes import PROFILES
from .runner import DEFAULT_SUITE, PYTEST_INI, _err, _suite_args


class ListCommand:
    name = "list"

    @staticmethod
    def add_parser(sub) -> argparse.ArgumentParser:
        p = sub.add_parser(
            "list", help="list the conformance tests: ids, clauses, levels, profiles",
            formatter_class=argparse.RawDescriptionHelpFormatter,
            description="Collect the suites (no provider is loaded) and print every test's stable id, "
                        "spec clause, level (required / recommended / informational), profile, entry points "
                        "and optional feature.",
            epilog="examples:\n"
                   "  kvx-conform list\n"
                   "  kvx-conform list --profile core --profile tables\n"
                   "  kvx-conform list --memory device\n"
                   "  kvx-conform list --json > tests.json\n",
        )
        p.add_argument("--profile", action="append", default=[], choices=list(PROFILES), metavar="P",
                       help="only this profile (repeatable)")
        p.add_argument("-k", dest="keyword", metavar="EXPR", help="only tests matching this pytest -k expression")
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        p.add_argument("--suite", default=DEFAULT_SUITE, metavar="SUITE", help="suite package or directory")
        p.add_argument("--memory", default="host", choices=["host", "device", "unified"],
                       help="list the tests a run on this memory type collects (default %(default)s; e.g. the "
                            "stream and device-placement tests are collected on device runs only)")
        return p

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        try:
            doc = collect(args.suite, profiles=args.profile, keyword=args.keyword, memory=args.memory)
        except RuntimeError as e:
            _err(str(e))
            return EXIT_HARNESS_ERROR
        tests = doc["tests"]
        if args.json:
            print(json.dumps(doc, indent=1))
            return 0 if tests else EXIT_NO_TESTS
        if not tests:
            _err("no test matched")
            return EXIT_NO_TESTS
        w_id = min(70, max(len(t["id"]) for t in tests))
        w_cl = min(24, max(6, max(len(t["clause"]) for t in tests)))
        print(f"{'ID':<{w_id}}  {'CLAUSE':<{w_cl}}  {'LEVEL':<13} {'PROFILE':<12} {'ENTRY':<24} FEATURE")
        for t in tests:
            entry = ",".join(e.removeprefix("kvx_") for e in t["entry"]) or "-"
            print(f"{t['id']:<{w_id}}  {t['clause']:<{w_cl}}  {t['level']:<13} {t['profile']:<12} {entry:<24} "
                  f"{t['feature'] or ''}")
        by = {}
        for t in tests:
            by.setdefault(t["profile"], {}).setdefault(t["level"], 0)
            by[t["profile"]][t["level"]] += 1
        print(f"\n{len(tests)} tests: " + "; ".join(
            f"{p} " + ", ".join(f"{n} {lv}" for lv, n in sorted(lvls.items())) for p, lvls in by.items()))
        for d in doc.get("duplicate_ids", []):
            print(f"warning: duplicate stable id {d}")
        return 0


def collect(suite: str, profiles: list[str] = (), keyword: str | None = None, memory: str = "host") -> dict:
    """Collect-only through the plugin; returns {"tests": [...metadata], "duplicate_ids": [...]}."""
    import pytest

    target, root = _suite_args(suite)
    if root is None:
        raise RuntimeError(f"suite not found: {suite}")
    with tempfile.TemporaryDirectory(prefix="kvx-list-") as tmp:
        ini = Path(tmp) / "pytest.ini"
        ini.write_text(PYTEST_INI, encoding="utf-8")
        out = Path(tmp) / "collection.json"
        pa = ["--collect-only", "-qq", "-c", str(ini), "--rootdir", str(root), "-p", "kvx_conformance.plugin",
              "-p", "no:cacheprovider", "--kvx-collect-out", str(out), "--kvx-progress", "none",
              "--kvx-memory", memory]
        for prof in profiles:
            pa += ["--kvx-profile", prof]
        if keyword:
            pa += ["-k", keyword]
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            rc = int(pytest.main(pa + target))
        if rc not in (0, int(pytest.ExitCode.NO_TESTS_COLLECTED)) or (not out.exists() and rc != 5):
            tail = "\n".join(buf.getvalue().strip().splitlines()[-15:])
            raise RuntimeError(f"collecting {suite} failed (pytest exit status {rc}):\n{tail}")
        if not out.exists():
            return {"tests": [], "duplicate_ids": []}
        return json.loads(out.read_text(encoding="utf-8"))
