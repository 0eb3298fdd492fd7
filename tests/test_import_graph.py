"""The package's import graph keeps its shape: stages in data-flow order, no circles.

``tools/import_graph.py`` reads the imports with ``ast`` (module-level and lazy ones alike)
and checks them against its declared stage order (abi -> cases -> suites -> results ->
report -> harness -> cli); this test fails on the first circle, upward arrow or module
that no stage claims, naming it.
"""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=1)
def _graph():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import_graph.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, mod.analyse(ROOT)


def test_no_import_circles():
    _, fig = _graph()
    assert fig["cycles"] == [], "modules that import each other: " + "; ".join(" <-> ".join(c) for c in fig["cycles"])


def test_no_upward_imports():
    _, fig = _graph()
    assert fig["upward"] == [], "\n".join(
        f"{u['from']} imports {u['to']} (line {u['line']}): {u['stages']}" for u in fig["upward"])


def test_every_module_has_a_stage():
    _, fig = _graph()
    assert fig["unplaced"] == [], f"add these to STAGES in tools/import_graph.py: {fig['unplaced']}"


def test_few_modules_at_the_top():
    mod, fig = _graph()
    assert len(fig["top_level_modules"]) <= mod.MAX_TOP_MODULES, fig["top_level_modules"]


def test_the_checker_sees_a_circle_and_an_upward_arrow(tmp_path):
    """The checker itself: a two-module circle and an abi -> harness import are reported."""
    mod, _ = _graph()
    pkg = tmp_path / "kvx_conformance"
    for d in ("abi", "harness"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "abi" / "a.py").write_text("from ..harness import h\n")
    (pkg / "harness" / "h.py").write_text("def f():\n    from ..abi import a\n")
    (tmp_path / "reference_impl").mkdir()
    (tmp_path / "suites").mkdir()
    (tmp_path / "csrc").mkdir()
    fig = mod.analyse(tmp_path)
    assert fig["cycles"] == [["kvx_conformance.abi.a", "kvx_conformance.harness.h"]]
    assert [(u["from"], u["to"]) for u in fig["upward"]] == [("kvx_conformance.abi.a", "kvx_conformance.harness.h")]
