"""docs/results-schema.md documents every key results.json, results.jsonl and
certificate.json actually carry (one real `kvx-conform run`; the hostile-provider runs
of test_cli_run.py check their files the same way, breaker keys included)."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from kvx_conformance.results.certificate import CERTIFICATE_SCHEMA, suite_root
from kvx_conformance.results.record import SCHEMA_VERSION, TestRecord

sys.path.insert(0, str(Path(__file__).parent))
from schema_doc import DOC, documented, undocumented  # noqa: E402

CONFORMANCE = suite_root("kvx_conformance.suites") / "conformance"


def test_schema_versions_and_test_record_fields_documented():
    text = DOC.read_text(encoding="utf-8")
    assert f"currently **`{SCHEMA_VERSION}`**" in text, f"docs say another schema version than {SCHEMA_VERSION}"
    assert CERTIFICATE_SCHEMA == SCHEMA_VERSION or f"`{CERTIFICATE_SCHEMA}`" in text
    fields = {f"tests[].{f.name}" for f in dataclasses.fields(TestRecord)}
    missing = sorted(fields - documented()["results"])
    assert not missing, f"TestRecord fields missing from {DOC.name}: {missing}"


def test_real_run_keys_documented(tmp_path):
    exp = tmp_path / "expect.json"
    exp.write_text(json.dumps([{"id": "version.*", "reason": "R-1"}, {"id": "nothing.here", "reason": "R-2"}]))
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps({"profiles": ["core"], "features": ["ragged"]}))
    out = tmp_path / "out"
    script = Path(sys.executable).with_name("kvx-conform")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "kvx_conformance.cli"]
    p = subprocess.run([*cmd, "run", "--suite", str(CONFORMANCE / "test_s3_version.py"), "-n", "1",
                        "--expectations", str(exp), "--claims", str(claims), "--output-dir", str(out),
                        "--progress", "none"], capture_output=True, text=True, timeout=300)
    assert p.returncode in (0, 1), f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    res = json.loads((out / "results.json").read_text(encoding="utf-8"))
    cert = json.loads((out / "certificate.json").read_text(encoding="utf-8"))
    assert res["schema_version"] == SCHEMA_VERSION and cert["certificate_schema"] == CERTIFICATE_SCHEMA
    assert res["tests"] and res["waivers"], "expected tests and waiver rows to check"
    assert undocumented(res, "results") == [], f"results.json keys missing from {DOC.name}"
    assert undocumented(cert, "certificate") == [], f"certificate.json keys missing from {DOC.name}"
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    assert lines == res["tests"], "results.jsonl must hold the same test objects as results.json"


def test_profiles_and_features_named_in_the_docs():
    from kvx_conformance.results.outcomes import OPTIONAL_FEATURES, PROFILES

    schema = DOC.read_text(encoding="utf-8")
    claims = (DOC.parent / "claims-and-expectations.md").read_text(encoding="utf-8")
    for name in PROFILES:
        assert f"`{name}`" in schema and f"`{name}`" in claims, f"profile {name} missing from the docs"
    for name in OPTIONAL_FEATURES:
        assert f"`{name}`" in claims, f"optional feature {name} missing from docs/claims-and-expectations.md"
