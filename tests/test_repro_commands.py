"""Every failure's repro command re-runs exactly that test, as the run ran it, from any directory.

A vendor copies the ``repro:`` line of a failure (console, results.json, report.html, junit.xml)
and runs it, often somewhere else than where the run ran. The command must:

- select exactly the failing test: ``--id <stable id>`` (an exact match), never a ``-k``
  expression (``-k test_packed_4d`` also selects ``test_packed_4d_sequence_stride``;
  ``-k 'test_paged_decode[llama3_8b]'`` selects the TGI and the vLLM scenario);
- name the provider, the claims file and a suite directory by absolute paths;
- for a seeded (hypothesis-generated) test, carry the run's ``--seed`` and ``--quick`` (its
  examples and budget), never the drawn case's own seed (as a run seed that draws other examples);
- write into its own output directory (``kvx-repro``), so that running it where the run ran
  keeps the run's ``kvx-report``;
- run one worker without re-runs (it shows the failure at once).

And a crash or timeout record carries the four parts of a failure (what, expected, got, clause)
like a ConformanceFailure does.
"""
from __future__ import annotations

import html
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kvx_conformance.abi import loader, native
from kvx_conformance.harness.plugin.config import _RC, RunConfig
from kvx_conformance.harness.plugin.metadata import REPRO_DIR, repro_command
from kvx_conformance.results.claims import Claims, Waiver

ROOT = Path(__file__).resolve().parents[1]
KVX = Path(sys.executable).with_name("kvx-conform")


def _kvx(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(KVX), *args], capture_output=True, text=True, cwd=cwd, timeout=600)


def _explain(p: subprocess.CompletedProcess) -> str:
    return f"exit {p.returncode}\n--- stdout\n{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-3000:]}"


class _Config:
    """The two things repro_command reads of a pytest config: the run config and the repro extras."""

    def __init__(self, rc: RunConfig, extra: str = ""):
        self.stash = {_RC: rc}
        self._extra = extra

    def getoption(self, name: str):
        assert name == "kvx_repro_extra", name
        return self._extra


def _rc(provider: str, seed=None, quick=False) -> RunConfig:
    from kvx_conformance.abi.header import Memory

    return RunConfig(provider_path=Path(provider), memory=Memory.HOST, quick=quick, hypothesis_max_examples=10,
                     seed=seed, output_dir=None, claims=Claims())


def _opt(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == name]


# ----------------------------------------------------------------------------- the command, unit


def test_repro_selects_by_exact_id_with_absolute_provider(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _Config(_rc("./libacme.so"), extra="--claims /abs/claims.json")
    meta = {"id": "engine.tgi.paged.decode[llama3_8b]", "name": "test_paged_decode[llama3_8b]", "seeded": False,
            "nodeid": "engine/test_tgi.py::test_paged_decode[llama3_8b]"}
    argv = shlex.split(repro_command(cfg, meta, seed=16))
    assert argv[:3] == ["kvx-conform", "run", str(tmp_path / "libacme.so")], argv
    assert "-k" not in argv and _opt(argv, "--id") == [meta["id"]], argv
    assert "--seed" not in argv, "a non-seeded test fixes its own cases: no --seed"
    assert _opt(argv, "-n") == ["1"] and _opt(argv, "--reruns") == ["0"], argv
    assert _opt(argv, "--output-dir") == [REPRO_DIR] and _opt(argv, "--memory") == ["host"], argv
    assert _opt(argv, "--claims") == ["/abs/claims.json"], argv


@pytest.mark.parametrize("run_seed,quick,want", [(None, False, []), (None, True, ["--quick"]),
                                                  (7, False, ["--seed", "7"]), (7, True, ["--seed", "7", "--quick"])])
def test_seeded_repro_carries_the_runs_seed_and_budget_not_the_cases(run_seed, quick, want):
    """The record's ``seed`` of a generated test is the drawn case's (``generators``); hypothesis
    draws from the run's seed (derandomized without one) within the run's budget."""
    cfg = _Config(_rc("/p/libacme.so", seed=run_seed, quick=quick))
    argv = shlex.split(repro_command(cfg, {"id": "generated.valid.write", "seeded": True}, seed=421))
    tail = argv[argv.index("generated.valid.write") + 1:]
    assert tail == want, argv
    assert "421" not in argv


def test_every_listed_id_selects_exactly_itself():
    """``--id X`` (claims.Waiver: exact unless X holds '*') selects one test of the bundled suites."""
    p = _kvx("list", "--json", cwd=ROOT)
    assert p.returncode == 0, _explain(p)
    doc = json.loads(p.stdout)
    ids = [t["id"] for t in doc["tests"]]
    assert not doc["duplicate_ids"] and len(set(ids)) == len(ids)
    assert not [i for i in ids if "*" in i], "an id with '*' would be a pattern in --id"
    for i in ids:
        assert Waiver(i, "").matches(i) and not any(Waiver(i, "").matches(j) for j in ids if j != i), i


# ----------------------------------------------------------------------------- end to end


def _lib(name: str) -> Path:
    path = native.mutant_provider(name)
    if not path.exists():
        pytest.fail(f"{path} is not built: the package build (csrc/mutants) must produce it")
    return path


def test_every_failure_reproduces_alone_from_another_directory(tmp_path):
    """A mutant that writes V into the K cache, run from one directory with relative provider,
    claims and suite paths, ``--quick --seed 5``: every failure's repro selects exactly its test,
    with absolute paths, in the console, results.json, junit.xml and report.html alike; run verbatim
    from another directory, an explicit test's and a generated test's repro give the same failure
    (the generated one the same drawn case) of that test alone, and the run's report stays.
    ``write.prefill_batch[nhd]`` was ``-k test_prefill_sized_write``, which also selects the
    ``write.prefill_batch_sentinel`` tests."""
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    (here / "claims.json").write_text(json.dumps({"provider": "v into k", "features": ["ragged"]}))
    lib = os.path.relpath(_lib("v_into_k"), here)
    suite = os.path.relpath(ROOT / "suites" / "conformance", here)
    ids = ["write.slots.valid[*", "write.prefill_batch[nhd]", "generated.core.write", "validate.valid.nhd[f16]"]
    p = _kvx("run", lib, "--claims", "claims.json", "--suite", suite, "--quick", "--seed", "5", "-n", "1",
             "--reruns", "0", "--progress", "none", *[a for i in ids for a in ("--id", i)], cwd=here)
    assert p.returncode == loader.EXIT_NOT_CERTIFIED, _explain(p)
    out = here / "kvx-report"
    doc = json.loads((out / "results.json").read_text())
    bad = [t for t in doc["tests"] if t["outcome"] != "pass"]
    assert {t["id"] for t in bad} == {"write.slots.valid[s32]", "write.slots.valid[s64]", "write.prefill_batch[nhd]",
                                     "generated.core.write"}, [(t["id"], t["outcome"]) for t in bad]
    junit = (out / "junit.xml").read_text()
    report = html.unescape((out / "report.html").read_text())
    for t in bad:
        f = t["failure"]
        assert f["expected"] and f["got"] and f["clause"] and f["what"], t
        argv = shlex.split(t["repro"])
        assert argv[:2] == ["kvx-conform", "run"] and Path(argv[2]).is_absolute() and Path(argv[2]).exists(), argv
        assert "-k" not in argv and _opt(argv, "--id") == [t["id"]], argv
        assert _opt(argv, "--claims") == [str(here / "claims.json")], argv
        assert _opt(argv, "--suite") == [str(ROOT / "suites" / "conformance")], argv
        seeded = t["id"].startswith("generated.")
        assert (_opt(argv, "--seed") == ["5"] and "--quick" in argv) if seeded else \
            ("--seed" not in argv and "--quick" not in argv), argv
        assert f"repro: {t['repro']}" in p.stdout, "the console prints the same command"
        assert t["repro"] in report, "report.html shows the same command"
        assert html.escape(t["repro"], quote=False) in junit or t["repro"] in html.unescape(junit), \
            "junit.xml carries the same command"
    env = dict(os.environ, PATH=f"{KVX.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    for tid in ("write.prefill_batch[nhd]", "generated.core.write"):
        t = next(x for x in bad if x["id"] == tid)
        r = subprocess.run(t["repro"], shell=True, cwd=there, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == loader.EXIT_NOT_CERTIFIED, _explain(r)
        again = json.loads((there / REPRO_DIR / "results.json").read_text())["tests"]
        assert [(x["id"], x["outcome"]) for x in again] == [(tid, t["outcome"])], again
        assert again[0]["failure"] == t["failure"], (again[0]["failure"], t["failure"])
    assert json.loads((out / "results.json").read_text())["tests"] == doc["tests"], "the run's results stay"
