"""The worker side: run tests against the provider, turn exceptions into outcomes, honour the circuit breaker."""
from __future__ import annotations

import faulthandler
import json
import os
import re
import time
from pathlib import Path

import pytest

from ...abi import header as abi, health
from ...results.outcomes import (
    OPTIONAL_FEATURES,
    SHOULD_REFUSE_WITH_UNSUPPORTED,
    ConformanceFailure,
    Outcome,
    Unsupported,
    take_served_calls,
)
from ...results.record import _atomic_write_json
from .config import (
    BREAKER_FILE,
    CAPTURE_TAIL_CHARS,
    COLLECTION_FILE,
    FAULTS_DIR,
    _CTL,
    _META,
    _RECORD_MARK,
    _START_MARK,
    _state_dir,
    run_config,
    whole_selection,
)
from .metadata import item_meta


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
            from ...abi import buffers

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
        from ...results.claims import Waiver

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
        from ...abi import buffers

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
        from ...abi import buffers

        if not buffers.QUARANTINE.on:
            return
        # a run that can certify watches the last tests' buffers as long as every other test's
        # (hold_s: a late writer past the lifetime test's wait is seen at the end of a run too);
        # a narrowed run only until they are quiet
        settle = buffers.QUARANTINE.hold_s if whole_selection(self.config) else buffers.QUARANTINE.quiet_s
        age = buffers.QUARANTINE.youngest_age()
        if age is not None and age < settle:
            time.sleep(settle - age)
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
