"""`kvx-conform` end to end, as a vendor runs it: subprocesses of the real console script.

- bad inputs (missing file, not a shared library, no KVX entry points, ABI major 2):
  one line on stderr, no traceback, the exit code docs/exit-codes.md gives;
- hostile providers (segfault / abort / hang on every write or gather; OK-to-everything
  no-op): the run survives, records crash / timeout / fail outcomes in results.json,
  ends "not certified", and the circuit breaker stops calling an entry point after
  3 crashes or timeouts ("not run: ..." in results.json and the report);
- --quick ("not certifying"), list, info, report (re-render), --claims (UNSUPPORTED on
  a claimed feature is a fail), --expectations (waivers on the certificate, unknown
  waivers warned).

Hostile runs select one suite module with ``--suite FILE`` (or the core profile) and a
short ``--timeout`` to stay fast. The providers are the mutants and the hostile test
providers of csrc/testing (built by the package build).
"""
from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvx_conformance.abi import loader, native
from kvx_conformance.harness.plugin.controller import _Controller
from kvx_conformance.results.certificate import suite_root

sys.path.insert(0, str(Path(__file__).parent))
from schema_doc import undocumented  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SUITES = suite_root("kvx_conformance.suites")
CONFORMANCE = SUITES / "conformance"
BREAKER = 3  # the run command's default --breaker


def kvx_cmd() -> list[str]:
    script = Path(sys.executable).with_name("kvx-conform")
    return [str(script)] if script.exists() else [sys.executable, "-m", "kvx_conformance.cli"]


def kvx(*args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, float]:
    if args[:1] == ("run",) and "--reruns" not in args:
        args = (*args, "--reruns", "0")  # the hostile providers here fail deterministically (re-runs: test_hostile_habits.py)
    t0 = time.monotonic()
    p = subprocess.run([*kvx_cmd(), *args], capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t0


def lib(kind: str, name: str) -> str:
    path = native.mutant_provider(name) if kind == "mutant" else native.testing_provider(name)
    if not path.exists():
        pytest.fail(f"{path} is not built: the package build (csrc/{'mutants' if kind == 'mutant' else 'testing'}) "
                    f"must produce it")
    return str(path)


def explain(p: subprocess.CompletedProcess) -> str:
    return f"exit {p.returncode}\n--- stdout (tail)\n{p.stdout[-3000:]}\n--- stderr (tail)\n{p.stderr[-3000:]}"


def results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- bad inputs


def _bad_inputs(tmp: Path) -> dict[str, tuple[str, int, str]]:
    text = tmp / "notes.so"
    text.write_text("this is not an ELF file\n")
    return {
        "missing file": (str(tmp / "no-such-provider.so"), loader.EXIT_NOT_FOUND, "provider not found"),
        "not a shared library": (str(text), loader.EXIT_NOT_A_LIBRARY, "not a shared library"),
        "no KVX entry points": (lib("testing", "no_entry_points"), loader.EXIT_NOT_A_PROVIDER,
                                "lacks kvx_write_kv, kvx_gather_kv"),
        "ABI major 2": (lib("testing", "major2"), loader.EXIT_INCOMPATIBLE, "ABI 2.0.0"),
    }


@pytest.mark.parametrize("command", ["run", "info"])
def test_bad_inputs_one_line_and_distinct_exit_codes(tmp_path, command):
    cases = _bad_inputs(tmp_path)
    codes = {}
    for what, (path, code, words) in cases.items():
        args = [command, path] + (["--output-dir", str(tmp_path / "out")] if command == "run" else [])
        p, _ = kvx(*args, timeout=120)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == code, f"{what}: expected exit {code}, got {explain(p)}"
        assert len(lines) == 1, f"{what}: expected one line on stderr, got {len(lines)}: {p.stderr!r}"
        assert lines[0].startswith("kvx-conform: ") and words in lines[0], \
            f"{what}: expected 'kvx-conform: ...{words}...', got {lines[0]!r}"
        assert "Traceback" not in p.stdout + p.stderr, f"{what}: traceback\n{explain(p)}"
        codes[what] = p.returncode
    assert len(set(codes.values())) == len(codes), f"exit codes not distinct: {codes}"
    assert not (tmp_path / "out" / "results.json").exists(), "a refused provider must not leave results"


def test_exit_codes_documented():
    doc = (ROOT / "docs" / "exit-codes.md").read_text(encoding="utf-8")
    consts = {k: v for k, v in vars(loader).items() if k.startswith("EXIT_")}
    for name, value in consts.items():
        assert re.search(rf"\|\s*`?{value}`?\s*\|.*`{name}`", doc), \
            f"docs/exit-codes.md has no row for {name} = {value}"
    assert len(set(consts.values())) == len(consts), f"two exit codes share a value: {consts}"


# ----------------------------------------------------------------------------- hostile providers


HOSTILE = [
    # (id, kind, library, suite module, entry point, outcome, --timeout); a provider that
    # segfaults on every write: test_segv_on_write_core_profile_goes_on
    ("abort_on_gather", "mutant", "abort_on_gather", "test_s5_gather_tables.py", "kvx_gather_kv", "crash", 10),
    ("segv_on_gather", "testing", "segv_on_gather", "test_s5_gather_tables.py", "kvx_gather_kv", "crash", 10),
    ("hang_on_write", "mutant", "hang_on_write", "test_s5_slots.py", "kvx_write_kv", "timeout", 1),
    ("hang_on_gather", "testing", "hang_on_gather", "test_s5_gather_tables.py", "kvx_gather_kv", "timeout", 1),
]


def check_breaker_run(p, out: Path, entry: str, outcome: str, workers: int) -> dict:
    """The shared assertions of a run against a provider that crashes or hangs in ``entry``."""
    assert p.returncode == loader.EXIT_NOT_CERTIFIED, explain(p)
    doc = results(out)
    tests = doc["tests"]
    assert doc["complete"] and doc["finished"] == doc["total"] == len(tests) > 0, \
        f"every collected test must have a record: total {doc['total']}, finished {doc['finished']}"
    # a module of the suite (--suite): never a certification, but its profiles say what failed
    assert doc["verdict"] == "not certifying (partial selection)" and not doc["certifying"], doc["verdict"]
    assert not doc["config"]["bundled_suite"]
    assert any(v["verdict"] == "not certified" for v in doc["profiles"].values()), doc["profiles"]
    hit = [t for t in tests if t["outcome"] == outcome and entry in t["entry"]]
    # the breaker trips after BREAKER hits; tests already running on other workers may add workers - 1
    assert BREAKER <= len(hit) <= BREAKER + workers - 1, \
        f"expected {BREAKER}..{BREAKER + workers - 1} {outcome} outcomes of {entry}, got {len(hit)}: " \
        f"{[t['id'] for t in hit]}"
    for t in hit:
        assert t["repro"].startswith("kvx-conform run "), t
        # the four parts of a failure, for a crash or a timeout too (what, expected, got, clause)
        f = t["failure"]
        assert f and f["what"].endswith(entry) and f["expected"] and f["got"] and f["clause"] == t["clause"], t
        if outcome == "crash":
            assert "crashed while running" in t["message"], t["message"]
        else:
            assert t["message"].startswith("timeout: still running"), t["message"]
    b = doc["breaker"].get(entry) or {}
    assert b.get("tripped") and b.get("count", 0) >= BREAKER, f"breaker of {entry} not tripped: {doc['breaker']}"
    not_run = [t for t in tests if t["outcome"] == "skip" and t.get("breaker") == entry]
    assert not_run, f"no test recorded as not run by the breaker of {entry}"
    for t in not_run:
        assert t["message"].startswith(f"not run: {entry} crashed/timed out"), t["message"]
    others = [t for t in tests if t not in hit and t not in not_run]
    assert all(t["outcome"] != "error" for t in tests), [t for t in tests if t["outcome"] == "error"][:2]
    cert = json.loads((out / "certificate.json").read_text(encoding="utf-8"))
    assert cert["verdict"] == doc["verdict"] and entry in cert["breaker"], cert
    assert undocumented(doc, "results") == [] and undocumented(cert, "certificate") == [], \
        "keys missing from docs/results-schema.md"
    html = (out / "report.html").read_text(encoding="utf-8")
    assert f"Circuit breaker tripped for <code>{entry}</code>" in html
    assert "not run: " in html and hit[0]["id"] in html
    assert "== circuit breaker: " + entry in p.stdout, explain(p)
    assert "== verdict: NOT CERTIFYING" in p.stdout and "custom suite (--suite)" in p.stdout, explain(p)
    junit = (out / "junit.xml").read_text(encoding="utf-8")
    assert junit.count("<testcase") == len(tests)
    return {"hit": hit, "not_run": not_run, "others": others, "doc": doc}


@pytest.mark.parametrize("case", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_provider_module(tmp_path, case):
    _, kind, name, module, entry, outcome, timeout = case
    out = tmp_path / "out"
    p, secs = kvx("run", lib(kind, name), "--suite", str(CONFORMANCE / module), "-n", "1",
                  "--timeout", str(timeout), "--output-dir", str(out), "--progress", "lines", timeout=240)
    r = check_breaker_run(p, out, entry, outcome, workers=1)
    # one worker: every test calling the entry point after the breaker tripped was not run
    tests = r["doc"]["tests"]
    last_hit = max(tests.index(t) for t in r["hit"])
    after = [t for t in tests[last_hit + 1:] if entry in t["entry"]]
    assert after and all(t in r["not_run"] for t in after), \
        f"expected every later {entry} test to be 'not run', got {[(t['id'], t['outcome']) for t in after][:5]}"
    # bounded by the breaker, not by the number of tests
    assert secs < 200, f"{name}: {secs:.0f} s"


def test_segv_on_write_core_profile_goes_on(tmp_path):
    """A provider that segfaults on every write, certified for core over the whole
    conformance suite: 3 crashes, then kvx_write_kv is not called again; the version,
    validation and gather tests still run; the run ends quickly, "not certified"."""
    out = tmp_path / "out"
    p, secs = kvx("run", lib("mutant", "segv_on_write"), "--suite", str(CONFORMANCE), "--profile", "core",
                  "-n", "2", "--timeout", "10", "--output-dir", str(out), "--progress", "lines", timeout=290)
    r = check_breaker_run(p, out, "kvx_write_kv", "crash", workers=2)
    went_on = [t for t in r["others"] if t["outcome"] == "pass"]
    entries = {e for t in went_on for e in t["entry"]}
    assert {"kvx_get_version", "kvx_validate_cache_desc", "kvx_gather_kv"} <= entries, \
        f"the tests of the other entry points must still run and pass, ran: {sorted(entries)}"
    assert any("Segmentation fault" in (t["message"] + t.get("detail", "")) for t in r["hit"]), r["hit"][0]
    assert r["doc"]["profiles"]["core"]["verdict"] == "not certified"
    assert secs < 300, f"target: within 5 minutes on 2 cores, took {secs:.0f} s"


#: a suite whose first two workers (gw0, gw1) both die in their first test, at the same moment,
#: inside the provider's kvx_write_kv (the segv_on_write mutant); replacement workers run it all
_TWO_DIE_SUITE = '''
import os, time
from pathlib import Path
import pytest

@pytest.mark.kvx(id="race.write", clause="spec 5", level="required", profile="core", entry="write")
@pytest.mark.parametrize("i", range(40))
def test_write(i, kvx_provider, request):
    wid, barrier = request.config.workerinput["workerid"], Path(os.environ["KVX_RACE_DIR"])
    if wid in ("gw0", "gw1"):
        (barrier / wid).touch()
        deadline = time.monotonic() + 60
        while not ((barrier / "gw0").exists() and (barrier / "gw1").exists()) and time.monotonic() < deadline:
            time.sleep(0.005)
        kvx_provider.write_kv(None, None)  # SIGSEGV
'''

#: loaded into the controller (--pytest-args -p): when xdist takes the first worker down, it waits until
#: the other one's process is gone too and gives xdist the view it has in the race: that worker not
#: yet seen down (its channel's end unread). xdist's remove_node then hands the first worker's tests to
#: the dead one (LoadScheduling.check_schedule -> node.send_runtest_some).
_RACE_PLUGIN = '''
import select, time
import pytest

_seen = []

@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    if error is None or _seen:
        return
    _seen.append(node)
    for other in node.config.pluginmanager.getplugin("dsession").sched.nodes:
        if other is node:
            continue
        # the other worker's stdin pipe has no reader left (POLLERR): every thread of it has ended
        try:
            poll = select.poll()
            poll.register(other.gateway._io.outfile.fileno(), 0)
            deadline = time.monotonic() + 60
            while not poll.poll(5) and time.monotonic() < deadline:
                pass
        except ValueError:  # execnet has closed the pipe: its end is read already (the send fails too)
            pass
        other._down = False
'''


@pytest.mark.skipif(not hasattr(select, "poll"), reason="needs poll(2)")
def test_two_workers_dying_at_once_is_not_a_harness_error(tmp_path):
    """Two workers segfault at the same moment: xdist hands the first one's tests to the second, whose
    process is gone but not yet seen down, and the send fails (OSError: cannot send). That must not be
    an INTERNALERROR (exit 12): both crashes recorded, named, the rest run on replacement workers,
    "NOT CERTIFIED", exit 1, no test lost (the race made deterministic by _RACE_PLUGIN)."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_two_die.py").write_text(_TWO_DIE_SUITE, encoding="utf-8")
    (tmp_path / "kvx_race_plugin.py").write_text(_RACE_PLUGIN, encoding="utf-8")
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    out = tmp_path / "out"
    env = dict(os.environ, KVX_RACE_DIR=str(barrier),
               PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    p = subprocess.run([*kvx_cmd(), "run", lib("mutant", "segv_on_write"), "--suite", str(suite), "-n", "2",
                        "--reruns", "0", "--timeout", "30", "--output-dir", str(out), "--progress", "lines",
                        "--pytest-args", "-p kvx_race_plugin"], capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == loader.EXIT_NOT_CERTIFIED, explain(p)
    assert "INTERNALERROR" not in p.stdout + p.stderr and "== verdict: NOT CERTIF" in p.stdout, explain(p)
    doc = results(out)
    tests = doc["tests"]
    assert doc["complete"] and doc["total"] == doc["finished"] == len(tests) == 40, explain(p)
    crashes = [t for t in tests if t["outcome"] == "crash"]
    assert {t["worker"] for t in crashes} == {"gw0", "gw1"} and len(crashes) == 2, \
        [(t["id"], t["worker"]) for t in crashes]
    for t in crashes:
        assert f"worker '{t['worker']}' crashed while running " in t["message"], t["message"]
        assert "Segmentation fault" in t["message"] and t["crash"]["entry"] == "kvx_write_kv", t
    rest = [t for t in tests if t not in crashes]
    assert all(t["outcome"] == "pass" and t["worker"] not in ("gw0", "gw1") for t in rest), \
        [(t["id"], t["outcome"], t["worker"]) for t in rest if t["outcome"] != "pass"]
    assert doc["profiles"]["core"]["verdict"] == "not certified"


class _FakeWorker:
    """An xdist WorkerController as the scheduler sees it; ``gone``: its process has ended."""

    def __init__(self, wid: str):
        self.gateway, self.gone, self.got, self.shutting_down = SimpleNamespace(id=wid), False, [], False

    def sendcommand(self, name: str, **kwargs) -> None:
        if self.gone:
            raise OSError("cannot send (already closed?)")  # execnet, writing to a dead worker's pipe
        self.got += kwargs.get("indices") or []

    def send_runtest_some(self, indices) -> None:
        self.sendcommand("runtests", indices=indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def test_scheduler_sends_to_gone_workers_lose_nothing():
    """The same race with xdist's own LoadScheduling and fake workers: what xdist sends to a worker
    already gone is dropped and comes back when that worker is taken down; its running test is its
    crash; a test it never received is rescheduled (pytest_handlecrashitem), not charged to it."""
    from xdist.scheduler import LoadScheduling

    ctl = SimpleNamespace(_unsent={})
    ids = [f"t.py::test[{i}]" for i in range(40)]
    sched = LoadScheduling(SimpleNamespace(getvalue=lambda name: ["popen"] * 2, getoption=lambda name: None))

    def join(wid: str) -> _FakeWorker:
        node = _FakeWorker(wid)
        _Controller._guard_sends(ctl, node)  # what pytest_configure_node does
        sched.add_node(node)
        sched.add_node_collection(node, ids)
        return node

    a, b = join("gw0"), join("gw1")
    sched.schedule()
    assert a.got == [0, 1, 2, 3, 4] and b.got == [5, 6, 7, 8, 9]
    a.gone = b.gone = True  # both crash in their first test; xdist has seen only gw0's end
    assert sched.remove_node(a) == ids[0]  # hands gw0's tests to gw1: the send fails (was INTERNALERROR)
    assert ctl._unsent[b] and 5 not in ctl._unsent[b]
    assert sched.remove_node(b) == ids[5]  # gw1's end: its running test is its crash
    assert sorted(sched.pending) == [i for i in range(40) if i not in (0, 5)]  # the rest: nothing lost
    c = join("gw2")  # a replacement
    sched.schedule()
    assert c.got and not c.gone
    d = join("gw3")  # a replacement that dies before it gets a test
    d.gone = True
    sched.schedule()
    crashitem = sched.remove_node(d)
    assert crashitem is not None and ids.index(crashitem) in ctl._unsent[d]
    report = SimpleNamespace(node=d, outcome="failed", user_properties=[])
    _Controller.pytest_handlecrashitem(ctl, crashitem, report, sched)
    assert report.outcome == "rerun" and ("kvx.unsent", "1") in report.user_properties
    waiting = set(sched.pending) | set(sched.node2pending[c])
    assert waiting == {i for i in range(40) if i not in (0, 5)}, "a test never run and never charged"
    assert set(c.got) <= waiting


def test_noop_provider_not_certified_with_waivers(tmp_path):
    """The mutant that answers OK to everything and does nothing: fail outcomes, not
    certified; the expectations file's waivers are printed on the certificate and an
    entry matching no test is warned about."""
    exp = tmp_path / "expect.json"
    exp.write_text(json.dumps({"waivers": [
        {"id": "write.slots.every_slot", "reason": "KVX-1: waived on purpose by this test"},
        {"id": "no.such.test[*]", "reason": "KVX-2: matches nothing"},
    ]}))
    out = tmp_path / "out"
    p, _ = kvx("run", lib("mutant", "noop_ok"), "--suite", str(CONFORMANCE / "test_s5_slots.py"), "-n", "1",
               "--timeout", "10", "--expectations", str(exp), "--output-dir", str(out), "--progress", "none")
    assert p.returncode == loader.EXIT_NOT_CERTIFIED, explain(p)
    doc = results(out)
    fails = [t for t in doc["tests"] if t["outcome"] == "fail"]
    assert len(fails) >= 10 and not any(t["outcome"] in ("crash", "timeout", "error") for t in doc["tests"])
    assert doc["verdict"] == "not certifying (partial selection)" and doc["profiles"]["core"]["verdict"] == "not certified"
    for t in fails:
        assert t["failure"] and t["failure"]["expected"] and t["failure"]["got"] and t["clause"], t
        assert t["repro"].startswith("kvx-conform run ") and "noop_ok" in t["repro"], t["repro"]
    waived = [t for t in doc["tests"] if t.get("waived")]
    assert [t["id"] for t in waived] == ["write.slots.every_slot"], waived
    cert = json.loads((out / "certificate.json").read_text(encoding="utf-8"))
    assert cert["waivers"] == [{"id": "write.slots.every_slot", "reason": "KVX-1: waived on purpose by this test",
                                "applied_to": ["write.slots.every_slot"]}], cert["waivers"]
    warn = "expectations: waiver 'no.such.test[*]' matches no test"
    assert warn in cert["warnings"] and warn in doc["warnings"]
    assert f"warning: {warn}" in p.stdout, explain(p)
    assert "[waived]" in p.stdout
    assert undocumented(doc, "results") == [] and undocumented(cert, "certificate") == [], \
        "keys missing from docs/results-schema.md"


# ----------------------------------------------------------------------------- other commands


def test_custom_suite_never_certifies(tmp_path):
    """A suite other than the bundled one (here one module of it, copied) cannot certify, however
    well the provider does: a vendor's certificate always covers every MUST of the bundled suite."""
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(CONFORMANCE / "test_s3_version.py", suite)
    out = tmp_path / "out"
    p, _ = kvx("run", "--suite", str(suite), "-n", "1", "--output-dir", str(out), "--progress", "none")
    assert p.returncode == loader.EXIT_CERTIFIED, explain(p)  # what ran passed (docs/exit-codes.md)
    doc = results(out)
    assert not doc["config"]["bundled_suite"] and not doc["certifying"], doc["config"]
    assert doc["verdict"] == "not certifying (partial selection)" and doc["counts"]["pass"] > 0 == doc["counts"]["fail"]
    assert "NOT CERTIFYING: custom suite (--suite)" in p.stdout, explain(p)
    assert "a custom suite (--suite)" in (out / "report.html").read_text(encoding="utf-8")


def test_quick_run_says_not_certifying(tmp_path):
    out = tmp_path / "out"
    p, _ = kvx("run", "--quick", "--suite", str(CONFORMANCE / "test_s3_version.py"), "-n", "1",
               "--output-dir", str(out), "--progress", "none")
    # exit 0: nothing that ran failed (docs/exit-codes.md); the verdict says it is no certificate
    assert p.returncode == loader.EXIT_CERTIFIED, explain(p)
    assert "QUICK (not certifying)" in p.stdout and "NOT CERTIFYING: quick run" in p.stdout, explain(p)
    doc = results(out)
    assert doc["quick"] and not doc["certifying"] and doc["verdict"] == "not certifying (quick)"
    assert doc["counts"]["pass"] == len(doc["tests"]) > 0
    cert = json.loads((out / "certificate.json").read_text(encoding="utf-8"))
    assert cert["quick"] and not cert["certifying"] and "NOT CERTIFYING" in cert["note"]
    assert "not certifying" in (out / "report.html").read_text(encoding="utf-8").lower()


def test_claimed_feature_unsupported_is_fail(tmp_path):
    """The reference answers UNSUPPORTED for non-zero newer-minor tails (optional feature
    nonzero_tail): acceptable while unclaimed, a fail once the claims file claims every
    optional feature the case uses (the unsupported message names them)."""
    sel = ["--suite", str(CONFORMANCE / "test_s6_size_guards.py"), "--id", "size.larger_nonzero_tail*", "-n", "1",
           "--progress", "none"]
    p0, _ = kvx("run", *sel, "--output-dir", str(tmp_path / "plain"))
    plain = results(tmp_path / "plain")
    assert plain["tests"] and {t["outcome"] for t in plain["tests"]} == {"unsupported"}, explain(p0)
    used = set()
    for t in plain["tests"]:
        m = re.match(r"UNSUPPORTED \(([^)]*)\)", t["message"])
        assert m, f"expected 'UNSUPPORTED (features): ...', got {t['message']!r}"
        used |= {f.strip() for f in m.group(1).split(",")}
    assert "nonzero_tail" in used, used
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps({"profiles": ["core"], "features": sorted(used)}))
    p1, _ = kvx("run", *sel, "--claims", str(claims), "--output-dir", str(tmp_path / "claimed"))
    claimed = results(tmp_path / "claimed")
    assert {t["outcome"] for t in claimed["tests"]} == {"fail"}, explain(p1)
    for t in claimed["tests"]:
        assert re.search(r"claimed features? .*nonzero_tail.* answered UNSUPPORTED", t["message"]), t["message"]
    assert claimed["claims"]["features"] == sorted(used)
    cert = json.loads((tmp_path / "claimed" / "certificate.json").read_text(encoding="utf-8"))
    assert cert["claimed_features"] == sorted(used)


def test_list_info_and_report(tmp_path):
    p, _ = kvx("list", "--profile", "core", "--json")
    assert p.returncode == 0, explain(p)
    doc = json.loads(p.stdout)
    assert doc["tests"] and not doc["duplicate_ids"]
    for t in doc["tests"]:
        assert t["profile"] == "core" and t["clause"] and t["level"] in ("required", "recommended", "informational"), t
    p, _ = kvx("list", "--profile", "core")
    assert p.returncode == 0 and "CLAUSE" in p.stdout.splitlines()[0], explain(p)
    assert doc["tests"][0]["id"] in p.stdout and f"{len(doc['tests'])} tests:" in p.stdout

    p, _ = kvx("info", "--json")
    assert p.returncode == 0, explain(p)
    info = json.loads(p.stdout)
    assert str(info["abi_version"]).startswith("1."), info["abi_version"]
    assert set(loader.ENTRY_POINTS) <= set(info["symbols"]), info["symbols"]

    # a run, then `report` re-renders its HTML from results.json alone
    out = tmp_path / "out"
    p, _ = kvx("run", lib("mutant", "v_into_k"), "--suite", str(CONFORMANCE / "test_s5_slots.py"), "-n", "1",
               "--output-dir", str(out), "--progress", "none")
    assert p.returncode == loader.EXIT_NOT_CERTIFIED, explain(p)
    original = (out / "report.html").read_text(encoding="utf-8")
    (out / "report.html").unlink()
    p, _ = kvx("report", str(out / "results.json"))
    assert p.returncode == 0 and (out / "report.html").exists(), explain(p)
    again = (out / "report.html").read_text(encoding="utf-8")
    strip = lambda s: re.sub(r"\d{4}-\d\d-\d\dT[\d:+-]+", "", s)  # noqa: E731
    assert strip(again) == strip(original)
    p, _ = kvx("report", str(out / "results.json"), "-o", str(tmp_path / "r.html"))
    assert p.returncode == 0 and (tmp_path / "r.html").read_text(encoding="utf-8") == again
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    p, _ = kvx("report", str(bad))
    assert p.returncode == loader.EXIT_BAD_INPUT_FILE and "Traceback" not in p.stdout + p.stderr, explain(p)
    assert p.stderr.strip().splitlines() == [f"kvx-conform: {bad} is not a kvx-conform results file"], explain(p)
