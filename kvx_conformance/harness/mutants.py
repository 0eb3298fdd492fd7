"""The mutant kill test: which conformance tests catch which mutant provider.

The package build compiles the host reference provider once per name in
``csrc/mutants/mutants.txt`` with one deliberate defect (``libkvx_mutant_<name>.so``,
``csrc/reference/mutants.h``). This module

- ``sweep``: runs the full conformance suite (``kvx-conform run``, the real CLI path)
  on the reference and on every mutant, records per mutant every test that catches it
  (outcome fail / crash / timeout on the mutant; pass, or a refusal the spec allows, on the
  reference), picks a few
  *killers* per mutant and writes ``tests/data/killers.json`` and ``docs/kill-matrix.md``;
- ``check``: runs only the recorded killers of some mutants and says, per mutant,
  whether each killer still catches it (and passes, or is refused as allowed, on the reference).
  ``tests/test_mutants.py`` drives it.

Usage (from the repository root)::

    python -m kvx_conformance.mutants sweep            # ~25 min on 2 cores
    python -m kvx_conformance.mutants check ignore_strides v_into_k --json
    python -m kvx_conformance.mutants matrix           # re-render docs/kill-matrix.md

``KVX_CONFORM_NATIVE_DIR`` points every command at a build tree's ``native`` folder.

Every run here, of the reference and of each mutant, claims what the bundled reference claims
(``--claims`` / ``--kvx-claims`` with ``results/claims.py`` ``reference_claims_file()``: the
default claims and the opt-in ``fp4_exact``): a mutant is the reference's code with one defect,
so a defect only the exact tier sees (``fp4_ties_away``) leaves it *not certified*.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..abi import native
from ..abi.buffers import LATER_TEST
from ..results.claims import reference_claims_file

#: test outcomes that count as "the mutant was caught"
CATCHING = ("fail", "crash", "timeout")
#: outcomes of the reference that make a test a fair judge of a mutant: it passes, or it refuses
#: a path the spec lets it refuse (UNSUPPORTED) that the mutant serves wrongly (a servable rule:
#: negative strides, strided scale values)
REFERENCE_OK = ("pass", "unsupported")
#: how many killers are recorded per mutant
KILLERS_PER_MUTANT = 3
KILLERS_SCHEMA = 1
#: per-test timeout of sweep runs (a hanging mutant costs breaker x this)
SWEEP_TIMEOUT_S = 20.0
#: profiles whose tests are killers only when nothing else catches a mutant: engine scenarios
#: and generated cases are slow, the FP4 extension suite is optional (KVX 1.2)
SECONDARY_PROFILES = ("engines", "generated", "fp4")
#: per-mutant extra `kvx-conform run` arguments of the sweep (none: every mutant is caught by
#: the default run; late writers' stores land in quarantined buffers, docs/device-faults.md)
SWEEP_EXTRA: dict[str, list[str]] = {}
#: hypothesis examples per generated test in sweep runs (a failing property also shrinks: keep it small)
SWEEP_HYPOTHESIS_EXAMPLES = 10
#: per-test timeout of check runs (in-process runs: a timeout ends the process, keep it generous)
CHECK_TIMEOUT_S = 60.0


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def mutants_txt(root: Path | None = None) -> Path:
    return (root or repo_root()) / "csrc" / "mutants" / "mutants.txt"


def read_mutants_txt(path: Path | None = None) -> dict[str, str]:
    """name -> description (the comment lines above the name), in file order."""
    path = path or mutants_txt()
    out: dict[str, str] = {}
    comment: list[str] = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line.startswith("#"):
            comment.append(line.lstrip("#").strip())
        elif re.fullmatch(r"[a-z0-9_]+", line):
            out[line] = " ".join(comment)
            comment = []
        elif not line:
            comment = []
    return out


def base_id(test_id: str) -> str:
    return test_id.split("[", 1)[0]


# ----------------------------------------------------------------------------- sweep


def cli_run(provider: str, out: Path, extra: list[str], timeout_s: float, env: dict | None = None,
            wall_limit: float = 1800.0) -> tuple[int, float, str]:
    """``kvx-conform run PROVIDER --output-dir OUT --claims <the reference's> ...`` in a subprocess:
    (exit code, seconds, output tail).

    Without re-runs (``--reruns 0``, unless ``extra`` says otherwise): a mutant's defect is
    deterministic, so re-running what it fails would change no outcome and cost time. With the
    bundled reference's claims (the default ones and ``fp4_exact``): the reference and its
    mutants are judged by the same claims."""
    cmd = [sys.executable, "-m", "kvx_conformance.cli", "run", provider, "--output-dir", str(out),
           "--progress", "none", "--timeout", f"{timeout_s:g}", "--reruns", "0",
           "--claims", str(reference_claims_file()), *extra]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=wall_limit, env=env)
    return p.returncode, time.monotonic() - t0, (p.stdout + p.stderr)[-3000:]


def _load_tests(results: Path) -> dict[str, dict]:
    doc = json.loads(results.read_text(encoding="utf-8"))
    return {t["id"]: t for t in doc.get("tests", [])}


def pick_killers(caught: list[dict], k: int = KILLERS_PER_MUTANT) -> list[str]:
    """A few catching tests: deterministic failures first, required before the rest, the
    conformance suites before the engine scenarios and the generated (hypothesis) tests (those
    only when nothing else catches it), fast ones first, at most one per base id."""
    rank_outcome = {"fail": 0, "crash": 1, "timeout": 2}
    rank_level = {"required": 0, "recommended": 1, "informational": 2}

    def key(t: dict):
        return (rank_outcome.get(t["outcome"], 3), rank_level.get(t["level"], 3),
                t.get("profile") in SECONDARY_PROFILES, round(float(t.get("duration") or 0), 1), t["id"])

    chosen: list[str] = []
    bases: set[str] = set()
    plain = [t for t in caught if t.get("profile") not in SECONDARY_PROFILES]
    ranked = sorted(plain or caught, key=key)
    if ranked and ranked[0]["outcome"] in ("crash", "timeout"):
        k = 1  # nothing fails cleanly: one crash / timeout is proof enough, and each costs a worker
    else:
        # a mutant that fails cleanly somewhere: its crashes may be incidental (late_write's
        # stores into freed buffers crash whichever test runs next), so only clean failures
        ranked = [t for t in ranked if t["outcome"] == "fail"]
    for t in ranked:
        if base_id(t["id"]) in bases:
            continue
        chosen.append(t["id"])
        bases.add(base_id(t["id"]))
        if len(chosen) == k:
            break
    return chosen


def sweep(out_path: Path, matrix_path: Path, work: Path, workers: int, names: list[str] | None,
          timeout_s: float, keep: bool, examples: int = SWEEP_HYPOTHESIS_EXAMPLES, jobs: int = 1,
          reuse: bool = False, verify: int = 2) -> int:
    described = read_mutants_txt()
    names = names or list(described)
    ref = str(native.reference_provider())
    work.mkdir(parents=True, exist_ok=True)
    print(f"sweep: reference {ref}", flush=True)
    common = ["-n", str(workers), "--pytest-args", f"--kvx-hypothesis-examples {examples}"]
    if reuse and _complete(work / "reference"):
        rc, secs, tail = 0, 0.0, "(reused)"
    else:
        rc, secs, tail = cli_run(ref, work / "reference", common, timeout_s)
    if rc != 0 and not (work / "reference" / "results.json").exists():
        print(tail, file=sys.stderr)
        return 2
    ref_tests = _load_tests(work / "reference" / "results.json")
    ref_pass = {tid for tid, t in ref_tests.items() if t["outcome"] == "pass"}
    ref_ok = {tid for tid, t in ref_tests.items() if t["outcome"] in REFERENCE_OK}
    print(f"sweep: reference exit {rc}, {len(ref_tests)} tests, {len(ref_pass)} pass, {secs:.0f} s", flush=True)

    old = {}
    if out_path.exists() and names != list(described):
        old = json.loads(out_path.read_text(encoding="utf-8")).get("mutants", {})
    mutants: dict[str, dict] = {}
    todo = [n for n in described if n in names and native.mutant_provider(n).exists()]
    reused = {n: (_exit_code(work / n), 0.0, "(reused)") for n in todo if reuse and _complete(work / n)}
    todo = [n for n in todo if n not in reused]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        runs = dict(zip(todo, pool.map(
            lambda n: cli_run(str(native.mutant_provider(n)), work / n, common + SWEEP_EXTRA.get(n, []), timeout_s),
        todo)))
    runs.update(reused)
    for name in described:
        if name not in names:
            if name in old:
                mutants[name] = old[name]
            continue
        lib = native.mutant_provider(name)
        if name not in runs:
            print(f"sweep: {name}: {lib} not built", file=sys.stderr)
            mutants[name] = {"description": described[name], "error": "not built", "killers": []}
            continue
        d = work / name
        rc, secs, tail = runs[name]
        entry: dict = {"description": described[name], "exit_code": rc, "seconds": round(secs, 1)}
        if name in SWEEP_EXTRA:
            entry["sweep_args"] = SWEEP_EXTRA[name]
        if not (d / "results.json").exists():
            # refused before any test ran (e.g. a wrong ABI major): the preflight caught it
            entry.update(caught_by_preflight=tail.strip().splitlines()[-1] if tail.strip() else "",
                         killers=[], caught=0)
            print(f"sweep: {name}: exit {rc}, refused at load: {entry['caught_by_preflight']}", flush=True)
            mutants[name] = entry
            continue
        tests = _load_tests(d / "results.json")
        caught = [t for tid, t in tests.items() if t["outcome"] in CATCHING and tid in ref_ok]
        # a test failed afterwards for writes after return seen in its freed buffers (quarantine)
        # caught it by timing: a killer only when nothing else catches the mutant
        doc = json.loads((d / "results.json").read_text(encoding="utf-8"))
        incidental = {w.get("test") for w in doc.get("late_writes") or [] if w.get("where") in ("quarantine", LATER_TEST)}
        if any(t["id"] not in incidental for t in caught):
            caught_for_killers = [t for t in caught if t["id"] not in incidental]
        else:
            caught_for_killers = caught
        by_outcome: dict[str, int] = {}
        by_profile: dict[str, int] = {}
        for t in caught:
            by_outcome[t["outcome"]] = by_outcome.get(t["outcome"], 0) + 1
            by_profile[t["profile"]] = by_profile.get(t["profile"], 0) + 1
        killers = pick_killers(caught_for_killers)
        entry.update(
            verdict=doc.get("verdict"), caught=len(caught), caught_by_outcome=by_outcome,
            caught_by_profile=dict(sorted(by_profile.items())),
            breaker=sorted(e for e, b in (doc.get("breaker") or {}).items() if b.get("tripped")),
            killers=killers,
            killer_outcomes={tid: tests[tid]["outcome"] for tid in killers},
            killer_clauses={tid: tests[tid]["clause"] for tid in killers},
            killer_nodeids={tid: tests[tid]["nodeid"] for tid in killers},
        )
        mutants[name] = entry
        print(f"sweep: {name}: exit {rc}, {len(caught)} catching tests, {secs:.0f} s, killers {killers}", flush=True)
        if not keep:
            shutil.rmtree(d, ignore_errors=True)
    doc = {
        "schema": KILLERS_SCHEMA,
        "generated_by": "python -m kvx_conformance.mutants sweep",
        "note": "killers: up to 3 tests per mutant that fail / crash / time out on it and pass (or answer an allowed UNSUPPORTED) on the reference; "
                "tests/test_mutants.py runs exactly these",
        "reference_tests": len(ref_tests),
        "reference_pass": len(ref_pass),
        "sweep_timeout_s": timeout_s,
        "sweep_hypothesis_examples": examples,
        "verify_rounds": verify,
        "mutants": mutants,
    }
    # keep only killers that catch their mutant again, every time (drops incidental catches,
    # e.g. a crash caused by a late write of an earlier test)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    for rnd in range(verify):
        tmp = work / f"verify-{rnd}.json"
        tmp.write_text(json.dumps(doc, indent=1), encoding="utf-8")
        checked = [n for n in names if mutants.get(n, {}).get("killers")]
        rep = check(checked, tmp, work / f"verify-{rnd}")
        for n in checked:
            res = rep["mutants"][n]["results"]
            stay = [k for k in mutants[n]["killers"]
                    if res.get(k) in CATCHING and rep["reference"].get(k) in REFERENCE_OK]
            gone = [k for k in mutants[n]["killers"] if k not in stay]
            if gone:
                print(f"sweep: {n}: dropped killers that did not catch it again: {gone}", flush=True)
                mutants[n].setdefault("unstable_killers_dropped", []).extend(gone)
                mutants[n]["killers"] = stay
                for key in ("killer_outcomes", "killer_clauses", "killer_nodeids"):
                    mutants[n][key] = {k: v for k, v in mutants[n][key].items() if k in stay}
    out_path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    matrix_path.write_text(render_matrix(doc), encoding="utf-8")
    missing = [n for n, e in mutants.items() if not e.get("killers") and not e.get("caught_by_preflight")]
    print(f"sweep: wrote {out_path} and {matrix_path}; uncaught: {missing or 'none'}")
    return 1 if missing else 0


def _complete(d: Path) -> bool:
    try:
        return bool(json.loads((d / "results.json").read_text(encoding="utf-8")).get("complete"))
    except (OSError, ValueError):
        return False


def _exit_code(d: Path) -> int:
    """The exit code `kvx-conform run` gave for a finished run in ``d``."""
    doc = json.loads((d / "results.json").read_text(encoding="utf-8"))
    return 0 if doc.get("claimed_profiles_certified") else 1


def render_matrix(doc: dict) -> str:
    muts = doc["mutants"]
    lines = [
        "# Kill matrix: mutant providers and the tests that catch them",
        "",
        "Generated by `python -m kvx_conformance.mutants sweep` (do not edit by hand); the data is",
        "`tests/data/killers.json`. Each mutant is the host reference provider built with one",
        "deliberate defect (`csrc/mutants/mutants.txt`, `csrc/reference/mutants.h`,",
        "`libkvx_mutant_<name>.so`). The sweep runs the whole conformance suite on each one with",
        "`kvx-conform run`; a test *catches* a mutant when its outcome is fail, crash or timeout",
        "on the mutant and pass on the reference, or answer UNSUPPORTED there where the spec allows",
        "the refusal and the mutant serves the case wrongly. `tests/test_mutants.py` re-runs the",
        "recorded killers of every mutant and requires each to catch it (and to pass, or be refused",
        "so, on the reference).",
        "",
        f"Reference run: {doc.get('reference_tests')} tests, {doc.get('reference_pass')} pass. "
        f"{len(muts)} mutants, "
        f"{sum(1 for e in muts.values() if e.get('killers') or e.get('caught_by_preflight'))} caught.",
        "",
        "| mutant | defect | run verdict (the reference's claims: every profile) | catching tests | by outcome | profiles | killers (test_mutants.py) |",
        "| --- | --- | --- | ---: | --- | --- | --- |",
    ]
    for name, e in muts.items():
        if e.get("caught_by_preflight"):
            caught, outc, prof = "load", "refused at load", "-"
            kill = f"preflight: {e['caught_by_preflight']}"
        else:
            caught = str(e.get("caught", 0))
            outc = ", ".join(f"{k} {v}" for k, v in (e.get("caught_by_outcome") or {}).items()) or "-"
            prof = ", ".join(f"{k} {v}" for k, v in (e.get("caught_by_profile") or {}).items()) or "-"
            kill = "<br>".join(f"`{k}` ({(e.get('killer_outcomes') or {}).get(k, '?')})"
                               for k in e.get("killers", [])) or "**NOT CAUGHT**"
            if e.get("breaker"):
                outc += "; breaker: " + ", ".join(e["breaker"])
            if e.get("sweep_args"):
                outc += "; swept with `" + " ".join(e["sweep_args"]) + "`"
            if e.get("unstable_killers_dropped"):
                kill += "<br>(dropped, did not catch it on every re-run: " + ", ".join(
                    f"`{k}`" for k in e["unstable_killers_dropped"]) + ")"
        desc = (e.get("description") or "").replace("|", "\\|")
        lines.append(f"| `{name}` | {desc} | {e.get('verdict', 'refused at load' if e.get('caught_by_preflight') else '-')} "
                     f"| {caught} | {outc} | {prof} | {kill} |")
    lines += [
        "",
        "The sweep runs with a hypothesis budget of "
        f"{doc.get('sweep_hypothesis_examples')} examples per generated test and a "
        f"{doc.get('sweep_timeout_s'):g} s per-test timeout; it prefers killers that fail cleanly, in the",
        "conformance suites (engine, generated and FP4 tests only when nothing else catches a mutant),",
        f"re-runs the chosen killers {doc.get('verify_rounds', 0)} times and keeps only those that catch the "
        "mutant every time.",
        "The run verdict is the one of `kvx-conform run` with the bundled reference's claims",
        "(`kvx_conformance/results/reference-claims.json`, what a run of the reference with no provider",
        "argument claims; each mutant is the reference with one defect): the default claims and the opt-in",
        "exact FP4 tier `fp4_exact`, so every profile (a profile the mutant does not serve at all reads",
        "*not served* and does not block). A mutant that breaks a MUST anywhere, or the exact tier's",
        "bit-identity, is *not certified*. A mutant whose defect breaks only a SHOULD",
        "(recommended tests) stays *certified* with those warnings on its certificate: caught, not hidden.",
        "",
        "Re-generate after changing the suites or the mutants:",
        "",
        "```sh",
        "KVX_CONFORM_NATIVE_DIR=<build>/native python -m kvx_conformance.mutants sweep",
        "python -m pytest tests/test_mutants.py",
        "```",
        "",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- check


def _pytest_args(provider: str, out: Path, ids: list[str], files: list[str], root: Path,
                 timeout_s: float, examples: int) -> list[str]:
    pa = ["-c", str(out / "pytest.ini"), "--rootdir", str(root), "-p", "kvx_conformance.plugin",
          "-p", "no:cacheprovider", "-p", "no:faulthandler", "--timeout", f"{timeout_s:g}",
          "--timeout-method", "thread", "-qq", "--no-summary", "-W", "ignore::pytest.PytestUnknownMarkWarning",
          "--kvx-provider", provider, "--kvx-memory", "host", "--kvx-output-dir", str(out),
          "--kvx-progress", "none", "--kvx-hypothesis-examples", str(examples),
          "--kvx-claims", str(reference_claims_file())]  # the reference's claims, as cli_run
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        pa += ["-p", "pytest_timeout"]
    for tid in ids:
        pa += ["--kvx-id", tid]
    return pa + files


def run_selected(provider: str, ids: list[str], nodefiles: list[str], out: Path,
                 timeout_s: float = CHECK_TIMEOUT_S,
                 examples: int = SWEEP_HYPOTHESIS_EXAMPLES) -> dict[str, dict]:
    """Run the tests ``ids`` on ``provider`` *in this process* (pytest + the kvx plugin,
    no xdist) and return id -> record from the results.json the plugin wrote.

    Only for providers that do not crash: a crash takes this process down (use the CLI
    for crashing mutants, as :func:`check` does). Inputs are not sealed read-only here
    (``execute.SEAL_INPUTS``): a mutant that stores into one fails its killers as it did in
    the sweep's records, where the CLI's sealed calls make it crash (both catch it)."""
    import pytest

    from ..results.certificate import suite_root
    from .runner import DEFAULT_SUITE, PYTEST_INI

    root = suite_root(DEFAULT_SUITE)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pytest.ini").write_text(PYTEST_INI, encoding="utf-8")
    files = sorted({str(root / f.split("::")[0]) for f in nodefiles}) or [str(root)]
    from ..cases import execute

    buf = io.StringIO()
    sealed, execute.SEAL_INPUTS = execute.SEAL_INPUTS, False  # a store into an input: a fail here, not a crash
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            rc = int(pytest.main(_pytest_args(provider, out, ids, files, root, timeout_s, examples)))
    finally:
        execute.SEAL_INPUTS = sealed
    res = out / "results.json"
    if not res.exists():
        raise RuntimeError(f"pytest exit {rc} wrote no results for {provider}:\n{buf.getvalue()[-2000:]}")
    return _load_tests(res)


def check(names: list[str], killers_path: Path, work: Path) -> dict:
    """Re-run the recorded killers; returns {"reference": {...}, "mutants": {name: {...}}}."""
    doc = json.loads(killers_path.read_text(encoding="utf-8"))
    known = doc.get("mutants", {})
    report: dict = {"mutants": {}, "reference": {}}
    examples = int(doc.get("sweep_hypothesis_examples") or SWEEP_HYPOTHESIS_EXAMPLES)
    entries = {n: known.get(n) for n in names}
    listing = {k: v for e in entries.values() if e for k, v in (e.get("killer_nodeids") or {}).items()}
    if any(k not in listing for e in entries.values() if e for k in e.get("killers", [])):
        listing = _collection_index()  # an older killers.json without node ids
    union = sorted({k for e in entries.values() if e for k in e.get("killers", [])})
    if union:
        print(f"check: reference: {len(union)} killer tests", file=sys.stderr, flush=True)
        ref = run_selected(str(native.reference_provider()), union, [listing.get(k, "") for k in union],
                           work / "reference", examples=examples)
        report["reference"] = {k: (ref.get(k) or {}).get("outcome", "not run") for k in union}
    for name in names:
        e = entries[name]
        r: dict = {"killers": [], "results": {}, "problems": []}
        report["mutants"][name] = r
        if e is None:
            r["problems"].append("missing from killers.json")
            continue
        if e.get("caught_by_preflight"):
            rc, _, tail = cli_run(str(native.mutant_provider(name)), work / name, ["-n", "1"], 10.0)
            r["preflight_exit"] = rc
            r["killers"] = ["(preflight)"]
            if rc in (0, 1):
                r["problems"].append(f"expected a load error, got exit {rc}")
            continue
        kill = list(e.get("killers", []))
        r["killers"] = kill
        if not kill:
            r["problems"].append("no killer recorded: no test catches this mutant")
            continue
        lib = str(native.mutant_provider(name))
        print(f"check: {name}: {kill}", file=sys.stderr, flush=True)
        # a mutant that crashed or hung anywhere in the sweep runs through the CLI (worker
        # processes), even when its killers fail cleanly: a late crash must not take us down
        crashing = any(o in ("crash", "timeout") for o in (e.get("killer_outcomes") or {}).values()) or \
            any(o in ("crash", "timeout") for o in (e.get("caught_by_outcome") or {}))
        if crashing:
            # the real CLI, worker processes: the crash or hang costs a worker, not us
            extra = ["-n", "1", "--breaker", "100", "--pytest-args", f"--kvx-hypothesis-examples {examples}"]
            for k in kill:
                extra += ["--id", k]
            hangs = any(o == "timeout" for o in e["killer_outcomes"].values())
            rc, _, tail = cli_run(lib, work / name, extra, 3.0 if hangs else 10.0)
            try:
                got = _load_tests(work / name / "results.json")
                verdict = json.loads((work / name / "results.json").read_text())["verdict"]
            except (OSError, ValueError) as ex:
                r["problems"].append(f"CLI exit {rc}, no results: {ex}: {tail[-400:]}")
                continue
            r["via"] = "kvx-conform run (subprocess)"
        else:
            got = run_selected(lib, kill, [listing.get(k, "") for k in kill], work / name, examples=examples)
            verdict = json.loads((work / name / "results.json").read_text())["verdict"]
            r["via"] = "pytest + kvx plugin (batch)"
        r["verdict"] = verdict
        # a killer catches the mutant only in a profile the run claims (the reference's claims:
        # every profile, fp4_exact included); one of a profile not claimed decides no verdict
        profiles = json.loads((work / name / "results.json").read_text()).get("profiles") or {}
        for k in kill:
            t = got.get(k)
            outcome = t["outcome"] if t else "not run"
            r["results"][k] = outcome
            if outcome not in CATCHING:
                r["problems"].append(f"{k}: expected fail/crash/timeout on {name}, got {outcome}"
                                     + (f" ({(t.get('message') or '')[:200]})" if t else ""))
            elif not (profiles.get(t.get("profile")) or {}).get("claimed"):
                r["problems"].append(f"{k}: its profile {t.get('profile')} is not claimed by the run, so it "
                                     f"decides no verdict (the runs claim {reference_claims_file().name})")
            ro = report["reference"].get(k)
            if ro not in REFERENCE_OK:
                r["problems"].append(f"{k}: expected pass (or a refusal the spec allows) on the reference, got {ro}")
        if verdict == "certified":
            r["problems"].append(f"verdict {verdict!r} for a mutant")
    return report


def _collection_index() -> dict[str, str]:
    """stable id -> nodeid, from a collect-only pass (no provider loaded)."""
    from .listing import collect

    doc = collect("kvx_conformance.suites")
    return {t["id"]: t["nodeid"] for t in doc["tests"]}


# ----------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvx_conformance.mutants", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep", help="run the whole suite on every mutant, write killers.json and the kill matrix")
    s.add_argument("names", nargs="*", help="only these mutants (the others keep their entries)")
    s.add_argument("--out", default=str(repo_root() / "tests" / "data" / "killers.json"))
    s.add_argument("--matrix", default=str(repo_root() / "docs" / "kill-matrix.md"))
    s.add_argument("--work", default=None, help="keep the runs here (default: a temporary dir)")
    s.add_argument("-n", "--workers", type=int, default=2)
    s.add_argument("--timeout", type=float, default=SWEEP_TIMEOUT_S)
    s.add_argument("--examples", type=int, default=SWEEP_HYPOTHESIS_EXAMPLES, help="hypothesis examples per test")
    s.add_argument("-j", "--jobs", type=int, default=1, help="mutant runs at once")
    s.add_argument("--reuse", action="store_true", help="reuse complete runs already in --work")
    s.add_argument("--verify", type=int, default=2, metavar="N",
                   help="re-run the chosen killers N times and drop any that does not catch every time")
    c = sub.add_parser("check", help="re-run the recorded killers of some mutants")
    c.add_argument("names", nargs="*", help="mutants (default: every one in mutants.txt)")
    c.add_argument("--killers", default=str(repo_root() / "tests" / "data" / "killers.json"))
    c.add_argument("--json", action="store_true")
    m = sub.add_parser("matrix", help="re-render docs/kill-matrix.md from killers.json")
    m.add_argument("--killers", default=str(repo_root() / "tests" / "data" / "killers.json"))
    m.add_argument("--matrix", default=str(repo_root() / "docs" / "kill-matrix.md"))
    args = ap.parse_args(argv)
    if args.cmd == "sweep":
        work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="kvx-sweep-"))
        try:
            return sweep(Path(args.out), Path(args.matrix), work, args.workers, args.names, args.timeout,
                         keep=bool(args.work), examples=args.examples, jobs=args.jobs, reuse=args.reuse,
                         verify=args.verify)
        finally:
            if not args.work:
                shutil.rmtree(work, ignore_errors=True)
    if args.cmd == "matrix":
        doc = json.loads(Path(args.killers).read_text(encoding="utf-8"))
        Path(args.matrix).write_text(render_matrix(doc), encoding="utf-8")
        return 0
    names = args.names or list(read_mutants_txt())
    with tempfile.TemporaryDirectory(prefix="kvx-check-") as tmp:
        rep = check(names, Path(args.killers), Path(tmp))
    if args.json:
        print(json.dumps(rep, indent=1))
    else:
        for n, r in rep["mutants"].items():
            print(f"{n:<32} {'CAUGHT' if not r['problems'] else 'PROBLEM'}  {r.get('results') or r['killers']}")
            for p in r["problems"]:
                print(f"    {p}")
    return 1 if any(r["problems"] for r in rep["mutants"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
