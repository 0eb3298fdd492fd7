"""Every mutant provider is caught, by name of the catching test (docs/kill-matrix.md).

``tests/data/killers.json`` (written by ``python -m kvx_conformance.mutants sweep``,
which runs the whole suite on every mutant) records, per mutant of
``csrc/mutants/mutants.txt``, a few tests that catch it. Here each mutant's recorded
killers run again, in subprocesses (``python -m kvx_conformance.mutants check``: the
pytest plugin in-process for mutants that fail, the real ``kvx-conform run`` for those
that crash or hang), and each must end fail / crash / timeout on the mutant, with a
verdict other than certified, and pass (or answer an allowed UNSUPPORTED) on the
reference. A mutant without a killer, or missing from killers.json, fails. The kill matrix is docs/kill-matrix.md.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvx_conformance.abi import native
from kvx_conformance.harness.mutants import read_mutants_txt, render_matrix

ROOT = Path(__file__).resolve().parents[1]
KILLERS = ROOT / "tests" / "data" / "killers.json"
MUTANTS = read_mutants_txt(ROOT / "csrc" / "mutants" / "mutants.txt")
BATCHES = 2  # one check process per xdist worker of `pytest -n 2`


def _killers() -> dict:
    return json.loads(KILLERS.read_text(encoding="utf-8"))


def test_every_mutant_has_a_recorded_killer():
    doc = _killers()["mutants"]
    problems = []
    for name in MUTANTS:
        e = doc.get(name)
        if e is None:
            problems.append(f"{name}: missing from tests/data/killers.json (run: python -m kvx_conformance.mutants "
                            f"sweep {name})")
        elif not e.get("killers") and not e.get("caught_by_preflight"):
            problems.append(f"{name}: no test catches it ({e.get('description')}); strengthen the suites")
    extra = sorted(set(doc) - set(MUTANTS))
    if extra:
        problems.append(f"killers.json names mutants that mutants.txt does not: {extra}")
    assert not problems, "\n".join(problems)
    assert len(MUTANTS) >= 25


def test_every_mutant_is_built():
    missing = [n for n in MUTANTS if not native.mutant_provider(n).exists()]
    assert not missing, f"not built by the package build: {missing}"


def test_kill_matrix_is_current():
    doc = _killers()
    text = (ROOT / "docs" / "kill-matrix.md").read_text(encoding="utf-8")
    assert text == render_matrix(doc), \
        "docs/kill-matrix.md is stale: python -m kvx_conformance.mutants matrix"


def _batches() -> list[list[str]]:
    names = list(MUTANTS)
    return [names[i::BATCHES] for i in range(BATCHES)]


@pytest.mark.parametrize("batch", _batches(), ids=[f"batch{i}" for i in range(BATCHES)])
def test_recorded_killers_catch_their_mutant(batch, tmp_path):
    cmd = [sys.executable, "-m", "kvx_conformance.mutants", "check", *batch, "--killers", str(KILLERS), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.stdout.strip(), f"the check process died (exit {p.returncode}); last mutant it started:\n" \
                             f"{p.stderr[-2000:]}"
    rep = json.loads(p.stdout)
    killers = _killers()["mutants"]
    problems = []
    for name in batch:
        r = rep["mutants"][name]
        if r["problems"]:
            lib = native.mutant_provider(name)
            ids = " ".join(f"--id '{k}'" for k in r["killers"] if not k.startswith("("))
            problems.append(
                f"{name} ({MUTANTS[name]}):\n  expected: each of {r['killers']} fails / crashes / times out on the "
                f"mutant and passes (or is refused as the spec allows) on the reference\n  got: {r.get('results')} (verdict {r.get('verdict')!r})\n  "
                + "\n  ".join(r["problems"])
                + f"\n  repro: kvx-conform run {lib} {ids}\n  recorded: {killers.get(name, {}).get('killer_outcomes')}")
    assert not problems, "\n".join(problems)
