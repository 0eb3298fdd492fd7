"""docs/must-coverage.md stays true: every test it names exists in the bundled suites (the default
run on host or on device memory collects it: some checks have meaning on GPU memory only), and a requirement whose level is ``required`` names at least one
required test (a test at another level, or one renamed away, would make a PASS claim more than the
run checked)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from kvx_conformance.harness.plugin.controller import _Controller

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "must-coverage.md"
TEST_ID = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+(\[[^\]]+\])?$")


def _listed() -> dict[str, str]:
    """id -> level of every test of the default run on host memory and on device memory (listing
    needs no GPU)."""
    script = Path(sys.executable).with_name("kvx-conform")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "kvx_conformance.cli"]
    out = {}
    for memory in ("host", "device"):
        p = subprocess.run([*cmd, "list", "--json", "--memory", memory], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        out.update({t["id"]: t["level"] for t in json.loads(p.stdout)["tests"]})
    return out


def _rows() -> list[tuple[str, list[str], str]]:
    """(row key, test ids of its tests column, level) of each table row of the doc; a row whose
    tests column says "as S17" (or "rows S1, S17") takes the named rows' tests."""
    rows, refs = [], {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) != 6 or not re.fullmatch(r"[SP]\d+", cells[0]):
            continue
        ids = [t for t in re.findall(r"`([^`]+)`", cells[3]) if TEST_ID.match(t)]
        refs[cells[0]] = re.findall(r"\b([SP]\d+)\b", re.sub(r"`[^`]*`", "", cells[3]))
        rows.append((cells[0], ids, cells[4]))
    by_key = {k: ids for k, ids, _ in rows}
    return [(k, ids + [i for r in refs[k] for i in by_key.get(r, [])], lv) for k, ids, lv in rows]


def _matches(token: str, listed: dict[str, str]) -> list[str]:
    if "[" in token:
        return [token] if token in listed else []
    return [i for i in listed if i.split("[", 1)[0] == token]


def test_every_named_test_exists_and_required_rows_have_a_required_test():
    listed = _listed()
    listed[_Controller.RUN_LATE_ID] = "required"  # the run-wide record of writes into freed buffers
    rows = _rows()
    assert len(rows) >= 40, f"the doc's tables were not parsed ({len(rows)} rows)"
    problems = []
    for key, ids, level in rows:
        found = {t: _matches(t, listed) for t in ids}
        problems += [f"{key}: `{t}` is not a test id of the bundled suites" for t, m in found.items() if not m]
        if level == "required" and not any(listed[i] == "required" for m in found.values() for i in m):
            problems.append(f"{key}: level required, but no required test among {ids}")
    assert not problems, "\n".join(problems)
