"""The README's two commands and .ci/run stay in step."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Two commands on a fresh machine", 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.findall(r"```sh\n(.*?)```", section, re.S)]


def test_readme_has_exactly_two_commands():
    cmds = _readme_commands()
    assert len(cmds) == 2, cmds
    assert "kvx-conform run" in cmds[0]
    assert "pytest" in cmds[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    block = ci.split("# README-TEST-COMMAND-BEGIN\n", 1)[1].split("# README-TEST-COMMAND-END", 1)[0].strip()
    assert block == _readme_commands()[1]
