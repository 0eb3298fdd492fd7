"""``kvx-conform run`` (``kvx-conform list`` is :mod:`kvx_conformance.harness.listing`).

``run``: preflight the provider in a subprocess (one-line errors with distinct exit
codes, before any test runs), then run the suites with ``pytest.main`` through
pytest-xdist workers (a provider crash kills a worker, not the run) and
pytest-timeout (thread method: a hang is stopped), with the kvx plugin recording
results as they finish; then write the certificate, JUnit XML and HTML report.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from .. import __version__
from ..abi.buffers import LATER_TEST
from ..abi.loader import (
    EXIT_BAD_INPUT_FILE,
    EXIT_CERTIFIED,
    EXIT_HARNESS_ERROR,
    EXIT_INTERRUPTED,
    EXIT_MEMORY_UNAVAILABLE,
    EXIT_NO_TESTS,
    EXIT_NOT_CERTIFIED,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    ProviderLoadError,
)
from ..abi.native import default_provider
from ..results.claims import InputFileError, load_claims, load_expectations, reference_claims_file
from ..results.outcomes import PROFILES
from ..results.record import bundled_suite

DEFAULT_SUITE = "kvx_conformance.suites"
DEFAULT_OUTPUT = "kvx-report"
DEFAULT_TIMEOUT = 30.0
MAX_WORKER_RESTARTS = 200
#: files of a previous run that a new run into the same directory replaces
ARTIFACTS = ("results.json", "results.jsonl", "breaker.json", "collection.json", "certificate.json",
             "report.html", "junit.xml", "run-info.json", "pytest.ini", "sanitize-python.sh")
#: where the re-runs of tests that did not pass write their own results (one folder per attempt)
RERUN_DIR = "reruns"
DEFAULT_RERUNS = 3
PYTEST_INI = "[pytest]\naddopts =\nconsole_output_style = classic\n"


def default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 4))


def _err(msg: str) -> None:
    print(f"kvx-conform: {msg}", file=sys.stderr, flush=True)


def _suite_args(suite: str) -> tuple[list[str], Path | None]:
    from ..results.certificate import suite_root

    root = suite_root(suite)
    if Path(suite).exists():
        return [str(Path(suite).resolve())], root
    return ["--pyargs", suite], root


def _plugin_autoload_args() -> list[str]:
    """Name xdist / timeout explicitly when pytest's plugin autoload is switched off."""
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return ["-p", "xdist.plugin", "-p", "pytest_timeout"]
    return []


# ----------------------------------------------------------------------------- run


class RunCommand:
    name = "run"

    @staticmethod
    def add_parser(sub) -> argparse.ArgumentParser:
        p = sub.add_parser(
            "run", help="run the conformance suites against a provider",
            formatter_class=argparse.RawDescriptionHelpFormatter,
            description=(
                "Load PROVIDER (a KVX shared library) in a preflight subprocess, then run the conformance\n"
                "suites against it in pytest-xdist worker processes, so that a provider crash or hang costs\n"
                "one test, not the run. Writes results.json (as tests finish), certificate.json, junit.xml\n"
                "and a self-contained report.html into --output-dir.\n\n"
                "Exit status: 0 certified, 1 not certified, 2 and up usage or load errors "
                "(see docs/exit-codes.md)."
            ),
            epilog=(
                "examples:\n"
                "  kvx-conform run                                   # the bundled reference provider\n"
                "  kvx-conform run ./libacme_kvx.so --claims acme-claims.yaml\n"
                "  kvx-conform run ./libacme_kvx.so --profile core --quick      # fast, not certifying\n"
                "  kvx-conform run ./libacme_kvx.so --memory device -n 4 --timeout 60\n"
                "  kvx-conform run ./libacme_kvx.so -k 'test_invalid_slot[S64]' --seed 1234\n"
                "  kvx-conform run ./libacme_kvx.so --expectations waivers.yaml --output-dir out/acme\n\n"
                "claims file (YAML or JSON):   profiles: [core, tables]   features: [ragged, kv_offsets]\n"
                "expectations file:            waivers: [{id: 'gather.oob_block[S32]', reason: 'ACME-12'}]\n"
            ),
        )
        p.add_argument("provider", nargs="?", help="provider shared library (default: the bundled reference)")
        p.add_argument("-k", dest="keyword", metavar="EXPR",
                       help="only tests matching this pytest -k expression (partial run: not certifying)")
        p.add_argument("--id", action="append", default=[], metavar="ID",
                       help="only this stable test id ('*' globs; repeatable; partial run)")
        p.add_argument("--profile", action="append", default=[], choices=list(PROFILES), metavar="P",
                       help=f"only tests of profile P (repeatable): {', '.join(PROFILES)}")
        p.add_argument("--memory", default="auto", choices=["host", "device", "unified", "auto"],
                       help="memory type of the buffers (auto: device where torch sees a GPU and the provider "
                            "serves device memory, a tiny valid validate and write answered OK; else host)")
        p.add_argument("-n", "--workers", type=int, default=None, metavar="N",
                       help=f"worker processes (at least 1; default min(cpus, 4) = {default_workers()}, or one "
                            "per GPU when --memory device/unified runs on more GPUs)")
        p.add_argument("--output-dir", default=DEFAULT_OUTPUT, metavar="DIR",
                       help="where results, certificate and report go (default ./%(default)s)")
        p.add_argument("--junit-xml", metavar="PATH", help="JUnit XML file (default DIR/junit.xml)")
        p.add_argument("--claims", metavar="FILE",
                       help="claims file: profiles and optional features claimed (default: every profile but the "
                            "opt-in fp4_exact; with no PROVIDER, the bundled reference's claims: every profile)")
        p.add_argument("--expectations", metavar="FILE", help="expectations file: waivers [{id, reason}]")
        p.add_argument("--quick", action="store_true",
                       help="reduced set and small hypothesis budget; marked NOT CERTIFYING everywhere")
        p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                       help="seconds one test may run before it counts as a timeout (default %(default)g)")
        p.add_argument("--seed", type=int, metavar="N", help="seed for generated cases (as printed by a failure)")
        p.add_argument("--suite", default=DEFAULT_SUITE, metavar="SUITE",
                       help="suite package or directory (default %(default)s; for suite developers: a suite other "
                            "than the bundled one never certifies)")
        p.add_argument("--reruns", type=int, default=DEFAULT_RERUNS, metavar="N",
                       help="re-run each test that failed, crashed, timed out or errored up to N more times "
                            "(only those tests, in a follow-up pass); attempts that disagree make it 'flaky', "
                            "which still blocks certification (default %(default)s; 0: no re-runs)")
        p.add_argument("--breaker", type=int, default=3, metavar="N",
                       help="crashes/timeouts of one entry point before its remaining tests are skipped "
                            "(default %(default)s)")
        p.add_argument("--sanitize", action="store_true",
                       help="run the worker processes under compute-sanitizer (memcheck; CUDA toolkit): a device "
                            "fault's record then names the kernel and the bad address (slow: select a few tests)")
        p.add_argument("--progress", default="auto", choices=["auto", "tty", "lines", "none"],
                       help="progress display (default auto: one rewritten line on a terminal)")
        p.add_argument("--pytest-args", default="", metavar="ARGS",
                       help="extra pytest arguments, one shell-quoted string (debugging)")
        # -- GPUs and shards (docs/scale.md)
        p.add_argument("--gpus", metavar="LIST",
                       help="device/unified runs: GPU indexes the workers are spread over, one GPU per worker "
                            "(e.g. 0,1 or 0-3; default: every visible GPU); each test's record names its GPU")
        p.add_argument("--shard", metavar="K/N",
                       help="run only part K of N of the selection (deterministic, balanced); join the parts "
                            "with kvx-conform merge (a shard alone is not certifying)")
        p.add_argument("--durations-from", metavar="RESULTS",
                       help="with --shard: balance the parts by the test durations of this results.json")
        p.add_argument("--bench", choices=["quick", "standard", "full"], metavar="PRESET",
                       help="after the conformance run, run the bandwidth benchmarks of PRESET (quick, standard, "
                            "full) into DIR/bench (kvx-conform bench; the exit status stays the certification's)")
        return p

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        return run(args)


def _resolve_memory(requested: str, info) -> tuple[str | None, str | None, list[str]]:
    """(memory, error, notes) from the request and the preflight's memory probe (``served.choose_memory``)."""
    from ..cases.served import choose_memory

    support = info.memory_support or {}
    return choose_memory(requested, lambda mem: support.get(mem, "not probed"), "certify")


def find_sanitizer() -> str | None:
    """compute-sanitizer: on PATH, next to nvcc, or under $CUDA_HOME / /usr/local/cuda."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    dirs = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        dirs.append(Path(nvcc).resolve().parent)
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            dirs.append(Path(os.environ[env]) / "bin")
    dirs.append(Path("/usr/local/cuda/bin"))
    for d in dirs:
        for cand in (d / "compute-sanitizer", d.parent / "compute-sanitizer" / "compute-sanitizer"):
            if cand.is_file() and os.access(cand, os.X_OK):
                return str(cand)
    return None


def sanitize_wrapper(out: Path, sanitizer: str) -> Path:
    """An executable that starts python under compute-sanitizer (the workers start through it);
    each sanitizer process logs to faults/sanitizer-<its pid>.log (the worker's parent pid)."""
    faults = out / "faults"
    faults.mkdir(parents=True, exist_ok=True)
    w = out / "sanitize-python.sh"
    # torch's caching allocator off: each guarded buffer is its own cudaMalloc, so memcheck sees its bounds
    w.write_text("#!/bin/sh\nexport PYTORCH_NO_CUDA_MEMORY_CACHING=1\n"
                 f"exec {shlex.quote(sanitizer)} --tool memcheck --print-limit 50 "
                 f"--log-file {shlex.quote(str(faults))}/sanitizer-%p.log {shlex.quote(sys.executable)} \"$@\"\n",
                 encoding="utf-8")
    w.chmod(0o755)
    return w


def _prepare_output(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in ARTIFACTS:
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "faults", ignore_errors=True)
    shutil.rmtree(out / RERUN_DIR, ignore_errors=True)


def _header_lines(info, memory: str, args, workers: int, notes: list[str]) -> list[str]:
    from .preflight import format_info

    lines = [f"kvx-conform {__version__}: conformance run"]
    lines += format_info(info)
    lines.append(f"run          memory {memory}, {workers} worker(s), timeout {args.timeout:g} s"
                 + (", QUICK (not certifying)" if args.quick else ""))
    lines += [f"note: {n}" for n in notes]
    return lines


def keyword_error(expr: str) -> str | None:
    """A one-line message when ``expr`` is not a valid pytest ``-k`` expression, else None."""
    from _pytest.mark.expression import Expression  # pytest's own -k parser (its error type varies by version)

    try:
        Expression.compile(expr)
    except Exception as e:  # noqa: BLE001 - SyntaxError in pytest >= 8.4, ParseError before
        why = getattr(e, "msg", None) or getattr(e, "message", None) or str(e)
        return (f"-k {expr!r} is not a pytest -k expression ({why}); "
                "use words joined by 'and' / 'or' / 'not', or --id with '*' globs for stable ids")
    return None


def run(args: argparse.Namespace) -> int:
    from .preflight import run_preflight

    provider = args.provider or default_provider()
    if provider is None:
        _err("no provider given and the bundled reference is not built (pip install the package, or set "
             "KVX_CONFORM_NATIVE_DIR)")
        return EXIT_NOT_FOUND
    workers = args.workers if args.workers is not None else default_workers()
    if workers < 1:
        _err(f"-n must be at least 1 (got {workers}): the suites always run in worker processes")
        return EXIT_USAGE
    if args.timeout <= 0:
        _err("--timeout must be positive")
        return EXIT_USAGE
    if args.reruns < 0:
        _err(f"--reruns must be 0 or more (got {args.reruns})")
        return EXIT_USAGE
    if args.keyword and (bad := keyword_error(args.keyword)):
        _err(bad)
        return EXIT_USAGE
    from .scale import check_run_options

    if bad := check_run_options(args):
        _err(bad)
        return EXIT_USAGE
    if args.provider is None and not args.claims:
        # the bundled reference claims every profile, the opt-in exact FP4 tier included (its
        # claims file, results/claims.py reference_claims_file); repro lines carry it (--claims)
        args.claims = str(reference_claims_file())
    try:  # both files checked before the run (the plugin reads them again, with --profile applied)
        load_claims(args.claims)
        load_expectations(args.expectations)
    except InputFileError as e:
        _err(str(e))
        return EXIT_BAD_INPUT_FILE
    target, root = _suite_args(args.suite)
    if root is None:
        _err(f"suite not found: {args.suite}")
        return EXIT_HARNESS_ERROR
    out = Path(args.output_dir).resolve()
    try:
        _prepare_output(out)
    except OSError as e:
        _err(f"cannot use output directory {out}: {e}")
        return EXIT_USAGE

    sanitizer = None
    if getattr(args, "sanitize", False):
        sanitizer = find_sanitizer()
        if sanitizer is None:
            _err("--sanitize needs compute-sanitizer (it ships with the CUDA toolkit): not found on PATH, next to "
                 "nvcc, in $CUDA_HOME/bin or /usr/local/cuda/bin")
            return EXIT_USAGE
    explicit_mem = args.memory in ("device", "unified")
    try:
        info = run_preflight(provider, timeout=max(30.0, args.timeout),
                             memory_check=args.memory != "host",
                             memory=args.memory if explicit_mem else "host")
    except ProviderLoadError as e:
        _err(str(e))
        return e.exit_code
    memory, mem_error, notes = _resolve_memory(args.memory, info)
    if mem_error:
        _err(mem_error)
        return EXIT_MEMORY_UNAVAILABLE
    from .scale import plan_gpus

    try:
        gpu_plan = plan_gpus(args, memory, info.environment, workers)
    except ValueError as e:
        _err(str(e))
        return EXIT_USAGE
    workers = gpu_plan.workers
    notes += gpu_plan.notes
    for line in _header_lines(info, memory, args, workers, notes):
        print(line)
    sys.stdout.flush()

    from ..results.certificate import suite_root, suites_hash

    suite_hash = suites_hash(root)

    run_info = {
        "harness": {"name": "kvx-conform", "version": __version__},
        "command": ["kvx-conform", "run", *sys.argv[2:]] if len(sys.argv) > 1 and sys.argv[1] == "run" else None,
        "provider": {"path": info.path, "sha256": info.sha256, "abi_version": info.abi_version,
                     "abi": info.abi, "symbols": info.symbols, "version_size_set": info.version_size_set,
                     "struct_sizes": info.struct_sizes, "header_sizes": info.header_sizes,
                     "memory_support": info.memory_support, "size_findings": info.size_findings(),
                     "preflight_warnings": info.warnings},
        "environment": info.environment,
        "memory_types": [memory],
        "config": {"memory": memory, "memory_requested": args.memory, "workers": workers,
                   "timeout_s": args.timeout, "quick": args.quick, "keyword": args.keyword, "ids": args.id,
                   "profiles": args.profile, "seed": args.seed, "breaker_threshold": args.breaker,
                   "suite": args.suite, "suites_hash": suite_hash,
                   "bundled_suite": suite_hash == suites_hash(suite_root(DEFAULT_SUITE)), "reruns": args.reruns,
                   "sanitize": sanitizer, "hypothesis_max_examples": None,
                   "gpus": gpu_plan.gpus, "shard": args.shard,
                   "durations_from": str(Path(args.durations_from).resolve()) if args.durations_from else None},
    }
    from .plugin import HYPOTHESIS_EXAMPLES

    run_info["config"]["hypothesis_max_examples"] = HYPOTHESIS_EXAMPLES["quick" if args.quick else "full"]
    (out / "run-info.json").write_text(json.dumps(run_info, indent=1), encoding="utf-8")
    (out / "pytest.ini").write_text(PYTEST_INI, encoding="utf-8")

    # what a failure's repro command (plugin/metadata.py) needs of this command line, with absolute
    # paths: the repro runs from any directory
    repro_extra = []
    if args.suite != DEFAULT_SUITE:
        repro_extra += ["--suite", str(Path(args.suite).resolve()) if Path(args.suite).exists() else args.suite]
    if args.timeout != DEFAULT_TIMEOUT:
        repro_extra += ["--timeout", f"{args.timeout:g}"]
    if args.claims:  # an UNSUPPORTED answer fails only for a claimed feature: the repro needs the claims
        repro_extra += ["--claims", str(Path(args.claims).resolve())]
    if args.gpus and memory != "host":  # the GPUs the run's workers used (placement tests need two)
        repro_extra += ["--gpus", args.gpus]
    pa = [
        "-c", str(out / "pytest.ini"), "--rootdir", str(root),
        "-p", "kvx_conformance.plugin", *_plugin_autoload_args(),
        "-p", "no:cacheprovider", "-p", "no:faulthandler",
        "-n", str(workers), "--max-worker-restart", str(MAX_WORKER_RESTARTS), "--dist", "load",
        "--timeout", f"{args.timeout:g}", "--timeout-method", "thread",
        "-qq", "--no-summary", "-W", "ignore::pytest.PytestUnknownMarkWarning",
        "--kvx-provider", info.path, "--kvx-memory", memory, "--kvx-output-dir", str(out),
        "--kvx-run-info", str(out / "run-info.json"), "--kvx-breaker", str(args.breaker),
        "--kvx-progress", args.progress,
        "--kvx-repro-extra", " ".join(shlex.quote(x) for x in repro_extra),
    ]
    if args.claims:
        pa += ["--kvx-claims", str(Path(args.claims).resolve())]
    if sanitizer:
        pa += ["--kvx-sanitize", str(sanitize_wrapper(out, sanitizer))]
    if args.expectations:
        pa += ["--kvx-expectations", str(Path(args.expectations).resolve())]
    if args.quick:
        pa.append("--kvx-quick")
    for prof in args.profile:
        pa += ["--kvx-profile", prof]
    for tid in args.id:
        pa += ["--kvx-id", tid]
    if args.keyword:
        pa += ["-k", args.keyword]
    pa += gpu_plan.pytest_args()
    if args.shard:
        pa += ["--kvx-shard", args.shard]
        if args.durations_from:
            pa += ["--kvx-shard-durations", str(Path(args.durations_from).resolve())]
    if args.seed is not None:
        pa += ["--kvx-seed", str(args.seed)]
        if importlib.util.find_spec("_hypothesis_pytestplugin") is not None:
            pa += [f"--hypothesis-seed={args.seed}"]
    pa += shlex.split(args.pytest_args)

    import pytest

    t0 = time.monotonic()
    try:
        rc = int(pytest.main(pa + target))
    except KeyboardInterrupt:
        rc = int(pytest.ExitCode.INTERRUPTED)
    if args.reruns and rc not in (int(pytest.ExitCode.INTERRUPTED), int(pytest.ExitCode.INTERNAL_ERROR),
                                  int(pytest.ExitCode.USAGE_ERROR)):
        try:
            rerun_failures(out, pa, target, args.reruns, workers, args.expectations)
        except KeyboardInterrupt:
            rc = int(pytest.ExitCode.INTERRUPTED)
    elapsed = time.monotonic() - t0
    status = finish_run(out, rc, args, elapsed)
    if getattr(args, "bench", None):
        from ..bench.cli import bench_after_run

        bench_after_run(args, info.path, memory, out / "bench")
    return status


def _with_option(pa: list[str], flag: str, value: str) -> list[str]:
    """``pa`` with the value after ``flag`` replaced (appended when ``flag`` is absent)."""
    out = list(pa)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def _without_option(pa: list[str], flag: str) -> list[str]:
    """``pa`` without ``flag`` and its value."""
    out = list(pa)
    if flag in out:
        i = out.index(flag)
        del out[i:i + 2]
    return out


def rerun_failures(out: Path, pa: list[str], target: list[str], reruns: int, workers: int,
                   expectations: str | None) -> dict[str, list[str]]:
    """Re-run the tests of ``out/results.json`` that failed, crashed, timed out or errored.

    A runner-level follow-up pass (not a pytest re-run plugin: a crash kills the worker
    that would re-run the test, and outcomes are recorded by the kvx plugin): up to
    ``reruns`` more pytest runs, each selecting just the tests still in question by node
    id (``--kvx-nodeids``), each with its own results under ``out/reruns/attempt-K``. A
    test whose attempts have disagreed is not run again. Then every re-run test gets one
    record (``results.merge_attempts``): the same outcome when all attempts agreed,
    ``flaky`` with the tally when they did not; the verdicts are computed again and
    results.json is rewritten. Returns node id -> the outcomes of its attempts.
    """
    import pytest

    from ..results.claims import Claims, load_expectations
    from ..results.record import (RERUN, RUN_WIDE_PREFIX, _atomic_write_json, load_results, merge_attempts, records,
                                  resummarize)

    try:
        doc = load_results(out / "results.json")
    except ValueError:
        return {}
    if doc.get("collection_errors") or not doc.get("complete"):
        return {}
    tests = records(doc)
    first = {t.nodeid: t for t in tests}
    todo = [t.nodeid for t in tests if t.outcome in RERUN and not t.nodeid.startswith(RUN_WIDE_PREFIX)]
    later: dict[str, list] = {n: [] for n in todo}
    for k in range(1, reruns + 1):
        if not todo:
            break
        d = out / RERUN_DIR / f"attempt-{k}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "nodeids.txt").write_text("\n".join(todo) + "\n", encoding="utf-8")
        print(f"re-run {k}/{reruns}: {len(todo)} test(s) that did not pass", flush=True)
        a = _without_option(_without_option(pa, "--kvx-shard"), "--kvx-shard-durations")  # node ids select
        a = _with_option(a, "--kvx-output-dir", str(d))
        a = _with_option(a, "--kvx-progress", "none")
        a = _with_option(a, "-n", str(max(1, min(workers, len(todo)))))
        rc = int(pytest.main(a + ["--kvx-nodeids", str(d / "nodeids.txt")] + target))
        if rc == int(pytest.ExitCode.INTERRUPTED):
            raise KeyboardInterrupt
        try:
            got = {t.nodeid: t for t in records(load_results(d / "results.json"))}
        except ValueError:
            break
        for n in todo:
            if n in got:
                later[n].append(got[n])
        # attempts that already disagree make the test flaky: no need to run it again
        todo = [n for n in todo if n in got and all(r.outcome in (first[n].outcome, "skip") for r in later[n])]
    if not any(later.values()):
        return {}
    merged = [merge_attempts(t, later[t.nodeid]) if later.get(t.nodeid) else t for t in tests]
    # the verdicts again under the claims the run recorded: those of --claims with --profile applied
    # (plugin config), not --claims alone, which would drop a profile that --profile claimed
    doc = resummarize(doc, merged, Claims.from_dict(doc.get("claims")), load_expectations(expectations))
    _atomic_write_json(out / "results.json", doc)
    flaky = sum(t.outcome == "flaky" for t in merged)
    again = sum(1 for t in merged if t.attempts and t.outcome != "flaky")
    print(f"re-runs: {flaky} flaky, {again} did not pass in any attempt", flush=True)
    return {t.nodeid: t.attempts for t in merged if t.attempts}


def finish_run(out: Path, rc: int, args: argparse.Namespace, elapsed: float) -> int:
    import pytest

    from ..results.certificate import write_certificate
    from ..report import write_report
    from ..report.junit import write_junit
    from ..results.record import load_results

    results_path = out / "results.json"
    try:
        doc = load_results(results_path)
    except ValueError as e:
        _err(f"the run produced no results ({e}); pytest exit status {rc}")
        return EXIT_HARNESS_ERROR
    write_certificate(doc, out / "certificate.json")
    junit = Path(args.junit_xml) if args.junit_xml else out / "junit.xml"
    write_junit(doc, junit)
    write_report(doc, out / "report.html")

    for line in summary_lines(doc):
        print(line)
    print(f"results      {results_path}")
    print(f"certificate  {out / 'certificate.json'}")
    print(f"junit        {junit}")
    print(f"report       {out / 'report.html'}")
    print(f"time         {elapsed:.1f} s")
    sys.stdout.flush()

    if doc.get("collection_errors"):
        _err("the suites could not be collected: " + "; ".join(doc["collection_errors"][:3]))
        return EXIT_HARNESS_ERROR
    if rc == int(pytest.ExitCode.NO_TESTS_COLLECTED) or (doc.get("total") == 0):
        _err("no test matched the selection")
        return EXIT_NO_TESTS
    if rc == int(pytest.ExitCode.INTERRUPTED):
        _err("interrupted: results.json holds the tests that finished")
        return EXIT_INTERRUPTED
    if rc in (int(pytest.ExitCode.INTERNAL_ERROR), int(pytest.ExitCode.USAGE_ERROR)):
        _err(f"pytest failed (exit status {rc}); see the output above")
        return EXIT_HARNESS_ERROR
    return EXIT_CERTIFIED if doc.get("claimed_profiles_certified") else EXIT_NOT_CERTIFIED


def summary_lines(doc: dict, max_failures: int = 20) -> list[str]:
    from ..results.record import first_line

    tests = doc.get("tests", [])
    lines: list[str] = []
    late = [w for w in doc.get("late_writes") or [] if w.get("where") != LATER_TEST]
    if late:  # first: it explains failures and crashes below
        lines.append(f"== writes after return: the provider wrote into buffers after its calls returned "
                     f"({len(late)} finding(s); first in {late[0]['test']}: {late[0]['what']}); later crashes in "
                     f"the same worker are marked 'possibly caused by writes after return'")
    faults = [t for t in tests if (t.get("crash") or {}).get("kind") == "device-fault"]
    if faults:
        c = faults[0]["crash"]
        lines.append(f"== device faults: {len(faults)} test(s) left a sticky CUDA error (first {faults[0]['id']}: "
                     f"{c.get('error')} in {c.get('entry') or 'a provider call'}); each is a crash, a fresh worker "
                     f"ran the rest")
    bad = [t for t in tests if t["outcome"] in ("fail", "crash", "timeout", "error", "flaky")]
    rank = {"required": 0, "recommended": 1, "informational": 2}
    bad.sort(key=lambda t: (rank.get(t["level"], 3), t["id"]))
    if bad:
        by_level = {lv: sum(t["level"] == lv for t in bad) for lv in rank}
        lines.append(f"== problems: {by_level['required']} required, {by_level['recommended']} recommended "
                     f"(warnings), {by_level['informational']} informational")
        for t in bad[:max_failures]:
            waived = "  [waived]" if t.get("waived") else ""
            lines.append(f"{t['outcome'].upper():<8} {t['level']:<12} {t['id']}  ({t['clause']}){waived}")
            if t.get("outcome") == "flaky" and t.get("tally"):
                lines.append("         attempts: " + ", ".join(f"{n} {o}" for o, n in t["tally"].items()))
            f = t.get("failure") or {}
            if f:
                lines.append(f"         {f.get('what', '')}")
                lines.append(f"         expected: {f.get('expected')}   got: {f.get('got')}")
                if f.get("clause") and f["clause"] != t.get("clause"):  # the rule a generated case broke
                    lines.append(f"         clause: {f['clause']}")
            else:
                lines.append(f"         {first_line(t.get('message'))[:160]}")
            if t.get("repro"):
                lines.append(f"         repro: {t['repro']}")
        if len(bad) > max_failures:
            lines.append(f"         ... and {len(bad) - max_failures} more (see report.html)")
    for e, b in (doc.get("breaker") or {}).items():
        if b.get("tripped"):
            lines.append(f"== circuit breaker: {e} crashed/timed out {b['count']} times; "
                         f"its remaining tests were skipped")
    for w in doc.get("warnings", []):
        if w.startswith("expectations:"):
            lines.append(f"warning: {w}")
    lines.append("== profiles")
    for name, p in (doc.get("profiles") or {}).items():
        claimed = "claimed" if p.get("claimed") else "NOT CLAIMED"
        lines.append(f"  {name:<12} {p['verdict']:<14} {p['required_passed']}/{p['required']} required passed"
                     f"{', ' + str(len(p['warnings'])) + ' warning(s)' if p.get('warnings') else ''}"
                     f"{', ' + str(len(p['waived'])) + ' waived' if p.get('waived') else ''}  {claimed}")
    lines += claims_lines(doc)
    if doc.get("engines"):
        lines.append("== engines (works with the engine's caches?)")
        for e in doc["engines"].values():
            lines.append(f"  {e['name']:<12} {e['works']:<7} {e['passed']}/{e['scenarios']} scenarios passed"
                         f"{'; not in: ' + ', '.join(e['where_not']) if e.get('where_not') else ''}")
    c = doc.get("counts", {})
    lines.append("== " + "  ".join(f"{k} {v}" for k, v in c.items()))
    verdict = str(doc.get("verdict", "?")).upper()
    if not doc.get("certifying"):
        shard = doc.get("shard") or {}
        why = ("quick run" if doc.get("quick") else
               f"shard {shard['index']}/{shard['count']}; join the shards with kvx-conform merge" if shard else
               "custom suite (--suite): only the bundled suite certifies" if not bundled_suite(doc) else
               "partial selection")
        verdict += f"   (NOT CERTIFYING: {why})"
    if not doc.get("complete"):
        verdict += "   (INCOMPLETE)"
    lines.append(f"== verdict: {verdict}")
    from ..results.certificate import coverage

    lines.append(f"== covers: {coverage(doc)}")
    return lines


def claims_lines(doc: dict) -> list[str]:
    """What the verdict covers: the profiles not claimed (the opt-in ones with the default claims,
    or those a narrower explicit claim leaves out), each with its own verdict, which the run's
    does not depend on; and the profiles not served (they do not block unless claimed explicitly)."""
    claims = doc.get("claims") or {}
    out = []
    not_claimed = doc.get("not_claimed") or claims.get("not_claimed") or []
    if not_claimed:
        profiles = doc.get("profiles") or {}
        each = ", ".join(f"{p} {(profiles.get(p) or {}).get('verdict', 'not run')}" for p in not_claimed)
        out.append(f"== not claimed (reported, not part of this run's verdict): {each}")
    not_served = doc.get("not_served") or []
    if not_served:
        how = ("claimed explicitly: they block" if claims.get("explicit")
               else "the provider refused all they cover; they do not block the default claims")
        out.append(f"== not served: {', '.join(not_served)} ({how})")
    return out
