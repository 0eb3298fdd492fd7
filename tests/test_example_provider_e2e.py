"""End to end: build examples/minimal_provider with its Makefile, certify it with
ci/kvx-certify.sh (core profile, host memory, the example's claims and expectations),
then check the artifacts and `kvx-conform verify` on the certificate: valid as issued,
and a changed provider or a changed suite is reported.

Needs `make` and a C compiler (present in CI); one conformance run of the core
profile (about 20-30 s on 2 cores).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvx_conformance.abi.loader import sha256_of
from kvx_conformance.results.certificate import suite_root

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "minimal_provider"
SCRIPT = ROOT / "ci" / "kvx-certify.sh"


def _kvx_conform() -> str:
    exe = Path(sys.executable).parent / "kvx-conform"
    found = str(exe) if exe.exists() else shutil.which("kvx-conform")
    assert found, f"kvx-conform is not installed beside {sys.executable} nor on PATH"
    return found


def _tools_missing() -> str | None:
    for tool in ("make", os.environ.get("CC", "cc")):
        if shutil.which(tool) is None:
            return tool
    return None


@pytest.fixture(scope="module")
def certified(tmp_path_factory):
    missing = _tools_missing()
    if missing:
        pytest.skip(f"{missing} not found: the example provider cannot be built here")
    tmp = tmp_path_factory.mktemp("e2e")
    build = subprocess.run(["make", "-C", str(EXAMPLE), f"OUT={tmp / 'lib'}", f"KVX_INCLUDE={ROOT / 'csrc' / 'include'}"],
                           capture_output=True, text=True, timeout=120)
    lib = tmp / "lib" / "libkvx_minimal.so"
    assert build.returncode == 0 and lib.exists(), f"make failed ({build.returncode}):\n{build.stdout}\n{build.stderr}"
    assert "warning" not in build.stderr, f"the example builds with warnings:\n{build.stderr}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVX_", "GITHUB_"))}
    if "KVX_CONFORM_NATIVE_DIR" in os.environ:
        env["KVX_CONFORM_NATIVE_DIR"] = os.environ["KVX_CONFORM_NATIVE_DIR"]
    env.update(KVX_CONFORM=_kvx_conform(), KVX_CLAIMS=str(EXAMPLE / "kvx-claims.yaml"),
               KVX_EXPECTATIONS=str(EXAMPLE / "kvx-expectations.yaml"), KVX_MEMORY="host", KVX_PROFILES="core",
               KVX_WORKERS="2")
    out = tmp / "kvx-results"
    r = subprocess.run(["bash", str(SCRIPT), str(lib), str(out)], capture_output=True, text=True, env=env,
                       cwd=tmp, timeout=600)
    return lib, out, r


def test_script_certifies_the_example(certified):
    lib, out, r = certified
    tail = "\n".join((r.stdout + r.stderr).splitlines()[-40:])
    assert r.returncode == 0, f"ci/kvx-certify.sh: expected exit 0 (certified), got {r.returncode}\n{tail}"
    for name in ("report.html", "junit.xml", "results.json", "certificate.json"):
        assert (out / name).stat().st_size > 0, f"artifact {name} missing or empty in {out}"
    cert = json.loads((out / "certificate.json").read_text())
    assert cert["verdict"] == "certified" and cert["certifying"], cert
    assert cert["claimed_profiles"] == ["core"] and cert["profiles"]["core"]["verdict"] == "certified"
    assert cert["provider"]["sha256"] == sha256_of(lib)
    results = json.loads((out / "results.json").read_text())
    core = [t for t in results["tests"] if t["profile"] == "core"]
    bad = [(t["id"], t["outcome"]) for t in core if t["outcome"] in ("fail", "crash", "timeout", "error")]
    assert len(core) > 200 and not bad, f"{len(core)} core tests; problems: {bad[:10]}"
    suites = ET.parse(out / "junit.xml").getroot()
    cases = suites.iter("testcase")
    assert sum(1 for _ in cases) == results["total"], "junit.xml and results.json disagree on the test count"
    assert "valid:" in r.stdout, f"the script did not verify the certificate:\n{tail}"


def _verify(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([_kvx_conform(), "verify", *args], capture_output=True, text=True, timeout=120)


def test_verify_accepts_the_certificate(certified):
    lib, out, _ = certified
    r = _verify(str(out / "certificate.json"), "--provider", str(lib))
    assert r.returncode == 0 and r.stdout.startswith("valid:"), (r.returncode, r.stdout, r.stderr)
    js = json.loads(_verify(str(out / "certificate.json"), "--provider", str(lib), "--json").stdout)
    assert js["valid"] and js["provider"]["sha256"] == js["provider"]["certified_sha256"] == sha256_of(lib)


def test_verify_reports_a_changed_provider(certified, tmp_path):
    lib, out, _ = certified
    tampered = tmp_path / "libkvx_minimal.so"
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, inside the binary
    tampered.write_bytes(bytes(data))
    r = _verify(str(out / "certificate.json"), "--provider", str(tampered))
    lines = r.stdout.splitlines()
    assert r.returncode == 1, f"expected exit 1 for a changed provider, got {r.returncode}: {r.stdout}{r.stderr}"
    assert len(lines) == 1 and lines[0].startswith("provider changed:") and sha256_of(tampered) in lines[0], lines


def test_verify_reports_a_changed_suite(certified, tmp_path):
    lib, out, _ = certified
    cert = json.loads((out / "certificate.json").read_text())
    src = suite_root(cert["suites"]["source"])
    copy = tmp_path / "suites"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__"))
    same = _verify(str(out / "certificate.json"), "--provider", str(lib), "--suite", str(copy))
    assert same.returncode == 0, f"an identical copy of the suites must verify: {same.stdout}{same.stderr}"
    victim = sorted(copy.rglob("test_*.py"))[0]
    victim.write_text(victim.read_text() + "\n# changed\n")
    r = _verify(str(out / "certificate.json"), "--provider", str(lib), "--suite", str(copy))
    lines = r.stdout.splitlines()
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("suite changed:"), (r.returncode, lines)


def test_verify_bad_input(tmp_path, certified):
    lib, out, _ = certified
    assert _verify(str(tmp_path / "missing.json")).returncode == 9
    (tmp_path / "x.json").write_text('{"kind": "something else"}')
    assert _verify(str(tmp_path / "x.json")).returncode == 9
    r = _verify(str(out / "certificate.json"), "--provider", str(tmp_path / "gone.so"))
    assert r.returncode == 3 and "provider not found" in r.stderr, (r.returncode, r.stderr)
    cert = json.loads((out / "certificate.json").read_text())
    cert.update(verdict="not certified", certifying=True)
    (tmp_path / "nc.json").write_text(json.dumps(cert))
    r = _verify(str(tmp_path / "nc.json"), "--provider", str(lib))
    assert r.returncode == 1 and r.stdout.startswith("not a certification:"), (r.returncode, r.stdout)
