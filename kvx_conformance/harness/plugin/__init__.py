"""The kvx-conform pytest plugin (``-p kvx_conformance.plugin``).

Suites see it through fixtures:

- ``kvx_provider``      (session) the loaded :class:`~kvx_conformance.abi.loader.Provider`
- ``kvx_memory``        (session) the :class:`~kvx_conformance.abi.header.Memory` of this run
- ``kvx_call_options``  factory ``kvx_call_options(misalign=0, stream=None, after_call=None)``
                        -> :class:`~kvx_conformance.cases.execute.CallOptions` with the run's memory
- ``kvx_claims``        (session) frozenset of claimed optional feature names
- ``kvx_generator_features`` (session) optional features generated tests may draw
                        (claimed, or served in a probe call: ``kvx_conformance.cases.served``)
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

from pathlib import Path

import pytest

from .config import (
    BREAKER_FILE,
    CAPTURE_TAIL_CHARS,
    CL_LIFETIME,
    COLLECTION_FILE,
    ENTRY_FUNCTIONS,
    FAULTS_DIR,
    HYPOTHESIS_EXAMPLES,
    RunConfig,
    _CTL,
    _STATE_DIR,
    _TEMP_STATE,
    _configure_hypothesis,
    _state_dir,
    _uses_xdist,
    entry_function,
    kvx_call_options,
    kvx_claims,
    kvx_generator_features,
    kvx_memory,
    kvx_provider,
    kvx_run_config,
    run_config,
)
from .controller import _Controller, sanitizer_excerpt
from .metadata import item_meta, repro_command
from .worker import _Worker, crashed_entry, refusal_warning

#: GPUs and shards (--kvx-gpus, --kvx-shard): kvx_conformance/harness/plugin/scale.py, registered as "kvx-scale"
pytest_plugins = ["kvx_conformance.harness.plugin.scale"]


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


def pytest_unconfigure(config: pytest.Config) -> None:
    if _TEMP_STATE in config.stash:
        import shutil

        shutil.rmtree(config.stash[_TEMP_STATE], ignore_errors=True)
