"""docs/results-schema.md against the keys real results.json / certificate.json files carry.

``undocumented(doc, kind)`` walks a parsed file and returns every key path that the
schema doc does not list in backticks. Paths: ``a.b`` nested, ``a[]`` list elements,
``<name>`` for the keys of a name-keyed map (profiles, entry points, outcomes, ...).
"""
from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "results-schema.md"

#: objects whose keys are names, not fields
MAPS = {
    "results": {"provider.symbols", "provider.struct_sizes", "provider.header_sizes", "provider.memory_support",
                "profiles", "profiles.<name>.counts", "counts", "engines", "breaker", "tests[].tally"},
    "certificate": {"profiles", "counts", "breaker"},
}
#: objects documented as a whole (their keys depend on the machine)
LEAVES = {"results": {"environment.torch", "merged_from[].environment"}, "certificate": set()}


def key_paths(obj, kind: str, prefix: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(obj, dict):
        is_map = prefix in MAPS[kind]
        for k, v in obj.items():
            path = f"{prefix}.{'<name>' if is_map else k}" if prefix else ('<name>' if is_map else k)
            out.add(path)
            if path not in LEAVES[kind]:
                out |= key_paths(v, kind, path)
    elif isinstance(obj, list):
        for v in obj:
            if isinstance(v, (dict, list)):
                out |= key_paths(v, kind, prefix + "[]")
    return out


def documented() -> dict[str, set[str]]:
    text = DOC.read_text(encoding="utf-8")
    res_part, cert_part = text.split("## `certificate.json`", 1)
    grab = lambda part: set(re.findall(r"^\| `([^`]+)` \|", part, re.M))  # noqa: E731
    return {"results": grab(res_part), "certificate": grab(cert_part)}


def undocumented(doc: dict, kind: str) -> list[str]:
    return sorted(key_paths(doc, kind) - documented()[kind])
