"""Session set-up of the project's own tests.

Byte-code cache for the Python processes the tests start. Most of this suite's time is
``kvx-conform run`` subprocesses, each starting pytest workers (a crash or a re-run pass
starts more), and each of those imports and assertion-rewrites the same ~150 modules
(hypothesis, anyio, pytest-benchmark, xdist and the suites themselves: pytest rewrites every
module of a pytest plugin's distribution). Where the environment sets
``PYTHONDONTWRITEBYTECODE`` (as this project's machines and CI do), nothing is cached, and
every worker parses, rewrites and compiles them again: about 1.2 CPU-s a process, more than
the tests of a small selection cost. For this test session only, the child processes get a
private cache instead (``PYTHONPYCACHEPREFIX``, a temporary folder removed at the end):
nothing is written into the repository or the virtual environment, and what runs is the
same code (Python checks each cached file against its source's size and mtime, pytest its
rewrite too). Without ``PYTHONDONTWRITEBYTECODE`` in the environment this does nothing.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile

import pytest

#: the cache folder this process made (the controller of ``pytest -n``; its workers inherit it)
_PYCACHE: str | None = None


def _private_pycache() -> None:
    global _PYCACHE
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    _PYCACHE = tempfile.mkdtemp(prefix="kvx-tests-pycache-")
    os.environ["PYTHONPYCACHEPREFIX"] = _PYCACHE
    del os.environ["PYTHONDONTWRITEBYTECODE"]


_private_pycache()


def pytest_configure(config):
    """One line instead of collection errors where ``kvx_conformance`` is imported from a source
    tree that is not the installed package: the repository's ``kvx_conformance/`` holds neither the
    suites nor the native build, which the package build adds (``python -m pytest`` run from the
    repository root with a non-editable install imports that folder first)."""
    spec = importlib.util.find_spec("kvx_conformance")
    if importlib.util.find_spec("kvx_conformance.suites") is None:
        where = spec.origin if spec else "nowhere"
        raise pytest.UsageError(
            f"kvx_conformance imported from {where} has no suites: install the project with "
            "`pip install -e .` (README), or run the tests from outside the repository root")


def pytest_unconfigure(config):
    if _PYCACHE is not None and not hasattr(config, "workerinput"):
        shutil.rmtree(_PYCACHE, ignore_errors=True)
