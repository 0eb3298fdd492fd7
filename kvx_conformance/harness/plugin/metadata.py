"""Collection and metadata: each test's ``kvx`` marker as a record, and the command that reproduces it."""
from __future__ import annotations

import os
import shlex

import pytest

from .config import entry_function, run_config

#: where a repro command writes its results (relative: beside wherever it is run, never the run's own)
REPRO_DIR = "kvx-repro"


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
            "feature": kw.get("feature"), "marked": True, "seeded": bool(kw.get("seeded")),
        }
    else:
        meta = {"id": f"unmarked:{item.nodeid}", "clause": "", "level": "informational", "profile": "(unmarked)",
                "entry": [], "feature": None, "marked": False}
    tm = item.get_closest_marker("timeout")
    timeout = tm.args[0] if tm is not None and tm.args else (tm.kwargs.get("timeout") if tm else default_timeout)
    meta.update(nodeid=item.nodeid, name=item.name, timeout=timeout,
                slow=item.get_closest_marker("slow") is not None)
    return meta


def repro_base(config: pytest.Config) -> list[str]:
    """``kvx-conform run PROVIDER --memory M -n 1 --reruns 0 --output-dir kvx-repro``: the start of
    every command that re-runs a part of this run alone. The provider's path is absolute (the
    command works from any directory); one worker and no re-runs, because it selects one test (or
    two) whose failure the run has already seen: the failure shows at once, not after three
    re-runs; its own output directory, so that running it where the run ran (default output
    ``./kvx-report``) does not replace the run's results, report and certificate."""
    rc = run_config(config)
    parts = ["kvx-conform", "run"]
    if rc.provider_path is not None:
        parts.append(os.path.abspath(rc.provider_path))
    return parts + ["--memory", rc.memory.name.lower(), "-n", "1", "--reruns", "0", "--output-dir", REPRO_DIR]


def repro_tail(config: pytest.Config) -> str:
    """What the run's command line adds to a repro (``--claims``, ``--suite``, ``--timeout``, ...,
    absolute paths: runner.py ``repro_extra``), already shell-quoted."""
    return config.getoption("kvx_repro_extra") or ""


def repro_command(config: pytest.Config, meta: dict, seed: int | None = None) -> str:
    """The command that runs this one test again, as the run ran it.

    It selects the test by its stable id (``--id``, an exact match: a ``-k`` expression matches
    substrings of test names, module names and keywords, so it may select other tests too). A
    seeded (hypothesis-generated) test draws its examples from the run's ``--seed``, or
    derandomized when the run had none, within the run's budget (``--quick``): the repro names
    the run's seed and budget, never the drawn case's own ``seed`` (printed in the failure: it
    rebuilds the case with ``kvx_conformance.cases.generators``, and as a run seed it would draw
    other examples). ``seed`` is accepted for callers that pass it and not used."""
    rc = run_config(config)
    parts = repro_base(config) + ["--id", meta["id"]]
    if meta.get("seeded"):
        if rc.seed is not None:
            parts += ["--seed", str(rc.seed)]
        if rc.quick:
            parts.append("--quick")
    cmd = " ".join(shlex.quote(p) for p in parts)
    return f"{cmd} {repro_tail(config)}".strip()
