"""The exact FP4 tier is opt-in (results/claims.py OPT_IN_PROFILES; docs/claims-and-expectations.md).

Product readings, FP4 extension: "Two conformance tiers: 'exact' (codes, scales and decoded
values bit-identical to the reference codec) and 'compatible' (...)". A provider meeting the
compatible tier (profile ``fp4``) conforms; the exact tier (``fp4_exact``) is claimed on request.
Its tests still run in a default run and its verdict is reported, not claimed.

- A compatible-only provider: ``libkvx_mutant_fp4_ties_away.so``, the reference whose E2M1
  rounding sends ties away from zero (within one code of the even one: compatible, not exact;
  docs/kill-matrix.md: caught by ``fp4_exact`` tests only). With the default claims its FP4 run
  exits 0 (what it claims passed) and reports ``fp4_exact`` not certified and not claimed, in
  the results, the certificate, the console and the report; claiming ``fp4_exact`` (``opt_in:``)
  makes it exit 1.
- The bundled reference with no provider argument claims every profile, ``fp4_exact``
  included (its claims file, ``reference_claims_file()``).

The runs select FP4 tests only (``--id``, partial runs: their exit code says whether what they
claim passed, docs/exit-codes.md); the full-run verdicts of the default claims are unit-tested
in test_harness_support.py.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvx_conformance.abi import native
from kvx_conformance.results.claims import reference_claims_file

NO_RERUNS = ("--reruns", "0")  # a deterministic codec: one attempt decides


def _kvx(*args: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("kvx-conform")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "kvx_conformance.cli"]
    return subprocess.run([*cmd, *args, "--progress", "none", *NO_RERUNS], capture_output=True, text=True,
                          timeout=600)


def _explain(p: subprocess.CompletedProcess) -> str:
    return f"exit {p.returncode}\n--- stdout (tail)\n{p.stdout[-4000:]}\n--- stderr (tail)\n{p.stderr[-2000:]}"


def _compatible_only() -> str:
    path = native.mutant_provider("fp4_ties_away")
    if not path.exists():
        pytest.fail(f"{path} is not built: the package build (csrc/mutants) must produce it")
    return str(path)


def test_compatible_tier_provider_certified_by_default(tmp_path):
    out = tmp_path / "dflt"
    p = _kvx("run", _compatible_only(), "--id", "fp4*", "-n", "2", "--output-dir", str(out))
    assert p.returncode == 0, _explain(p)
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert not doc["claims"]["explicit"] and "fp4_exact" not in doc["claims"]["profiles"]
    assert doc["claimed_profiles_certified"], _explain(p)
    fp4, exact = doc["profiles"]["fp4"], doc["profiles"]["fp4_exact"]
    assert fp4["claimed"] and fp4["verdict"] == "certified", fp4
    # the exact tier still runs and gets its verdict, reported and not claimed
    assert not exact["claimed"] and exact["verdict"] == "not certified", exact
    assert exact["blocking"] and all(b.startswith("fp4_exact.") for b in exact["blocking"]), exact
    assert doc["not_claimed"] == ["fp4_exact"]
    cert = json.loads((out / "certificate.json").read_text(encoding="utf-8"))
    assert cert["not_claimed_profiles"] == ["fp4_exact"] and not cert["claims_explicit"]
    assert cert["profiles"]["fp4_exact"]["verdict"] == "not certified"
    assert "fp4_exact    not certified" in p.stdout and "NOT CLAIMED" in p.stdout, _explain(p)
    assert "== not claimed (reported, not part of this run's verdict): fp4_exact not certified" in p.stdout, \
        _explain(p)
    report = (out / "report.html").read_text(encoding="utf-8")
    assert 'id="not-claimed"' in report and "<b>fp4_exact</b> not certified" in report
    assert "not certified by this run" not in report + p.stdout


def test_compatible_tier_provider_not_certified_when_claiming_the_exact_tier(tmp_path):
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps({"opt_in": ["fp4_exact"]}))
    out = tmp_path / "exact"
    p = _kvx("run", _compatible_only(), "--claims", str(claims), "--id", "fp4_exact.write.ties*", "-n", "1",
             "--output-dir", str(out))
    assert p.returncode == 1, _explain(p)
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    exact = doc["profiles"]["fp4_exact"]
    assert exact["claimed"] and exact["verdict"] == "not certified" and exact["blocking"], exact
    assert not doc["claimed_profiles_certified"] and doc["not_claimed"] == []


def test_bundled_reference_claims_the_exact_tier(tmp_path):
    """``kvx-conform run`` with no provider: the reference's claims file, every profile claimed
    (fp4_exact too), with the default claims' reading (not explicit: a partial run still exits 0)."""
    out = tmp_path / "ref"
    p = _kvx("run", "--id", "fp4_exact.write.ties*", "-n", "1", "--output-dir", str(out))
    assert p.returncode == 0, _explain(p)
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["claims"]["source"] == str(reference_claims_file()), doc["claims"]
    assert "fp4_exact" in doc["claims"]["profiles"] and not doc["claims"]["explicit"]
    assert doc["not_claimed"] == [] and doc["claimed_profiles_certified"]
    exact = doc["profiles"]["fp4_exact"]
    assert exact["claimed"] and exact["verdict"] == "certified", exact
    cert = json.loads((out / "certificate.json").read_text(encoding="utf-8"))
    assert "fp4_exact" in cert["claimed_profiles"] and cert["not_claimed_profiles"] == []
    assert "not claimed" not in p.stdout, _explain(p)
    assert doc["tests"] and all(t["outcome"] == "pass" for t in doc["tests"]), _explain(p)


def test_claims_of_profile_option_survive_re_runs(tmp_path):
    """``--profile fp4_exact`` claims the exact tier (plugin config); the re-runs of what failed
    compute the verdicts again, and must do so under the run's claims (results ``claims``), not
    the claims file's alone: else a deterministic exact-tier failure read CERTIFIED (exit 0) once
    re-run, its profile no longer claimed."""
    out = tmp_path / "rerun"
    script = Path(sys.executable).with_name("kvx-conform")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "kvx_conformance.cli"]
    p = subprocess.run([*cmd, "run", _compatible_only(), "--profile", "fp4_exact", "--id", "fp4_exact.write.ties*",
                        "-n", "1", "--output-dir", str(out), "--reruns", "1", "--progress", "none"],
                       capture_output=True, text=True, timeout=600)
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["config"]["reruns"] == 1 and any(t.get("attempts") for t in doc["tests"]), _explain(p)
    assert p.returncode == 1, _explain(p)
    exact = doc["profiles"]["fp4_exact"]
    assert exact["claimed"] and exact["verdict"] == "not certified", exact
    assert doc["claims"]["explicit"] and not doc["claimed_profiles_certified"]
