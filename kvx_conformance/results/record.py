"""results.json: the record of a conformance run (schema: docs/results-schema.md).

Written *as tests finish*: each finished test is appended to ``results.jsonl`` at
once, and ``results.json`` is rewritten atomically every few tests (and at the end),
so a run that is killed still leaves what ran. The verdict logic lives here too:
per profile, certified when every required test passes or is acceptably
unsupported or waived, no test of any level crashed, and the provider served what the
profile covers (:func:`profile_served`), "not served" when it refused all of it;
recommended failures are warnings, never hidden.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .claims import Claims, Waiver, match_waivers
from .engines import summarize_engines
from .outcomes import PROFILES, Outcome

SCHEMA_VERSION = "1.0"
KIND = "kvx-conform-results"

OUTCOMES = tuple(o.value for o in Outcome)
#: outcomes of a required test that block certification (unless waived)
BLOCKING = {Outcome.FAIL.value, Outcome.CRASH.value, Outcome.TIMEOUT.value, Outcome.ERROR.value, Outcome.SKIP.value,
            Outcome.FLAKY.value}
#: outcomes of a recommended test reported as warnings
WARNING = {Outcome.FAIL.value, Outcome.CRASH.value, Outcome.TIMEOUT.value, Outcome.ERROR.value, Outcome.FLAKY.value}
#: outcomes after which a test is re-run (``kvx-conform run --reruns``)
RERUN = (Outcome.FAIL.value, Outcome.CRASH.value, Outcome.TIMEOUT.value, Outcome.ERROR.value)

VERDICT_CERTIFIED = "certified"
VERDICT_NOT_CERTIFIED = "not certified"
VERDICT_QUICK = "not certifying (quick)"
VERDICT_PARTIAL = "not certifying (partial selection)"
#: a profile whose optional feature the provider does not serve at all (see ``profile_served``)
VERDICT_NOT_SERVED = "not served"
VERDICT_NOT_RUN = "not run"

#: profiles certified only together with the profiles they build on: the exact FP4 tier is the
#: compatible tier held to bit-identity (docs/fp4.md), and the compatible tier's slot, raw-write,
#: bad-block and thread tests hold for both, so a provider the compatible tier does not certify
#: is not certified in the exact tier either.
PROFILE_INCLUDES: dict[str, tuple[str, ...]] = {"fp4_exact": ("fp4",)}


def bundled_suite(doc: dict) -> bool:
    """Whether a run (its results or run-info document) ran the bundled suite, byte for byte
    (``config.bundled_suite``, set by ``kvx-conform run``): only such a run can certify. A
    ``--suite`` of other files, a part of the bundled one included, is "not certifying"."""
    return (doc.get("config") or {}).get("bundled_suite", True) is not False


def profile_served(required: list["TestRecord"]) -> bool:
    """Whether the provider served what a profile covers, judged on its required tests.

    Served: at least one required test of the profile passed in which the provider answered
    OK, and correctly, to a valid write or gather (``served_calls`` > 0; a record that did
    not count them, ``None``, counts as served when it passed). A test that only checks a
    rejection serves nothing: a provider without the FP4 extension, whose only passing FP4
    test checks that it *rejects* FP4 data, does not serve ``fp4``.
    """
    return any(t.outcome == Outcome.PASS.value and (t.served_calls is None or t.served_calls > 0)
               for t in required)


#: node ids of records the harness adds for the whole run (no pytest item behind them: never re-run)
RUN_WIDE_PREFIX = "kvx-conform::"


@dataclass
class TestRecord:
    """One finished test (the elements of ``results.json``'s ``tests``)."""

    __test__ = False  # not a pytest test class
    id: str
    nodeid: str
    clause: str
    level: str
    profile: str
    entry: list[str]
    feature: str | None
    outcome: str
    message: str = ""
    repro: str = ""
    duration: float = 0.0
    seed: int | None = None
    #: ConformanceFailure fields when the test failed with one: what, expected, got, clause, case
    failure: dict | None = None
    #: set by the circuit breaker: the entry point whose breaker skipped this test
    breaker: str | None = None
    worker: str | None = None
    #: crash/timeout detail: the fatal error line and the innermost frames
    detail: str = ""
    #: crash / timeout: how the worker ended (kind signal, exit, device-fault, timeout), the entry
    #: point it was in, the CUDA error of a device fault, the case, a possible cause
    crash: dict | None = None
    #: filled from the expectations file when a waiver matches
    waived: str | None = None
    #: a re-run test (``--reruns``): the outcome of every attempt, first run first
    attempts: list[str] | None = None
    #: a re-run test: how many attempts had each outcome, e.g. {"pass": 2, "fail": 1}
    tally: dict[str, int] | None = None
    #: the GPU (index as --gpus names it) the test's worker was bound to; None on host runs
    gpu: int | None = None
    #: the status of an accepted or failed refusal: "UNSUPPORTED", or "INVALID_ARGUMENT" (spec 8
    #: "unsupported field") for a call the oracle answers OK
    refusal: str | None = None
    #: a recommended-level warning about an otherwise acceptable outcome (e.g. a refusal given
    #: as INVALID_ARGUMENT where the spec says SHOULD return UNSUPPORTED)
    warning: str | None = None
    #: valid writes / gathers the provider answered OK and correctly in this test (None: not
    #: counted, e.g. an older results file): the evidence that its profile was served
    served_calls: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TestRecord":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


def _atomic_write_json(path: Path, data) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# ----------------------------------------------------------------------------- verdicts


def summarize(
    tests: list[TestRecord],
    claims: Claims,
    waivers: list[Waiver],
    *,
    quick: bool,
    partial: bool,
    complete: bool,
    not_run: int = 0,
) -> dict:
    """Verdicts, counts, warnings and waiver bookkeeping for a list of finished tests.

    Mutates ``tests``: sets ``waived`` on every non-passing test a waiver matches.
    """
    by_id, matches = match_waivers(waivers, [t.id for t in tests])
    for t in tests:
        w = by_id.get(t.id)
        t.waived = w.reason if (w is not None and t.outcome not in (Outcome.PASS.value, Outcome.UNSUPPORTED.value)) else None

    counts = {o: 0 for o in OUTCOMES}
    for t in tests:
        counts[t.outcome] = counts.get(t.outcome, 0) + 1

    profiles: dict[str, dict] = {}
    for name in list(PROFILES) + sorted({t.profile for t in tests} - set(PROFILES)):
        mine = [t for t in tests if t.profile == name]
        if not mine and name not in claims.profiles:
            continue
        pc = {o: 0 for o in OUTCOMES}
        for t in mine:
            pc[t.outcome] += 1
        required = [t for t in mine if t.level == "required"]
        # A crash blocks at every level (docs/spec-readings.md R-VERDICT): the level grades the answer
        # a call gives, and a call that crashes gives none.
        crashed = [t for t in mine if t.level != "required" and t.outcome == Outcome.CRASH.value]
        blocking = [t.id for t in required + crashed if t.outcome in BLOCKING and not t.waived]
        waived = [t.id for t in required + crashed if t.outcome in BLOCKING and t.waived]
        warnings = [t.id for t in mine if t.level == "recommended" and t.outcome in WARNING]
        warnings += [t.id for t in mine if t.warning and t.id not in warnings]
        req_pass = sum(t.outcome == Outcome.PASS.value for t in required)
        req_unsup = sum(t.outcome == Outcome.UNSUPPORTED.value for t in required)
        served = bool(mine) and profile_served(required)
        if not mine or (partial and not required and not blocking):
            verdict = VERDICT_NOT_RUN  # (a partial selection with none of the profile's required tests)
        elif blocking:
            verdict = VERDICT_NOT_CERTIFIED
        elif required and not served and not waived:
            verdict = VERDICT_NOT_SERVED
        else:
            verdict = VERDICT_CERTIFIED
        if not complete and verdict == VERDICT_CERTIFIED:
            verdict = "incomplete"
        profiles[name] = {
            "verdict": verdict,
            "claimed": name in claims.profiles,
            "served": served,
            "description": PROFILES.get(name, ""),
            "tests": len(mine),
            "required": len(required),
            "required_passed": req_pass,
            "required_unsupported": req_unsup,
            "counts": pc,
            "blocking": blocking,
            "waived": waived,
            "warnings": warnings,
            "includes": list(PROFILE_INCLUDES.get(name, ())),
        }

    for name, bases in PROFILE_INCLUDES.items():
        p = profiles.get(name)
        if p is None:
            continue
        for base in bases:
            b = profiles.get(base)
            if b is None or b["verdict"] != VERDICT_NOT_CERTIFIED:
                continue
            p["blocking"] = p["blocking"] + [t for t in b["blocking"] if t not in p["blocking"]]
            if p["verdict"] in (VERDICT_CERTIFIED, "incomplete"):
                p["verdict"] = VERDICT_NOT_CERTIFIED

    # Explicitly claimed profiles must all be certified. With the default claims (every
    # profile but the opt-in ones) a profile the provider does not serve, or one the run's suite has no test
    # of, does not block; every other one must be certified.
    must = [p for p in claims.profiles
            if claims.explicit or profiles.get(p, {}).get("verdict") not in (VERDICT_NOT_SERVED, VERDICT_NOT_RUN, None)]
    claimed_ok = all(profiles.get(p, {}).get("verdict") == VERDICT_CERTIFIED for p in must)
    if not complete or not_run:
        claimed_ok = False
    if quick:
        verdict = VERDICT_QUICK
    elif partial:
        verdict = VERDICT_PARTIAL
    else:
        verdict = VERDICT_CERTIFIED if claimed_ok else VERDICT_NOT_CERTIFIED

    warnings: list[str] = []
    for t in tests:
        if t.level == "recommended" and t.outcome in WARNING:
            warnings.append(f"{t.id}: recommended ({t.clause}) {t.outcome}: {first_line(t.message)}")
        elif t.warning:
            warnings.append(f"{t.id}: recommended: {t.warning}")
    waiver_rows = []
    for m in matches:
        applied = [tid for tid in m.matched if by_id.get(tid) is m.waiver and _waivable(tests, tid)]
        row = {"id": m.waiver.id, "reason": m.waiver.reason, "matched": m.matched, "applied_to": applied}
        waiver_rows.append(row)
        if not m.matched:
            warnings.append(f"expectations: waiver '{m.waiver.id}' matches no test")
    return {
        "verdict": verdict,
        "certifying": not quick and not partial,
        "claimed_profiles_certified": claimed_ok,
        "not_claimed": claims.not_claimed,
        "not_served": [p for p, v in profiles.items() if v["verdict"] == VERDICT_NOT_SERVED],
        "profiles": profiles,
        "counts": counts,
        "warnings": warnings,
        "waivers": waiver_rows,
        "engines": summarize_engines(tests),
    }


def _waivable(tests: list[TestRecord], tid: str) -> bool:
    return any(t.id == tid and t.waived for t in tests)


def first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


# ----------------------------------------------------------------------------- the writer


@dataclass
class ResultsWriter:
    """Appends finished tests to results.jsonl and keeps results.json current."""

    out_dir: Path
    header: dict
    claims: Claims = field(default_factory=Claims)
    waivers: list[Waiver] = field(default_factory=list)
    quick: bool = False
    partial: bool = False
    every_tests: int = 5
    every_seconds: float = 2.0

    def __post_init__(self):
        self.out_dir = Path(self.out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.tests: list[TestRecord] = []
        self.total: int | None = None
        self.breaker: dict = {}
        self.extra_warnings: list[str] = []
        self.collection_errors: list[str] = []
        #: writes after return seen outside the lifetime test's own check (docs/device-faults.md)
        self.late_writes: list[dict] = []
        self.started = now_iso()
        self._t0 = time.monotonic()
        self._jsonl = open(self.out_dir / "results.jsonl", "w", encoding="utf-8")
        self._since_write = 0
        self._last_write = 0.0
        self.write(complete=False)

    def add(self, rec: TestRecord) -> None:
        self.tests.append(rec)
        self._jsonl.write(json.dumps(rec.to_dict()) + "\n")
        self._jsonl.flush()
        self._since_write += 1
        if self._since_write >= self.every_tests or time.monotonic() - self._last_write >= self.every_seconds:
            self.write(complete=False)

    def amend(self, rec: TestRecord) -> None:
        """A finished test's record changed (writes after return seen after it finished):
        results.jsonl gets the new record as a later line for the same nodeid."""
        self._jsonl.write(json.dumps(rec.to_dict()) + "\n")
        self._jsonl.flush()
        self._since_write += 1

    def document(self, complete: bool) -> dict:
        not_run = max(0, (self.total or 0) - len(self.tests)) if complete else 0
        summary = summarize(
            self.tests, self.claims, self.waivers,
            quick=self.quick, partial=self.partial, complete=complete, not_run=not_run,
        )
        doc = {
            "schema_version": SCHEMA_VERSION,
            "kind": KIND,
            **self.header,
            "complete": complete,
            "started": self.started,
            "updated": now_iso(),
            "duration_s": round(time.monotonic() - self._t0, 3),
            "quick": self.quick,
            "claims": self.claims.to_dict(),
            "total": self.total,
            "finished": len(self.tests),
            **summary,
            "breaker": self.breaker,
            "collection_errors": self.collection_errors,
            "late_writes": self.late_writes,
            "tests": [t.to_dict() for t in self.tests],
        }
        doc["warnings"] = self.extra_warnings + doc["warnings"]
        return doc

    def write(self, complete: bool) -> dict:
        doc = self.document(complete)
        _atomic_write_json(self.out_dir / "results.json", doc)
        self._since_write = 0
        self._last_write = time.monotonic()
        return doc

    def close(self, complete: bool = True) -> dict:
        doc = self.write(complete=complete)
        self._jsonl.close()
        return doc


def merge_attempts(first: TestRecord, later: list[TestRecord]) -> TestRecord:
    """One record for a test that was re-run: ``first`` (the run's own attempt) and
    ``later`` (the re-runs, in order). Attempts that did not run (skipped) do not count.
    All attempts agree: the outcome stands. They differ: outcome ``flaky``, which keeps
    the failure, seed and repro of the first failing attempt and says the tally."""
    ran = [first] + [r for r in later if r.outcome != Outcome.SKIP.value]
    outcomes = [r.outcome for r in ran]
    tally: dict[str, int] = {}
    for o in outcomes:
        tally[o] = tally.get(o, 0) + 1
    rec = TestRecord.from_dict(first.to_dict())
    rec.attempts, rec.tally = outcomes, tally
    if len(tally) > 1:
        bad = next(r for r in ran if r.outcome != Outcome.PASS.value)
        text = ", ".join(f"{n} {o}" for o, n in tally.items())
        rec.outcome = Outcome.FLAKY.value
        rec.message = (f"flaky: the outcomes of {len(ran)} attempts differ ({text}); "
                       f"the first {bad.outcome}: {bad.message}")
        rec.failure, rec.seed, rec.repro, rec.detail = bad.failure, bad.seed, bad.repro or first.repro, bad.detail
        # a test that failed only sometimes: its repro keeps the default re-runs (it says "flaky")
        rec.repro = rec.repro.replace(" --reruns 0", "")
    return rec


def resummarize(doc: dict, tests: list[TestRecord], claims: Claims, waivers: list[Waiver]) -> dict:
    """``doc`` with ``tests`` in place of its tests (after re-runs changed some of them)
    and its verdicts, counts and warnings computed again from them."""
    quick = bool(doc.get("quick"))
    partial = not doc.get("certifying", True) and not quick
    complete = bool(doc.get("complete"))
    not_run = max(0, int(doc.get("total") or 0) - len(tests)) if complete else 0
    flags = dict(quick=quick, partial=partial, complete=complete, not_run=not_run)
    own = set(summarize(records(doc), claims, waivers, **flags)["warnings"])
    extra = [w for w in doc.get("warnings", []) if w not in own]
    summary = summarize(tests, claims, waivers, **flags)
    out = {**doc, **summary, "tests": [t.to_dict() for t in tests], "updated": now_iso()}
    out["warnings"] = extra + summary["warnings"]
    return out


def load_results(path: str | os.PathLike) -> dict:
    """Read a results.json (raises ValueError with a one-line reason)."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"results file not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read results file {path}: {e}") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ValueError(f"{path} is not a kvx-conform results file")
    major = str(doc.get("schema_version", "0")).split(".")[0]
    if major != SCHEMA_VERSION.split(".")[0]:
        raise ValueError(f"{path}: results schema {doc.get('schema_version')} is not readable by this harness "
                         f"(schema {SCHEMA_VERSION})")
    return doc


def records(doc: dict) -> list[TestRecord]:
    return [TestRecord.from_dict(t) for t in doc.get("tests", [])]
