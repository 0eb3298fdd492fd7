#!/usr/bin/env python3
"""The import graph of kvx_conformance: circles, arrows that run back up, room sizes.

Reads the sources with ``ast`` (nothing is imported), counts every import between the
package's modules (module-level and inside functions alike, since a lazy import is
still an arrow) and checks them against the declared stage order :data:`STAGES`, the
data flow of the package from bottom to top:

    provider .so -> abi -> cases -> suites -> results -> report -> harness -> cli

A module may import its own stage or any stage below; an import of a higher stage is
an *upward arrow*. A *circle* is a set of modules that import each other, at any
distance. ``reference_impl/`` (the numpy oracle) and ``suites/`` are installed inside
the package (``kvx_conformance.reference_impl``, ``kvx_conformance.suites``) and are
placed in the order like the package's own folders.

    python tools/import_graph.py            # summary; exit 1 on a circle, an upward arrow, an
                                            # unplaced module or too many modules at the top
    python tools/import_graph.py --strict-sizes   # ... or a room over the size limits
    python tools/import_graph.py --json     # the figures as JSON
    python tools/import_graph.py --edges    # every arrow, stage to stage

``tests/test_import_graph.py`` runs it, so the properties cannot regress.
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "kvx_conformance"
#: source folder -> dotted name it is installed as
SOURCES = {"kvx_conformance": PACKAGE, "reference_impl": f"{PACKAGE}.reference_impl", "suites": f"{PACKAGE}.suites"}

#: Stages, bottom first: (name, module prefixes). A module belongs to the stage of its
#: longest matching prefix; a module matching no prefix is reported as unplaced.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("version", (PACKAGE,)),  # kvx_conformance/__init__.py: __version__ only
    ("abi", (f"{PACKAGE}.abi",)),
    ("cases", (f"{PACKAGE}.cases", f"{PACKAGE}.reference_impl")),
    ("adapters", (f"{PACKAGE}.adapters",)),
    ("results", (f"{PACKAGE}.results",)),
    ("suites", (f"{PACKAGE}.suites",)),
    ("report", (f"{PACKAGE}.report",)),
    ("measure", (f"{PACKAGE}.accuracy", f"{PACKAGE}.model", f"{PACKAGE}.bench", f"{PACKAGE}.suites.bench")),
    ("harness", (f"{PACKAGE}.harness",)),
    ("cli", (f"{PACKAGE}.cli", f"{PACKAGE}.loader", f"{PACKAGE}.plugin", f"{PACKAGE}.mutants")),
]
MAX_TOP_MODULES = 6
MAX_PY_LINES = 700
MAX_CUDA_LINES = 900


def discover(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py of the package, the oracle and the suites."""
    mods: dict[str, Path] = {}
    for folder, dotted in SOURCES.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if any(p.startswith(".") or p == "__pycache__" for p in rel.parts) or "_native" in rel.parts:
                continue
            name = ".".join([dotted, *parts])
            if folder == "kvx_conformance" and parts and parts[0] in ("reference_impl", "suites"):
                continue  # links a build may leave in the package folder
            mods[name] = path
    return mods


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imports_of(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported package module, line) for every import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    pkg = _package_of(name, path)
    out: list[tuple[str, int]] = []

    def resolve(target: str) -> str | None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == PACKAGE or a.name.startswith(PACKAGE + "."):
                    t = resolve(a.name)
                    if t:
                        out.append((t, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not (mod == PACKAGE or mod.startswith(PACKAGE + ".")):
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                t = sub if sub in known else resolve(mod)
                if t:
                    out.append((t, node.lineno))
    return [(t, ln) for t, ln in out if t != name]


def stage_of(name: str) -> tuple[int, str] | None:
    best = None
    for rank, (stage, prefixes) in enumerate(STAGES):
        for p in prefixes:
            if name == p or name.startswith(p + "."):
                if best is None or len(p) > best[0]:
                    best = (len(p), rank, stage)
    return (best[1], best[2]) if best else None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def folder_of(name: str) -> str:
    parts = name.split(".")
    if len(parts) == 1:
        return PACKAGE + "/"
    rest = parts[1:]
    return f"{PACKAGE}/" if len(rest) == 1 and name not in _PACKAGES else f"{PACKAGE}/{rest[0]}/"


_PACKAGES: set[str] = set()


def analyse(root: Path = ROOT, alias: dict[str, str] | None = None) -> dict:
    """The figures. ``alias`` renames modules before they are placed in a stage (to
    judge an old tree by the new stage order: old module -> new module)."""
    mods = discover(root)
    _PACKAGES.clear()
    _PACKAGES.update(n for n, p in mods.items() if p.name == "__init__.py")
    known = set(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    lines: dict[tuple[str, str], int] = {}
    for m, p in mods.items():
        for t, ln in imports_of(m, p, known):
            graph[m].add(t)
            lines.setdefault((m, t), ln)
    alias = alias or {}

    def placed(m: str):
        return stage_of(alias.get(m, m))

    unplaced = sorted(m for m in mods if placed(m) is None)
    upward = []
    for m, ts in graph.items():
        sm = placed(m)
        for t in ts:
            st = placed(t)
            if sm and st and st[0] > sm[0]:
                upward.append({"from": m, "to": t, "line": lines[(m, t)], "stages": f"{sm[1]} -> {st[1]}"})
    upward.sort(key=lambda u: (u["from"], u["to"]))
    per_folder: dict[str, list[str]] = defaultdict(list)
    for m, p in mods.items():
        if m.startswith(PACKAGE + ".reference_impl") or m.startswith(PACKAGE + ".suites"):
            continue
        rel = p.relative_to(root)
        per_folder[str(rel.parent) + "/"].append(rel.name)
    top = sorted(per_folder.get(f"{PACKAGE}/", []))
    sizes = []
    for p in sorted((root / PACKAGE).rglob("*.py")):
        if "_native" in p.parts or "reference_impl" in p.parts or "suites" in p.parts.__getitem__(slice(1, None)):
            continue
        sizes.append((len(p.read_text(encoding="utf-8").splitlines()), str(p.relative_to(root))))
    cuda = [(len(p.read_text(encoding="utf-8").splitlines()), str(p.relative_to(root)))
            for p in sorted((root / "csrc").rglob("*")) if p.suffix in (".cu", ".cuh")]
    sizes.sort(reverse=True)
    cuda.sort(reverse=True)
    stage_edges: dict[str, int] = defaultdict(int)
    for m, ts in graph.items():
        for t in ts:
            a, b = placed(m), placed(t)
            if a and b and a[1] != b[1]:
                stage_edges[f"{a[1]} -> {b[1]}"] += 1
    return {
        "modules": len(mods),
        "arrows": sum(len(t) for t in graph.values()),
        "modules_per_folder": {k: len(v) for k, v in sorted(per_folder.items())},
        "top_level_modules": top,
        "cycles": cycles(graph),
        "upward": upward,
        "unplaced": unplaced,
        "largest_python": sizes[:5],
        "largest_cuda": cuda[:3],
        "oversized": [f"{n} lines: {f}" for n, f in sizes if n > MAX_PY_LINES]
                     + [f"{n} lines: {f}" for n, f in cuda if n > MAX_CUDA_LINES],
        "stage_edges": dict(sorted(stage_edges.items())),
    }


def problems(fig: dict) -> list[str]:
    out = [f"circle: {' <-> '.join(c)}" for c in fig["cycles"]]
    out += [f"upward arrow ({u['stages']}): {u['from']} imports {u['to']} (line {u['line']})" for u in fig["upward"]]
    out += [f"unplaced module (add it to STAGES): {m}" for m in fig["unplaced"]]
    if len(fig["top_level_modules"]) > MAX_TOP_MODULES:
        out.append(f"{len(fig['top_level_modules'])} modules directly in {PACKAGE}/ (at most {MAX_TOP_MODULES})")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this checkout)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--edges", action="store_true", help="also list the arrows between stages")
    ap.add_argument("--alias", type=Path, help="JSON {old module: new module} to place the modules of an old tree")
    ap.add_argument("--strict-sizes", action="store_true",
                    help=f"also fail on a Python module over {MAX_PY_LINES} lines or a CUDA file over {MAX_CUDA_LINES}")
    args = ap.parse_args(argv)
    alias = json.loads(args.alias.read_text()) if args.alias else None
    fig = analyse(args.root, alias)
    bad = problems(fig)
    sizes = [f"oversized: {o}" for o in fig["oversized"]]
    if args.strict_sizes:
        bad += sizes
    if args.json:
        print(json.dumps({**fig, "problems": bad}, indent=1))
        return 1 if bad else 0
    print(f"{fig['modules']} modules, {fig['arrows']} arrows; {len(fig['cycles'])} circles, "
          f"{len(fig['upward'])} upward arrows, {len(fig['top_level_modules'])} modules directly in {PACKAGE}/")
    for folder, n in fig["modules_per_folder"].items():
        print(f"  {folder:32s} {n}")
    print("largest: " + ", ".join(f"{f} {n}" for n, f in fig["largest_python"][:3] + fig["largest_cuda"][:1]))
    if args.edges:
        for e, n in fig["stage_edges"].items():
            print(f"  {e}: {n}")
    for b in bad + ([] if args.strict_sizes else sizes):
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
