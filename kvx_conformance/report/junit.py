"""JUnit XML from results.json: one <testcase> per conformance test, kvx metadata as properties.

Written from the harness's own records rather than pytest's ``--junit-xml`` so that
crashes, timeouts, breaker skips and acceptable UNSUPPORTED answers all come out
with the kvx outcome (pytest would see a crash as an anonymous setup error).
"""
from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

_ELEMENT = {"fail": "failure", "crash": "error", "timeout": "error", "error": "error", "flaky": "failure",
            "skip": "skipped", "unsupported": "skipped"}


def _clean(text: str) -> str:
    # XML 1.0 cannot carry most control characters
    return "".join(ch for ch in (text or "") if ch in "\t\n\r" or ord(ch) >= 0x20)


def junit_tree(results: dict) -> ET.ElementTree:
    tests = results.get("tests", [])
    counts = {"failures": 0, "errors": 0, "skipped": 0}
    suite = ET.Element("testsuite", name="kvx-conform")
    props = ET.SubElement(suite, "properties")
    prov = results.get("provider") or {}
    for name, value in (("verdict", results.get("verdict")), ("provider", prov.get("path")),
                        ("provider_sha256", prov.get("sha256")), ("abi_version", prov.get("abi_version")),
                        ("memory", ",".join(results.get("memory_types") or [])),
                        ("quick", str(bool(results.get("quick")))),
                        ("schema_version", results.get("schema_version"))):
        if value is not None:
            ET.SubElement(props, "property", name=name, value=_clean(str(value)))
    total_time = 0.0
    for t in tests:
        nodeid = t.get("nodeid", t["id"])
        module, _, name = nodeid.partition("::")
        classname = module.replace("/", ".").removesuffix(".py")
        case = ET.SubElement(suite, "testcase", classname=classname, name=name or t["id"],
                             time=f"{float(t.get('duration') or 0):.3f}")
        total_time += float(t.get("duration") or 0)
        cp = ET.SubElement(case, "properties")
        for key in ("id", "clause", "level", "profile", "feature", "outcome", "repro", "waived", "breaker"):
            value = t.get(key)
            if value not in (None, ""):
                ET.SubElement(cp, "property", name=f"kvx.{key}", value=_clean(str(value)))
        if t.get("entry"):
            ET.SubElement(cp, "property", name="kvx.entry", value=",".join(t["entry"]))
        tag = _ELEMENT.get(t["outcome"])
        if tag is None or (t.get("waived") and tag != "skipped"):
            continue
        msg = _clean((t.get("message") or "").strip().splitlines()[0] if (t.get("message") or "").strip() else t["outcome"])
        el = ET.SubElement(case, tag, message=msg[:500], type=f"kvx.{t['outcome']}")
        body = t.get("message") or ""
        if t.get("detail"):
            body += "\n" + t["detail"]
        if t.get("repro"):
            body += f"\nrepro: {t['repro']}"
        el.text = _clean(body)
        counts[{"failure": "failures", "error": "errors", "skipped": "skipped"}[tag]] += 1
    suite.set("tests", str(len(tests)))
    for k, v in counts.items():
        suite.set(k, str(v))
    suite.set("time", f"{total_time:.3f}")
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.ElementTree(root)


def write_junit(results: dict, path: str | os.PathLike) -> None:
    tree = junit_tree(results)
    ET.indent(tree)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tree.write(p, encoding="utf-8", xml_declaration=True)
