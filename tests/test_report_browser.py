"""The HTML conformance report renders in a real headless browser (Debian's chromium).

A real `kvx-conform run` of a mutant (failures with expected / got, descriptors and
repro commands) writes report.html; chromium loads it with console logging on, and the
page must produce no console message and no script error (the report's own error hook
writes ``data-js-errors`` on <html>), and the verdict banner must be in the DOM. Skips
only when no chromium is installed (.ci/run installs it).
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvx_conformance.abi import native

sys.path.insert(0, str(Path(__file__).parent))
from browser import chromium, open_headless  # noqa: E402



@pytest.mark.browser
@pytest.mark.skipif(chromium() is None, reason="no chromium installed (.ci/run installs Debian's chromium)")
def test_report_renders_in_headless_chromium(tmp_path):
    out = tmp_path / "out"
    script = Path(sys.executable).with_name("kvx-conform")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "kvx_conformance.cli"]
    # the bundled suite's core profile: a module of it alone (--suite) would read "not certifying"
    p = subprocess.run([*cmd, "run", str(native.mutant_provider("v_into_k")), "--profile", "core", "-n", "1",
                        "--reruns", "0", "--output-dir", str(out), "--progress", "none"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, f"expected exit 1 (not certified), got {p.returncode}\n{p.stdout[-2000:]}{p.stderr}"
    html = (out / "report.html").read_text(encoding="utf-8")
    # self-contained: nothing fetched from the network
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html, re.I), "report loads a remote resource"

    r = open_headless(out / "report.html")
    assert r.checked, f"expected the page to load in chromium (rc {r.returncode}):\n{r.stderr_tail}"
    assert r.console == [], f"expected no console messages, got {r.console}"
    assert 'data-js-errors="0"' in r.dom, \
        f"expected no script errors, got {re.findall(r'data-js-error[^>]*', r.dom)[:3]}"
    assert r.broken == 0, f"{r.broken} broken image(s)"
    m = re.search(r'<div class="banner (\w+)" id="verdict" data-verdict="([^"]+)"', r.dom)
    assert m and m.group(2) == "not certified" and m.group(1) == "bad", \
        f"expected the 'not certified' verdict banner in the DOM, got {m.group(0) if m else None}"
    assert "kvx-conform run " in r.dom and "expected" in r.dom, "failures with repro commands must render"
