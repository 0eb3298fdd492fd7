"""The controller side.

Record every finished test into results.json, turn dead workers into crash or timeout, trip the
breaker, print progress and the summary.
"""
from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import pytest

from ...abi.buffers import LATER_TEST
from ...results.claims import InputFileError, load_expectations
from ...results.outcomes import Outcome
from ...results.record import RUN_WIDE_PREFIX, ResultsWriter, TestRecord, _atomic_write_json, bundled_suite, first_line
from .config import (
    BREAKER_FILE,
    CL_LIFETIME,
    COLLECTION_FILE,
    FAULTS_DIR,
    _RECORD_MARK,
    _START_MARK,
    _state_dir,
    _uses_xdist,
    run_config,
)
from .metadata import repro_base, repro_command, repro_tail
from .worker import _fault_crash, crashed_entry




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



#: entry points whose inputs and descriptors are sealed read-only during the call (execute._Arena.sealed)
_SEALED_ENTRIES = ("kvx_write_kv", "kvx_gather_kv", "kvx_validate_cache_desc")

def crash_failure(outcome: str, message: str, entry: str | None, clause: str, timeout_s: float | None) -> dict:
    """The four parts of a crash or a timeout, like a ConformanceFailure's: what, expected, got
    (the message's first line: the signal or the time, and the worker), clause (the test's)."""
    where = entry or "a provider call"
    if outcome == Outcome.CRASH.value:
        what = f"the provider crashed in {where}"
        expected = "every call returns a kvx_status_t (spec 8) and the process lives on"
    else:
        limit = f" ({timeout_s:g} s)" if timeout_s else ""
        what = f"the provider did not return from {where}"
        expected = f"the test's calls return within the timeout{limit}"
    return {"what": what, "expected": expected, "got": first_line(message)[:400], "clause": clause, "case": ""}


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
        #: worker -> collection indices of the tests xdist could not send it (its process was gone)
        self._unsent: dict[object, set[int]] = {}
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
                           or config.getoption("markexpr") or config.getoption("kvx_shard")
                           or not bundled_suite(header))
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
        from ... import __version__
        from ...abi.loader import sha256_of
        from ..preflight import environment

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
        self._guard_sends(node)

    def _guard_sends(self, node) -> None:
        """A command xdist sends to a worker whose process is already gone is dropped, not an
        internal error. Two workers that crash together: xdist takes the first down
        (``DSession.worker_errordown`` -> ``LoadScheduling.remove_node``) and hands its tests at once
        to the other (``check_schedule`` -> ``node.send_runtest_some``), whose death its channel
        has not reported yet (``WorkerController._down`` still False): the write fails with
        ``OSError: cannot send (already closed?)`` and, uncaught, ended the run as INTERNALERROR
        (exit 12). Nothing else need be done: the tests stay the dead worker's pending ones, and
        the channel's end, which always follows, takes it down the usual way (``worker_errordown``):
        its running test is its crash, the rest go to a live or a replacement worker.

        Why a wrapper around this node's ``sendcommand``: xdist has no hook between the scheduler
        and the send, and whether the process is gone is known only when the write fails (a check
        before it would race with the crash); every scheduler's sends (runtests, runtests_all,
        steal, shutdown) go through it. It wraps this one object, not xdist's class."""
        send = node.sendcommand

        def sendcommand(name: str, **kwargs: object) -> None:
            try:
                send(name, **kwargs)
            except OSError:
                if name == "runtests":
                    self._unsent.setdefault(node, set()).update(kwargs.get("indices") or ())

        node.sendcommand = sendcommand

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
        if "kvx.unsent" in props:  # rescheduled: pytest_handlecrashitem
            return
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
        unsent = self._unsent.get(getattr(report, "node", None))
        collection = getattr(sched, "collection", None) or []
        if unsent and crashitem in collection and collection.index(crashitem) in unsent \
                and hasattr(sched, "mark_test_pending"):
            # the worker was gone before this test reached it (it died between tests): not this test's
            # crash; it runs on another worker (the hook's documented way to reschedule)
            sched.mark_test_pending(crashitem)
            report.outcome = "rerun"
            report.user_properties = [("kvx.unsent", "1")]
            return
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
            elif crash["entry"] in _SEALED_ENTRIES and self.rc.memory.name == "HOST":
                msg += ("; a call's input buffers and descriptors are read-only while it runs on host memory "
                        "(R-INPUTS: spec 7.2, kvx_abi.h const) and each descriptor ends at an unmapped page (R-SIZE), "
                        "so a store into an input, or a read past a descriptor's size, ends the worker inside the call")
                if "read_within_bounds" in nodeid:
                    msg += ("; here one input ends where an inaccessible page begins, so a read past the elements "
                            "its descriptor counts (several loaded at a time with no tail loop) ends it too (R-INPUTS)")
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
            if f.get("where") == LATER_TEST:
                # an earlier test's freed buffer written while a later test ran: that test's out-of-bounds
                # write, or a late write of the owner's thread; the timing cannot tell which, so it is
                # listed and charged to no test (the guards, the results and the lifetime tests judge both)
                if self.writer is not None:
                    self.writer.late_writes.append(row)
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
        if failure is None and outcome in (Outcome.CRASH.value, Outcome.TIMEOUT.value):
            crash = next((p.get("crash") for p in phases if p.get("crash")), None) or {}
            detail = next((p.get("detail") for p in phases if p.get("detail")), "")
            failure = crash_failure(outcome, message, crash.get("entry") or crashed_entry(detail),
                                    meta.get("clause", ""), self.rc.timeout_s)
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
            self._run_wide_late_writes()
            self.writer.close(complete=not interrupted and not self.writer.collection_errors)

    #: the record of writes into freed buffers charged to no single test (docs/device-faults.md)
    RUN_LATE_ID = "lifetime.freed_buffers_untouched"

    def _run_wide_late_writes(self) -> None:
        """A buffer freed by one test and written while a later test ran is a write after return
        (spec 7.2) or an out-of-bounds write of the later test; which one, the timing cannot tell,
        so no single test is charged, but the run is: one required record fails, naming both
        tests, in the profile of the test whose buffer was written (a profile the run holds: a
        provider that writes into freed memory is never certified)."""
        rows = [w for w in self.writer.late_writes if w.get("where") == LATER_TEST]
        if not rows:
            return
        first = rows[0]
        profile = (self._meta(first.get("nodeid") or "") or {}).get("profile") or "concurrency"
        # both tests, in one worker, with the run's claims / suite / timeout (repro_tail)
        parts = repro_base(self.config) + ["--id", first["test"]]
        if first.get("seen_in") and first["seen_in"] != first["test"]:
            parts += ["--id", first["seen_in"]]
        got = (f"{len(rows)} finding(s); first: a buffer of {first['test']} written while "
               f"{first.get('seen_in') or 'a later test'} ran: {first['what']}")
        rec = TestRecord(
            id=self.RUN_LATE_ID, nodeid=f"{RUN_WIDE_PREFIX}{self.RUN_LATE_ID}", clause=CL_LIFETIME, level="required",
            profile=profile, entry=["write", "gather"], feature=None, outcome=Outcome.FAIL.value,
            message=f"buffers the harness had freed were written while later tests ran: writes after return, or "
                    f"out-of-bounds writes of the later tests ({got})",
            repro=f"{' '.join(shlex.quote(p) for p in parts)} {repro_tail(self.config)}".strip(),
            failure={"what": "freed buffers were written", "got": got, "clause": CL_LIFETIME, "case": "",
                     "expected": "no byte of a buffer written after the call that used it returned"})
        self.counts[Outcome.FAIL.value] += 1
        self.writer.add(rec)

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report, config):
        # The controller prints its own progress line: keep pytest's letters off the console.
        if report.when == "call" or report.when == "???":
            return report.outcome, "", ""
        if report.outcome != "passed":
            return ("error" if report.failed else report.outcome), "", ""
        return "", "", ""
