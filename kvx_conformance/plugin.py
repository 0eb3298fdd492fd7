"""The kvx-conform pytest plugin (``-p kvx_conformance.plugin``).

Suites see it through fixtures:

- ``kvx_provider``      (session) the loaded :class:`~kvx_conformance.loader.Provider`
- ``kvx_memory``        (session) the :class:`~kvx_conformance.abi.Memory` of this run
- ``kvx_call_options``  factory ``kvx_call_options(misalign=0, stream=None, after_call=None)``
                        -> :class:`~kvx_conformance.execute.CallOptions` with the run's memory
- ``kvx_claims``        (session) frozenset of claimed optional feature names
- ``kvx_generator_features`` (session) optional features generated tests may draw
                        (claimed, or served in a probe call: ``kvx_conformance.served``)
- ``kvx_run_config``    (session) :class:`RunConfig`: provider path, memory, quick flag,
                        hypothesis budget, seed, output dir

It runs in two roles. In the *workers* (pytest-xdist processes that call the provider)
it attaches each test's ``kvx`` marker as metadata, turns exceptions into outcomes
(pass, fail, unsupported, skip, error; an UNSUPPORTED answer for a claimed or required
feature is a fail) and skips tests whose entry point the circuit breaker has tripped.
In the *controller* it records every finished test into results.json as it goes,
turns a dead worker into ``crash`` (or ``timeout`` when the test had run for about the
timeout), trips the breaker after ``--kvx-breaker`` crashes/timeouts of one entry
point, and prints a one-line progress.
"""
from __future__ import annotations

import faulthandler
import json
import os
import re
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from . import abi, health
from .claims import Claims, InputFileError, load_claims, load_expectations
from .outcomes import (
    OPTIONAL_FEATURES,
    SHOULD_REFUSE_WITH_UNSUPPORTED,
    ConformanceFailure,
    Outcome,
    Unsupported,
    take_served_calls,
)
from .results import ResultsWriter, TestRecord, _atomic_write_json, first_line

#: marker entry names -> C entry points
ENTRY_FUNCTIONS = {
    "version": "kvx_get_version",
    "validate": "kvx_validate_cache_desc",
    "write": "kvx_write_kv",
    "gather": "kvx_gather_kv",
}
HYPOTHESIS_EXAMPLES = {"full": 100, "quick": 10}
BREAKER_FILE = "breaker.json"
COLLECTION_FILE = "collection.json"
FAULTS_DIR = "faults"
_META = pytest.StashKey[dict]()
_START_MARK = "== kvx-start "
#: characters of captured stdout / stderr kept per test phase (a chatty provider's output is cut)
CAPTURE_TAIL_CHARS = 16 * 1024
#: GPUs and shards (--kvx-gpus, --kvx-shard): kvx_conformance/scale_plugin.py, registered as "kvx-scale"
pytest_plugins = ["kvx_conformance.scale_plugin"]
#: a JSON record the worker writes into its fault log before it ends itself
#: (kind device-fault or late-write) or at start (kind worker: its pid)
_RECORD_MARK = "== kvx-record "
CL_LIFETIME = "spec 7.2 (implementations MUST NOT retain pointers after return); R-LIFETIME"
CL_OUT_OF_BOUNDS = "spec 4.1, 6.2 (a call touches only the buffers its descriptors give it); R-WRITE, R-DATA"


def entry_function(name: str) -> str:
    return ENTRY_FUNCTIONS.get(name, name)


# ----------------------------------------------------------------------------- options


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("kvx", "kvx-conform (normally set by `kvx-conform run`)")
    g.addoption("--kvx-provider", help="provider shared library (default: the bundled reference)")
    g.addoption("--kvx-memory", default="host", choices=["host", "device", "unified"])
    g.addoption("--kvx-output-dir", help="write results.json / results.jsonl / breaker.json here")
    g.addoption("--kvx-claims", help="claims file (YAML/JSON)")
    g.addoption("--kvx-expectations", help="expectations (waivers) file (YAML/JSON)")
    g.addoption("--kvx-quick", action="store_true", help="reduced, non-certifying run")
    g.addoption("--kvx-profile", action="append", default=[], help="run only tests of this profile (repeatable)")
    g.addoption("--kvx-id", action="append", default=[], help="run only this stable id ('*' globs; repeatable)")
    g.addoption("--kvx-nodeids", help="run only the pytest node ids listed in this file, one a line (re-runs)")
    g.addoption("--kvx-seed", type=int, default=None, help="seed for generated cases")
    g.addoption("--kvx-hypothesis-examples", type=int, default=None, help="hypothesis max_examples")
    g.addoption("--kvx-breaker", type=int, default=3, help="crashes/timeouts of one entry point before it is skipped")
    g.addoption("--kvx-run-info", help="JSON header for results.json (written by the CLI)")
    g.addoption("--kvx-repro-extra", default="", help="extra arguments for the repro lines (e.g. --suite X)")
    g.addoption("--kvx-collect-out", help="write the collected tests' metadata to this JSON file")
    g.addoption("--kvx-progress", default="auto", choices=["auto", "tty", "lines", "none"])
    g.addoption("--kvx-sanitize", metavar="WRAPPER",
                help="start the xdist workers through this executable (kvx-conform run --sanitize writes one "
                     "that runs python under compute-sanitizer, logging to faults/sanitizer-<pid>.log)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kvx(id, clause, level, profile, entry, feature): kvx-conform test metadata (outcomes.conformance)"
    )
    config.addinivalue_line("markers", "slow: left out of --quick runs")
    config.addinivalue_line(
        "markers", "kvx_memory_types(*names): collected only for runs on these memory types "
        "(e.g. 'device', 'unified'); a test that has no meaning on the run's memory is not run and not counted")
    is_worker = hasattr(config, "workerinput")
    if not is_worker:
        ctl = _Controller(config)
        config.pluginmanager.register(ctl, "kvx-controller")
        config.stash[_CTL] = ctl
    else:
        given = config.workerinput.get("kvx_state_dir")
        config.stash[_STATE_DIR] = Path(given) if given else _state_dir(config)
    _configure_hypothesis(config)
    if is_worker or not _uses_xdist(config):
        config.pluginmanager.register(_Worker(config), "kvx-worker")


_CTL = pytest.StashKey["_Controller"]()
_STATE_DIR = pytest.StashKey[Path]()


def _uses_xdist(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def _state_dir(config: pytest.Config) -> Path | None:
    """Where controller and workers share state (breaker file, fault logs, collection).

    The output dir when there is one; a temporary dir for an xdist run without one;
    None for a single-process run without one (the breaker then lives in memory).
    """
    if _STATE_DIR in config.stash:
        return config.stash[_STATE_DIR]
    out = config.getoption("kvx_output_dir")
    if out:
        d: Path | None = Path(out)
    elif _uses_xdist(config):
        d = Path(tempfile.mkdtemp(prefix="kvx-state-"))
        config.stash[_TEMP_STATE] = d
    else:
        d = None
    if d is not None:
        d.mkdir(parents=True, exist_ok=True)
    config.stash[_STATE_DIR] = d
    return d


_TEMP_STATE = pytest.StashKey[Path]()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _TEMP_STATE in config.stash:
        import shutil

        shutil.rmtree(config.stash[_TEMP_STATE], ignore_errors=True)


def _configure_hypothesis(config: pytest.Config) -> None:
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:
        return
    rc = run_config(config)
    settings.register_profile(
        "kvx", max_examples=rc.hypothesis_max_examples, deadline=None, database=None,
        derandomize=rc.seed is None, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    settings.load_profile("kvx")


# ----------------------------------------------------------------------------- run config + fixtures


@dataclass(frozen=True)
class RunConfig:
    provider_path: Path | None
    memory: abi.Memory
    quick: bool
    hypothesis_max_examples: int
    seed: int | None
    output_dir: Path | None
    claims: Claims = field(default_factory=Claims)
    timeout_s: float | None = None


_RC = pytest.StashKey[RunConfig]()


def run_config(config: pytest.Config) -> RunConfig:
    if _RC in config.stash:
        return config.stash[_RC]
    quick = bool(config.getoption("kvx_quick"))
    budget = config.getoption("kvx_hypothesis_examples") or HYPOTHESIS_EXAMPLES["quick" if quick else "full"]
    prov = config.getoption("kvx_provider")
    if prov is None:
        try:
            from .native import reference_provider

            prov = str(reference_provider())
        except Exception:
            prov = None
    try:
        claims = load_claims(config.getoption("kvx_claims"))
    except InputFileError as e:
        raise pytest.UsageError(str(e)) from None
    selected = tuple(dict.fromkeys(config.getoption("kvx_profile") or ()))
    if selected and not claims.explicit:  # --profile P names the profiles to certify
        claims = Claims(selected, claims.features, claims.source, explicit=True)
    out = config.getoption("kvx_output_dir")
    rc = RunConfig(
        provider_path=Path(prov) if prov else None,
        memory=abi.Memory[config.getoption("kvx_memory").upper()],
        quick=quick,
        hypothesis_max_examples=int(budget),
        seed=config.getoption("kvx_seed"),
        output_dir=Path(out) if out else None,
        claims=claims,
        timeout_s=getattr(config.option, "timeout", None),
    )
    config.stash[_RC] = rc
    return rc


@pytest.fixture(scope="session")
def kvx_run_config(pytestconfig: pytest.Config) -> RunConfig:
    return run_config(pytestconfig)


@pytest.fixture(scope="session")
def kvx_provider(kvx_run_config: RunConfig):
    from .loader import load_provider

    if kvx_run_config.provider_path is None:
        raise RuntimeError("no provider: pass --kvx-provider (kvx-conform run PROVIDER)")
    return load_provider(kvx_run_config.provider_path)


@pytest.fixture(scope="session")
def kvx_memory(kvx_run_config: RunConfig) -> abi.Memory:
    from .buffers import memory_available

    reason = memory_available(kvx_run_config.memory)
    if reason:
        raise RuntimeError(f"memory type {kvx_run_config.memory.name.lower()} is not available here: {reason}")
    return kvx_run_config.memory


@pytest.fixture
def kvx_call_options(kvx_memory: abi.Memory):
    from .execute import CallOptions

    def make(misalign: int = 0, stream: int | None = None, after_call=None) -> CallOptions:
        return CallOptions(memory=kvx_memory, misalign=misalign, stream=stream, after_call=after_call)

    return make


@pytest.fixture(scope="session")
def kvx_claims(kvx_run_config: RunConfig) -> frozenset[str]:
    return kvx_run_config.claims.features


@pytest.fixture(scope="session")
def kvx_generator_features(kvx_provider, kvx_memory: abi.Memory, kvx_claims: frozenset[str]) -> frozenset[str]:
    """Optional features the generated / differential tests may draw: the provider's core
    layout, what it served in one probe call per feature, and what the vendor claims
    (``kvx_conformance.served``)."""
    from .served import generator_features

    return generator_features(kvx_provider, kvx_memory, kvx_claims)


# ----------------------------------------------------------------------------- metadata


_PYTEST_K_IDENT = re.compile(r"(:?\w|:|\+|-|\.|\[|\]|\\|/)+")


def item_meta(item: pytest.Item, default_timeout: float | None) -> dict:
    m = item.get_closest_marker("kvx")
    callspec = getattr(item, "callspec", None)
    param = f"[{callspec.id}]" if callspec is not None else ""
    if m is not None:
        kw = dict(m.kwargs)
        base = kw.get("id") or item.name
        entry = kw.get("entry") or ()
        meta = {
            "id": base + param, "clause": str(kw.get("clause", "")), "level": str(kw.get("level", "required")),
            "profile": str(kw.get("profile", "core")),
            "entry": [entry_function(e) for e in ((entry,) if isinstance(entry, str) else entry)],
            "feature": kw.get("feature"), "marked": True,
        }
    else:
        meta = {"id": f"unmarked:{item.nodeid}", "clause": "", "level": "informational", "profile": "(unmarked)",
                "entry": [], "feature": None, "marked": False}
    tm = item.get_closest_marker("timeout")
    timeout = tm.args[0] if tm is not None and tm.args else (tm.kwargs.get("timeout") if tm else default_timeout)
    meta.update(nodeid=item.nodeid, name=item.name, timeout=timeout,
                slow=item.get_closest_marker("slow") is not None)
    return meta


def repro_command(config: pytest.Config, meta: dict, seed: int | None) -> str:
    rc = run_config(config)
    parts = ["kvx-conform", "run"]
    if rc.provider_path is not None:
        parts.append(str(rc.provider_path))
    parts += ["--memory", rc.memory.name.lower()]
    name = meta.get("name") or meta["nodeid"].split("::")[-1]
    if _PYTEST_K_IDENT.fullmatch(name):
        parts += ["-k", name]
    else:
        parts += ["--id", meta["id"]]
    if seed is not None:
        parts += ["--seed", str(seed)]
    cmd = " ".join(shlex.quote(p) for p in parts)
    extra = config.getoption("kvx_repro_extra")
    return f"{cmd} {extra}".strip()


# ----------------------------------------------------------------------------- worker role


try:
    _ExceptionGroup: type | tuple = BaseExceptionGroup  # type: ignore[name-defined]  # Python >= 3.11
except NameError:  # pragma: no cover - Python 3.10
    try:
        from exceptiongroup import BaseExceptionGroup as _ExceptionGroup
    except ImportError:
        _ExceptionGroup = ()


def _classify_exception(exc: BaseException) -> str:
    """'fail' for a provider answer the spec does not allow, 'unsupported', or 'error' (harness)."""
    if isinstance(exc, Unsupported):
        return "unsupported"
    if isinstance(exc, (AssertionError, pytest.fail.Exception)):
        return "fail"
    if isinstance(exc, _ExceptionGroup):
        kinds = {_classify_exception(e) for e in exc.exceptions}
        if kinds == {"unsupported"}:
            return "unsupported"
        if kinds <= {"fail", "unsupported"}:
            return "fail"
    return "error"


def _first_of(exc: BaseException, kind: type) -> BaseException | None:
    if isinstance(exc, kind):
        return exc
    for sub in getattr(exc, "exceptions", ()) or ():
        found = _first_of(sub, kind)
        if found is not None:
            return found
    return None


class _Worker:
    """Hooks of the process that runs tests (an xdist worker, or pytest without -n)."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.rc = run_config(config)
        self.state_dir = _state_dir(config)
        self._breaker_mtime: int | None = None
        self._breaker: dict = {}
        self._timeout = getattr(config.option, "timeout", None)
        self._fault_file = None
        if self.state_dir is not None and not config.option.collectonly:
            wid = getattr(config, "workerinput", {}).get("workerid", "main")
            faults = self.state_dir / FAULTS_DIR
            faults.mkdir(parents=True, exist_ok=True)
            # a worker killed by a signal leaves "Fatal Python error: ..." and its stack here
            self._fault_file = open(faults / f"{wid}.log", "a", encoding="utf-8")
            # all threads: a crash in a thread the provider left running shows no "Current thread"
            faulthandler.enable(file=self._fault_file, all_threads=True)
            self._record({"kind": "worker", "pid": os.getpid(), "ppid": os.getppid()})
        self._xdist = hasattr(config, "workerinput")
        self._dead: health.Fault | None = None  # single-process run after a device fault
        self._late_pending: list[dict] = []
        if not config.option.collectonly:
            from . import buffers

            # a worker ends itself on a device fault (xdist replaces it); a single process raises
            health.arm(self.rc.memory != abi.Memory.HOST,
                       handler=self._on_device_fault if self._xdist and self._fault_file is not None else None)
            buffers.QUARANTINE.on = True

    def _record(self, obj: dict) -> None:
        if self._fault_file is not None:
            self._fault_file.write(f"\n{_RECORD_MARK}{json.dumps(obj)}\n")
            self._fault_file.flush()

    def _on_device_fault(self, fault: health.Fault) -> None:
        """A provider call left a sticky device fault: record it and end this worker now, so
        that xdist charges this test and runs the rest in a fresh process (fresh CUDA context)."""
        self._record({**fault.to_dict(), "pid": os.getpid(), "ppid": os.getppid()})
        os._exit(health.EXIT_DEVICE_FAULT)

    # -- collection: metadata, profile / id / quick selection
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config, items: list) -> None:
        profiles = set(config.getoption("kvx_profile") or ())
        ids = list(config.getoption("kvx_id") or ())
        from .claims import Waiver

        id_patterns = [Waiver(i, "") for i in ids]
        only = None
        if config.getoption("kvx_nodeids"):
            only = set(Path(config.getoption("kvx_nodeids")).read_text(encoding="utf-8").splitlines())
        keep, drop = [], []
        for item in items:
            meta = item_meta(item, self._timeout)
            item.stash[_META] = meta
            item.user_properties.append(("kvx.meta", json.dumps(meta)))
            mem_mark = item.get_closest_marker("kvx_memory_types")
            applicable = mem_mark is None or self.rc.memory.name.lower() in mem_mark.args
            selected = applicable and (not profiles or meta["profile"] in profiles) and \
                (not id_patterns or any(p.matches(meta["id"]) for p in id_patterns)) and \
                not (self.rc.quick and meta["slow"]) and (only is None or item.nodeid in only)
            (keep if selected else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
        metas = [it.stash[_META] for it in items]
        seen: set[str] = set()
        dups: set[str] = set()
        for m in metas:
            (dups if m["id"] in seen else seen).add(m["id"])
        dups = sorted(dups)
        doc = {"tests": metas, "duplicate_ids": dups}
        target = config.getoption("kvx_collect_out")
        if target:
            _atomic_write_json(Path(target), doc)
        if self.state_dir is not None:
            _atomic_write_json(self.state_dir / COLLECTION_FILE, doc)

    # -- circuit breaker
    def _tripped(self) -> dict:
        if _CTL in self.config.stash:  # controller in this process
            return self.config.stash[_CTL].tripped
        if self.state_dir is None:
            return {}
        p = self.state_dir / BREAKER_FILE
        try:
            mtime = p.stat().st_mtime_ns
        except FileNotFoundError:
            return {}
        if mtime != self._breaker_mtime:
            try:
                self._breaker = json.loads(p.read_text(encoding="utf-8")).get("tripped", {})
                self._breaker_mtime = mtime
            except (OSError, ValueError):
                pass  # being replaced right now; the next test reads it
        return self._breaker

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem):
        from . import buffers

        # between tests no call is in flight: a changed canary in a freed buffer is a write after return
        buffers.QUARANTINE.sweep()
        self._late_pending += health.take_late_writes()
        health.set_test(item.nodeid)
        limit = item.stash.get(_META, {}).get("timeout") or self._timeout
        if self._fault_file is None:
            limit = None
        else:
            self._fault_file.write(f"\n{_START_MARK}{item.nodeid}\n")
            self._fault_file.flush()
        if limit:
            # a stack of the hang, written just before pytest-timeout kills this worker
            faulthandler.dump_traceback_later(max(float(limit) - 0.25, 0.1), file=self._fault_file)
        try:
            yield
        finally:
            if limit:
                faulthandler.cancel_dump_traceback_later()

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        from . import buffers

        if not buffers.QUARANTINE.on:
            return
        age = buffers.QUARANTINE.youngest_age()
        if age is not None and age < buffers.QUARANTINE.quiet_s:
            time.sleep(buffers.QUARANTINE.quiet_s - age)
        buffers.QUARANTINE.sweep(final=True)
        late, self._late_pending = self._late_pending + health.take_late_writes(), []
        if not late:
            return
        if hasattr(self.config, "workeroutput"):
            self.config.workeroutput["kvx_late_writes"] = json.dumps(late)
        elif _CTL in self.config.stash:
            self.config.stash[_CTL].late_writes_seen(late, None)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if self._dead is not None:
            f = self._dead
            pytest.skip(f"not run: this process's CUDA context was lost to the device fault in {f.entry} "
                        f"({f.error}) during {f.test}; kvx-conform run replaces the worker instead")
        tripped = self._tripped()
        if not tripped:
            return
        for e in item.stash.get(_META, {}).get("entry", ()):
            if e in tripped:
                item.stash[_BREAKER] = e
                pytest.skip(tripped[e]["message"])

    # -- outcomes
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        out = yield
        report = out.get_result()
        # a provider that prints megabytes: keep only the end of each captured stream
        report.sections = [(name, text if len(text) <= CAPTURE_TAIL_CHARS else
                            f"[... {len(text) - CAPTURE_TAIL_CHARS} characters dropped]\n" + text[-CAPTURE_TAIL_CHARS:])
                           for name, text in report.sections]
        meta = item.stash.get(_META, None) or item_meta(item, self._timeout)
        result = self._result(item, call, report, meta)
        served = take_served_calls()
        if call.when == "call":
            result["served_calls"] = served
        if result["outcome"] == Outcome.UNSUPPORTED.value:
            path, lineno, _ = item.location
            report.outcome = "skipped"
            report.longrepr = (str(path), (lineno or 0) + 1, result["message"])
        elif result.get("claimed_unsupported"):
            report.outcome = "failed"
            report.longrepr = result["message"]
        props = [("kvx.result", json.dumps(result))]
        late = health.take_late_writes()
        self._late_pending += late
        if any(x.get("where") == "lifetime" for x in late) and self._xdist and self._fault_file is not None:
            # writes after return: threads the provider left may still write; end this worker
            # (xdist starts a fresh one) and keep the test's own outcome
            self._record({"kind": "late-write", "result": result, "late": self._late_pending, "pid": os.getpid()})
            os._exit(health.EXIT_LATE_WRITE)
        if self._late_pending:
            props.append(("kvx.late_writes", json.dumps(self._late_pending)))
            self._late_pending = []
        report.user_properties = list(report.user_properties) + props

    def _result(self, item: pytest.Item, call: pytest.CallInfo, report, meta: dict) -> dict:
        res: dict = {"when": call.when, "outcome": Outcome.PASS.value, "message": "", "failure": None, "seed": None}
        if call.excinfo is None:
            if report.skipped:  # e.g. xfail
                res.update(outcome=Outcome.SKIP.value, message=str(getattr(report, "wasxfail", "")))
            return res
        exc = call.excinfo.value
        df = _first_of(exc, health.DeviceFault)
        if df is not None:  # single-process run (a worker ends itself before this)
            f = df.fault
            self._dead = f
            res.update(outcome=Outcome.CRASH.value, message=f"{f.message()}; the process's CUDA context is lost",
                       crash=_fault_crash(f.to_dict()), detail=f"case: {f.case}" if f.case else "")
            return res
        if call.excinfo.errisinstance(pytest.skip.Exception):
            res.update(outcome=Outcome.SKIP.value, message=str(getattr(exc, "msg", exc)))
            if _BREAKER in item.stash:
                res["breaker"] = item.stash[_BREAKER]
            return res
        kind = _classify_exception(exc)
        if kind == "unsupported":
            u = _first_of(exc, Unsupported)
            given = getattr(u, "feature", None) or meta.get("feature")
            features = [given] if isinstance(given, str) else list(given or ())
            optional = [f for f in features if f in OPTIONAL_FEATURES]
            unclaimed = [f for f in optional if f not in self.rc.claims.features]
            text = str(u)
            refused_with = getattr(u, "refused_with", "UNSUPPORTED")
            res["refusal"] = refused_with
            if not optional:
                res.update(outcome=Outcome.FAIL.value, claimed_unsupported=True,
                           message=f"answered UNSUPPORTED, but this test checks required behaviour "
                                   f"(no optional feature): {text}")
            elif not unclaimed:
                res.update(outcome=Outcome.FAIL.value, claimed_unsupported=True,
                           message=f"claimed feature{'s' if len(optional) > 1 else ''} {', '.join(optional)} "
                                   f"answered {refused_with}: {text}")
            else:
                # the case uses at least one optional feature the vendor does not claim: acceptable
                res.update(outcome=Outcome.UNSUPPORTED.value, message=f"{refused_with} ({', '.join(unclaimed)}): {text}")
                res["warning"] = refusal_warning(refused_with, unclaimed)
            return res
        if kind == "fail" and call.when == "call":
            cf = _first_of(exc, ConformanceFailure)
            if cf is not None:
                res["failure"] = {"what": cf.what, "expected": cf.expected, "got": cf.got,
                                  "clause": cf.clause, "case": cf.case}
                res["seed"] = cf.seed
                res["message"] = str(cf)
            else:
                res["message"] = call.excinfo.exconly()
            res["outcome"] = Outcome.FAIL.value
            return res
        where = {"setup": "in setup", "teardown": "in teardown"}.get(call.when, "in the test code")
        res.update(outcome=Outcome.ERROR.value,
                   message=f"harness error {where}: {call.excinfo.exconly()}"[:4000])
        return res


_BREAKER = pytest.StashKey[str]()


def refusal_warning(refused_with: str, unclaimed: list[str]) -> str | None:
    """A recommended-level warning for an accepted refusal given as INVALID_ARGUMENT where the
    spec says the answer SHOULD be UNSUPPORTED: every feature that excuses it is one of
    ``outcomes.SHOULD_REFUSE_WITH_UNSUPPORTED`` (4.2 strides, 4.4 alignment)."""
    if refused_with != "INVALID_ARGUMENT" or not unclaimed:
        return None
    if not all(f in SHOULD_REFUSE_WITH_UNSUPPORTED for f in unclaimed):
        return None
    clauses = ", ".join(dict.fromkeys(SHOULD_REFUSE_WITH_UNSUPPORTED[f] for f in unclaimed))
    return (f"refused {', '.join(unclaimed)} with INVALID_ARGUMENT; {clauses} says the answer SHOULD be "
            f"UNSUPPORTED (recommended)")


def _fault_crash(rec: dict) -> dict:
    """The results.json ``crash`` object of a device-fault record."""
    return {"kind": "device-fault", "entry": rec.get("entry") or None, "error": rec.get("error"),
            "error_string": rec.get("error_string"), "case": rec.get("case") or None}


#: loader.Provider methods -> the KVX entry point each calls
_ENTRY_OF_METHOD = {"get_version_raw": "kvx_get_version", "validate_cache_desc": "kvx_validate_cache_desc",
                    "write_kv": "kvx_write_kv", "gather_kv": "kvx_gather_kv"}
_FRAME_RE = re.compile(r'File "[^"]*loader\.py", line \d+ in (\w+)')


def crashed_entry(frames: str) -> str | None:
    """The KVX entry point a crashed/hung worker was inside, from its innermost frames."""
    for m in _FRAME_RE.finditer(frames or ""):
        if m.group(1) in _ENTRY_OF_METHOD:
            return _ENTRY_OF_METHOD[m.group(1)]
    return None


# ----------------------------------------------------------------------------- controller role


def _read_crash_detail(state_dir: Path, worker: str | None, nodeid: str) -> tuple[str, str, list[dict], bool]:
    """From the worker's fault log, for nodeid: the fatal-error line, the innermost frames,
    the records the worker wrote (``_RECORD_MARK``) and whether the dump names the thread
    that crashed (False: it was not a Python thread, i.e. one the provider started)."""
    if not worker or state_dir is None:
        return "", "", [], True
    p = state_dir / FAULTS_DIR / f"{worker}.log"
    try:
        with open(p, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "", "", [], True
    idx = text.rfind(f"{_START_MARK}{nodeid}\n")
    if idx < 0:
        return "", "", [], True
    seg = text[idx:].splitlines()[1:]
    records = []
    for ln in seg:
        if ln.startswith(_RECORD_MARK):
            try:
                records.append(json.loads(ln[len(_RECORD_MARK):]))
            except ValueError:
                pass
    head = next((ln.strip() for ln in seg if ln.startswith(("Fatal Python error", "Timeout ("))), "")
    current = any(ln.startswith("Current thread") for ln in seg)
    blocks, cur = [], []
    for ln in seg:
        if ln.startswith(("Thread 0x", "Current thread", "Stack (")):
            cur = []
            blocks.append(cur)
        elif ln.strip().startswith("File ") and blocks:
            cur.append(ln.strip())
    chosen = next((b for b in blocks if any("_pytest" in ln for ln in b)), blocks[0] if blocks else [])
    frames = []
    for ln in chosen:
        if "/_pytest/" in ln or "/pluggy/" in ln:
            break
        frames.append(ln)
    return head, "\n".join(frames[:8]), records, current or not head.startswith("Fatal Python error")


def sanitizer_excerpt(state_dir: Path | None, pid: int | None, limit: int = 40) -> tuple[str, str]:
    """(first error line, the report's lines) from compute-sanitizer's log of process pid."""
    if state_dir is None or pid is None:
        return "", ""
    try:
        text = (state_dir / FAULTS_DIR / f"sanitizer-{pid}.log").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "", ""
    lines = [ln.removeprefix("========= ").rstrip() for ln in text.splitlines()
             if ln.startswith("=========") and ln.strip("= ")]
    first = next((i for i, ln in enumerate(lines) if ln.startswith(("Invalid ", "Misaligned ", "Out-of-range",
                                                                      "Malloc", "Program hit", "Race",
                                                                      "Uninitialized", "Barrier"))), None)
    if first is None:
        return "", ""
    body = lines[first:first + limit]
    return body[0].strip(), "\n".join(body)


class _Controller:
    """Hooks of the process that schedules tests and writes results."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.rc = run_config(config)
        self.state_dir = _state_dir(config)
        self.out_dir = Path(config.getoption("kvx_output_dir")) if config.getoption("kvx_output_dir") else None
        self.threshold = max(1, int(config.getoption("kvx_breaker")))
        self.timeout = getattr(config.option, "timeout", None)
        self.started: dict[str, float] = {}
        self.phases: dict[str, list[dict]] = {}
        self.metas: dict[str, dict] = {}
        self.done: set[str] = set()
        self.ids: list[str] = []
        self.total: int | None = None
        self.counts = {o.value: 0 for o in Outcome}
        self.breaker_hits: dict[str, list[str]] = {}
        self.tripped: dict[str, dict] = {}
        #: worker id -> the test whose buffers got writes after return in that worker
        self.tainted: dict[str | None, str] = {}
        self._amend: dict[str, dict] = {}  # nodeid -> late-write finding for a test not finished yet
        self._late_printed = 0
        self.t0 = time.monotonic()
        self._last_progress = self.t0
        self._last_line = ""
        self._progress_shown = False
        mode = config.getoption("kvx_progress")
        self.progress_mode = mode
        self.writer: ResultsWriter | None = None
        if self.out_dir is not None:
            try:
                waivers = load_expectations(config.getoption("kvx_expectations"))
            except InputFileError as e:
                raise pytest.UsageError(str(e)) from None
            header = self._header()
            partial = bool(config.getoption("keyword") or config.getoption("kvx_id")
                           or config.getoption("markexpr") or config.getoption("kvx_shard"))
            self.writer = ResultsWriter(self.out_dir, header, claims=self.rc.claims, waivers=waivers,
                                        quick=self.rc.quick, partial=partial)
            (self.out_dir / BREAKER_FILE).unlink(missing_ok=True)

    def _header(self) -> dict:
        info_path = self.config.getoption("kvx_run_info")
        if info_path:
            try:
                return json.loads(Path(info_path).read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise pytest.UsageError(f"cannot read run info {info_path}: {e}") from None
        from . import __version__
        from .loader import sha256_of
        from .preflight import environment

        p = self.rc.provider_path
        return {
            "harness": {"name": "kvx-conform", "version": __version__},
            "provider": {"path": str(p) if p else None,
                         "sha256": sha256_of(p) if p and p.is_file() else None},
            "environment": environment(with_torch=False),
            "memory_types": [self.rc.memory.name.lower()],
            "config": {"memory": self.rc.memory.name.lower(), "quick": self.rc.quick,
                       "hypothesis_max_examples": self.rc.hypothesis_max_examples, "seed": self.rc.seed,
                       "timeout_s": self.timeout},
        }

    # -- xdist: hand the state dir to the workers, learn the collection
    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        node.workerinput["kvx_state_dir"] = str(self.state_dir)

    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        wrapper = config.getoption("kvx_sanitize")
        if wrapper and _uses_xdist(config):  # every worker (and every replacement) starts through it
            config.option.tx = [f"popen//python={shlex.quote(wrapper)}"] * len(config.option.tx or [1])

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        out = getattr(node, "workeroutput", None) or {}
        if out.get("kvx_late_writes"):
            self.late_writes_seen(json.loads(out["kvx_late_writes"]), getattr(node.gateway, "id", None))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        if self.total is None:
            self._set_collection(list(ids))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.total is None and not _uses_xdist(self.config):
            self._set_collection([it.nodeid for it in session.items])

    def _set_collection(self, ids: list[str]) -> None:
        self.ids, self.total = ids, len(ids)
        if self.writer is not None:
            self.writer.total = self.total
            scale = self.config.pluginmanager.get_plugin("kvx-scale")
            shard = scale.shard_info() if scale is not None else None
            if shard is not None:
                self.writer.header["shard"] = shard
        self._print(f"kvx-conform: {self.total} tests", newline=True)

    def pytest_collectreport(self, report) -> None:
        if report.failed and self.writer is not None:
            self.writer.collection_errors.append(f"{report.nodeid or '<root>'}: {first_line(str(report.longrepr))}"
                                                 if report.longrepr else report.nodeid)

    # -- test lifecycle
    def pytest_runtest_logstart(self, nodeid: str, location) -> None:
        self.started[nodeid] = time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid in self.done:
            return
        props = dict(report.user_properties or ())
        if "kvx.meta" in props and report.nodeid not in self.metas:
            self.metas[report.nodeid] = json.loads(props["kvx.meta"])
        if "kvx.late_writes" in props:
            self.late_writes_seen(json.loads(props["kvx.late_writes"]),
                                  getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None))
        if report.when == "???" or "kvx.crash" in props:
            crash = json.loads(props["kvx.crash"]) if "kvx.crash" in props else {
                "when": "call", "outcome": Outcome.CRASH.value, "message": str(report.longrepr)}
            self._finish(report.nodeid, self.phases.pop(report.nodeid, []) + [crash], getattr(report, "node", None))
            return
        res = json.loads(props["kvx.result"]) if "kvx.result" in props else {
            "when": report.when, "outcome": {"passed": "pass", "skipped": "skip"}.get(report.outcome, "error"),
            "message": str(report.longrepr or "")[:2000]}
        res["duration"] = report.duration
        self.phases.setdefault(report.nodeid, []).append(res)
        if report.when == "teardown":
            self._finish(report.nodeid, self.phases.pop(report.nodeid), getattr(report, "node", None))

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report, sched) -> None:
        worker = getattr(getattr(report, "node", None), "gateway", None)
        wid = getattr(worker, "id", None)
        elapsed = time.monotonic() - self.started.get(crashitem, time.monotonic())
        meta = self._meta(crashitem)
        limit = (meta or {}).get("timeout") or self.timeout
        head, frames, records, in_python_thread = _read_crash_detail(self.state_dir, wid, crashitem)
        res = self.crash_result(crashitem, wid, elapsed, limit, head, frames, records, in_python_thread)
        report.longrepr = res["message"]
        report.user_properties = [("kvx.crash", json.dumps(res))]

    def crash_result(self, nodeid: str, wid: str | None, elapsed: float, limit, head: str, frames: str,
                     records: list[dict], in_python_thread: bool = True) -> dict:
        """The phase result of a test whose worker ended while running it (see docs/device-faults.md)."""
        fault = next((r for r in records if r.get("kind") == "device-fault"), None)
        late = next((r for r in records if r.get("kind") == "late-write"), None)
        if late is not None:
            # the worker ended itself after this test saw writes after return: its outcome stands
            res = dict(late.get("result") or {"when": "call", "outcome": Outcome.FAIL.value, "message": ""})
            res["message"] = (res.get("message") or "") + \
                f"\n(writes after return: worker '{wid}' was replaced, a fresh process runs the remaining tests)"
            res["duration"] = elapsed
            self.late_writes_seen(late.get("late") or [], wid, replaced=True)
            return res
        if fault is not None:
            sane_head, sane = self._sanitizer_report(fault)
            crash = _fault_crash(fault)
            msg = (f"device fault in {fault.get('entry') or 'a provider call'}: {fault.get('error')} "
                   f"({fault.get('error_string')}) while running {nodeid}; worker '{wid}' was replaced, "
                   f"a fresh CUDA context runs the remaining tests")
            if sane_head:
                msg += f"\ncompute-sanitizer: {sane_head}"
                crash["sanitizer"] = sane_head
            detail = "\n".join(x for x in (f"case: {fault['case']}" if fault.get("case") else "", sane) if x)
            res = {"when": "call", "outcome": Outcome.CRASH.value, "message": msg, "detail": detail,
                   "duration": elapsed, "crash": crash}
        elif limit and elapsed >= 0.9 * float(limit):
            msg = f"timeout: still running after {elapsed:.1f} s (limit {float(limit):g} s); worker '{wid}' was stopped"
            res = {"when": "call", "outcome": Outcome.TIMEOUT.value, "message": msg, "detail": frames,
                   "duration": elapsed, "crash": {"kind": "timeout", "entry": crashed_entry(frames)}}
        else:
            kind = "signal" if head.startswith("Fatal Python error") else "exit"
            msg = f"worker '{wid}' crashed while running {nodeid}" + (f": {head}" if head else
                                                                     ": the process exited (no fatal signal)")
            crash = {"kind": kind, "entry": crashed_entry(frames)}
            if not in_python_thread:
                crash["thread"] = "provider"
                crash["possible_cause"] = "a thread the provider left running (not inside any call)"
                msg += "; it happened in a thread the provider started, not inside a call of this test"
            res = {"when": "call", "outcome": Outcome.CRASH.value, "message": msg, "detail": frames,
                   "duration": elapsed, "crash": crash}
        if wid in self.tainted:
            cause = f"writes after return detected in {self.tainted[wid]}"
            res["crash"]["possible_cause"] = cause
            res["message"] = f"possibly caused by {cause}: " + res["message"]
        return res

    def _sanitizer_report(self, fault: dict) -> tuple[str, str]:
        """compute-sanitizer's report of the faulting worker (--sanitize): its log is named by the
        sanitizer's pid (the worker's parent) or the worker's; the sanitizer may still be writing
        it when the worker is found dead, so wait a little. Else the newest unclaimed log with an error."""
        if not self.config.getoption("kvx_sanitize") or self.state_dir is None:
            return "", ""
        claimed = getattr(self, "_sanitizer_claimed", set())
        self._sanitizer_claimed = claimed
        deadline = time.monotonic() + 5.0
        while True:
            for pid in (fault.get("ppid"), fault.get("pid")):
                head, body = sanitizer_excerpt(self.state_dir, pid)
                if body:
                    claimed.add(pid)
                    return head, body
            if time.monotonic() >= deadline:
                break
            time.sleep(0.25)
        # the sanitizer names its log by a pid of its own: find the log whose host backtrace names this
        # test's function, else take the newest unclaimed one
        logs = sorted((self.state_dir / FAULTS_DIR).glob("sanitizer-*.log"), key=lambda p: p.stat().st_mtime,
                      reverse=True)
        func = (fault.get("test") or "").split("::")[-1].split("[")[0]
        found = []
        for log in logs:
            pid = int(log.stem.split("-")[-1]) if log.stem.split("-")[-1].isdigit() else None
            if pid in claimed:
                continue
            head, body = sanitizer_excerpt(self.state_dir, pid)
            if body:
                found.append((pid, head, body))
        for pid, head, body in sorted(found, key=lambda f: not (func and f" {func} in " in f[2])):
            claimed.add(pid)
            return head, body
        return "", ""

    def late_writes_seen(self, findings: list[dict], wid: str | None, replaced: bool = False) -> None:
        """Writes after return a worker reported: listed in results.json ``late_writes``; the
        owning test fails (when it had passed); later crashes of the worker are marked."""
        for f in findings:
            owner = f.get("owner") or ""
            owner_id = (self._meta(owner) or {}).get("id", owner)
            seen = f.get("seen_in") or ""
            row = {"test": owner_id, "nodeid": owner, "what": f.get("what", ""), "where": f.get("where", ""),
                   "seen_in": (self._meta(seen) or {}).get("id", seen), "worker": wid, "worker_replaced": replaced}
            stray = f.get("where") == "during-call"
            if stray:  # a write outside the call's own buffers while it ran: the calling test's fault
                if owner:
                    self._amend_late(owner, row)
                continue
            if self.writer is not None:
                self.writer.late_writes.append(row)
            self.tainted.setdefault(wid, owner_id)
            if self._late_printed < 5:
                self._late_printed += 1
                self._print(f"LATE-WRITE writes after return in the buffers of {owner_id}: {row['what']}"
                            + (f" (worker '{wid}' replaced)" if replaced else ""), newline=True)
            if f.get("where") != "lifetime" and owner:
                self._amend_late(owner, row)

    def _amend_late(self, nodeid: str, row: dict) -> None:
        rec = next((t for t in (self.writer.tests if self.writer else []) if t.nodeid == nodeid), None)
        if rec is None:
            if nodeid not in self.done:
                self._amend.setdefault(nodeid, row)
            return
        if rec.outcome in (Outcome.FAIL.value, Outcome.CRASH.value, Outcome.TIMEOUT.value, Outcome.ERROR.value):
            return
        self.counts[rec.outcome] -= 1
        self.counts[Outcome.FAIL.value] += 1
        rec.outcome = Outcome.FAIL.value
        if row.get("where") == "during-call":
            rec.message = f"a call of this test wrote outside the buffers it was given: {row['what']}"
            rec.failure = {"what": "the provider wrote outside the call's buffers",
                           "expected": "writes only inside the cache / output buffers of the call",
                           "got": row["what"], "clause": CL_OUT_OF_BOUNDS, "case": ""}
        else:
            rec.message = (f"the provider wrote into this test's buffers after its call returned: {row['what']} "
                           f"(seen after the test, before {row['seen_in'] or 'the end of the worker'})")
            rec.failure = {"what": "the provider wrote after returning", "expected": "no write after return",
                           "got": row["what"], "clause": CL_LIFETIME, "case": ""}
        rec.repro = repro_command(self.config, self._meta(nodeid) or {"id": rec.id, "nodeid": nodeid}, rec.seed)
        if self.writer is not None:
            self.writer.amend(rec)
        self._event(rec)

    def _meta(self, nodeid: str) -> dict | None:
        if nodeid in self.metas or self.state_dir is None:
            return self.metas.get(nodeid)
        try:
            doc = json.loads((self.state_dir / COLLECTION_FILE).read_text(encoding="utf-8"))
            for m in doc.get("tests", []):
                self.metas.setdefault(m["nodeid"], m)
        except (OSError, ValueError):
            pass
        return self.metas.get(nodeid)

    def _finish(self, nodeid: str, phases: list[dict], node) -> None:
        self.done.add(nodeid)
        meta = self._meta(nodeid) or {"id": nodeid, "clause": "", "level": "informational",
                                      "profile": "(unknown)", "entry": [], "feature": None, "nodeid": nodeid}
        deciding = next((p for p in phases if p["outcome"] != Outcome.PASS.value), None)
        outcome = deciding["outcome"] if deciding else Outcome.PASS.value
        call_fail = deciding is not None and deciding.get("when") == "call"
        td = next((p for p in phases if p.get("when") == "teardown" and p["outcome"] != Outcome.PASS.value), None)
        message = deciding.get("message", "") if deciding else ""
        if td is not None and call_fail and td is not deciding:
            message += f"\n(also: {first_line(td.get('message'))})"
        seed = next((p.get("seed") for p in phases if p.get("seed") is not None), None)
        failure = next((p.get("failure") for p in phases if p.get("failure")), None)
        worker = getattr(getattr(node, "gateway", None), "id", None)
        scale = self.config.pluginmanager.get_plugin("kvx-scale")
        rec = TestRecord(
            id=meta["id"], nodeid=nodeid, clause=meta.get("clause", ""), level=meta.get("level", "required"),
            profile=meta.get("profile", "core"), entry=list(meta.get("entry", [])), feature=meta.get("feature"),
            outcome=outcome, message=message,
            repro=repro_command(self.config, meta, seed) if outcome != Outcome.PASS.value else "",
            duration=round(sum(float(p.get("duration") or 0) for p in phases), 4), seed=seed, failure=failure,
            breaker=next((p.get("breaker") for p in phases if p.get("breaker")), None), worker=worker,
            detail=next((p.get("detail") for p in phases if p.get("detail")), ""),
            gpu=scale.gpu_of(worker) if scale is not None else None,
            refusal=next((p.get("refusal") for p in phases if p.get("refusal")), None),
            warning=next((p.get("warning") for p in phases if p.get("warning")), None),
            served_calls=next((p["served_calls"] for p in phases if p.get("served_calls") is not None), None),
            crash=next((p.get("crash") for p in phases if p.get("crash")), None),
        )
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        if self.writer is not None:
            self.writer.add(rec)
        if nodeid in self._amend:
            self._amend_late(nodeid, self._amend.pop(nodeid))
        if outcome in (Outcome.CRASH.value, Outcome.TIMEOUT.value) and not (rec.crash or {}).get("possible_cause"):
            self._breaker_hit(rec)
        self._event(rec)
        self._progress()

    def _breaker_hit(self, rec: TestRecord) -> None:
        # charge the entry point the worker was inside when it crashed or hung (its stack
        # names the loader method), else every entry point the test lists
        inside = (rec.crash or {}).get("entry") or crashed_entry(rec.detail)
        for e in ([inside] if inside in rec.entry else rec.entry):
            hits = self.breaker_hits.setdefault(e, [])
            hits.append(rec.id)
            if len(hits) >= self.threshold and e not in self.tripped:
                msg = f"not run: {e} crashed/timed out {len(hits)} times"
                self.tripped[e] = {"count": len(hits), "tests": list(hits), "message": msg}
                if self.state_dir is not None:
                    _atomic_write_json(self.state_dir / BREAKER_FILE, {"tripped": self.tripped})
                self._print(f"circuit breaker: {e} crashed/timed out {len(hits)} times "
                            f"({', '.join(hits[:3])}); remaining tests calling it are skipped", newline=True)
        if self.writer is not None:
            self.writer.breaker = {e: {"tripped": e in self.tripped, "count": len(h), "tests": h,
                                       "message": self.tripped.get(e, {}).get("message", "")}
                                   for e, h in self.breaker_hits.items()}

    # -- console
    def _tr(self):
        return self.config.pluginmanager.getplugin("terminalreporter")

    def _print(self, line: str, newline: bool = False) -> None:
        if self.progress_mode == "none":
            return
        tr = self._tr()
        if tr is None:
            print(line, file=sys.stderr, flush=True)
            return
        if self._progress_shown and self._is_tty():
            tr.write("\r\x1b[2K")
        tr.write_line(line) if newline else tr.write(line)
        tr.flush() if hasattr(tr, "flush") else None
        self._progress_shown = False

    def _is_tty(self) -> bool:
        if self.progress_mode == "tty":
            return True
        if self.progress_mode == "lines":
            return False
        tr = self._tr()
        return bool(tr is not None and getattr(tr, "isatty", False))

    def _event(self, rec: TestRecord) -> None:
        if rec.outcome in ("pass", "skip", "unsupported"):
            return
        if rec.outcome == "fail" and rec.level == "informational":
            return
        tag = rec.outcome.upper()
        self._print(f"{tag:<8} {rec.level:<12} {rec.id}  ({rec.clause})  {first_line(rec.message)[:120]}",
                    newline=True)

    def progress_line(self) -> str:
        done = len(self.done)
        total = self.total or 0
        pct = int(100 * done / total) if total else 0
        c = self.counts
        parts = [f"{k} {c.get(k, 0)}" for k in ("pass", "fail", "unsupported", "skip", "crash", "timeout", "error")]
        return f"[{done}/{total}] {pct:3d}% " + " ".join(parts) + f"  {time.monotonic() - self.t0:.0f}s"

    def _progress(self, force: bool = False) -> None:
        if self.progress_mode == "none":
            return
        now = time.monotonic()
        done, total = len(self.done), self.total or 0
        tr = self._tr()
        if tr is None:
            return
        if self._is_tty():
            if force or now - self._last_progress > 0.1 or done == total:
                tr.write("\r\x1b[2K" + self.progress_line())
                self._progress_shown = True
                self._last_progress = now
        elif force or done == total or now - self._last_progress >= 10 or (
                total >= 20 and done % max(1, total // 10) == 0):
            line = self.progress_line()
            if line.split("  ")[0] != self._last_line.split("  ")[0]:  # not the same counts again
                tr.write_line(line)
            self._last_line = line
            self._last_progress = now

    # -- end of the run
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus) -> None:
        interrupted = int(exitstatus) == int(pytest.ExitCode.INTERRUPTED) and not (
            self.writer and self.writer.collection_errors)
        missing = [n for n in self.ids if n not in self.done]
        if missing and not interrupted:
            for nodeid in missing:
                meta = self._meta(nodeid) or {"id": nodeid, "nodeid": nodeid}
                self.done.add(nodeid)
                rec = TestRecord(id=meta["id"], nodeid=nodeid, clause=meta.get("clause", ""),
                                 level=meta.get("level", "required"), profile=meta.get("profile", "core"),
                                 entry=list(meta.get("entry", [])), feature=meta.get("feature"),
                                 outcome=Outcome.SKIP.value,
                                 message="not run: the run stopped before this test (workers kept crashing)")
                self.counts["skip"] += 1
                if self.writer is not None:
                    self.writer.add(rec)
        if self._progress_shown and self._is_tty():
            self._tr().write_line("")
            self._progress_shown = False
        elif self.total:
            self._progress(force=True)
        if self.writer is not None:
            self.writer.close(complete=not interrupted and not self.writer.collection_errors)

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report, config):
        # The controller prints its own progress line: keep pytest's letters off the console.
        if report.when == "call" or report.when == "???":
            return report.outcome, "", ""
        if report.outcome != "passed":
            return ("error" if report.failed else report.outcome), "", ""
        return "", "", ""
