"""The vendor CI templates (ci/) parse, and every kvx-conform command they name is real.

- ci/github/kvx-certify.yml and ci/gitlab/kvx-certify.gitlab-ci.yml parse as YAML, call
  ci/kvx-certify.sh, upload the four artifacts, and set only variables the script reads;
- every ``kvx-conform SUB --flag`` written in the templates and in docs/certify-in-ci.md
  names a subcommand of ``cli.COMMANDS`` and flags of that subcommand's parser;
- ci/kvx-certify.sh passes ``bash -n``; run with ``KVX_CONFORM`` pointing at a recorder
  that parses each command line with the real ``kvx-conform`` parser, the exact command
  lines it builds (run, verify, bench, compare) parse, and its exit status follows the
  first failing step.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")  # the [test] extra

from kvx_conformance import cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "ci" / "kvx-certify.sh"
GITHUB = ROOT / "ci" / "github" / "kvx-certify.yml"
GITLAB = ROOT / "ci" / "gitlab" / "kvx-certify.gitlab-ci.yml"
DOC = ROOT / "docs" / "certify-in-ci.md"
ARTIFACTS = ("report.html", "junit.xml", "results.json", "certificate.json")


def _subparsers() -> dict:
    parser = cli.build_parser()
    for action in parser._actions:
        if action.choices and isinstance(action.choices, dict):
            return action.choices
    raise AssertionError("kvx-conform has no subcommands")


def _option_strings(sub) -> set[str]:
    return {o for a in sub._actions for o in a.option_strings}


def _script_variables() -> set[str]:
    return set(re.findall(r"\$\{?(KVX_[A-Z_]+)", SCRIPT.read_text()))


def _kvx_mentions(text: str) -> list[tuple[str, list[str]]]:
    """(subcommand, --flags) of every command-like `kvx-conform SUB ...` in text.

    Command-like: at the start of a line or comment, after a backtick, `$ ` or `(`, so that
    prose ("the kvx-conform checkout") is not read as a command.
    """
    out = []
    text = re.sub(r"\\\n\s*", " ", text)  # join shell line continuations
    for line in text.splitlines():
        for m in re.finditer(r"(?:^[\s#]*|[`(]|\$ )kvx-conform ([a-z][a-z-]*)([^`|\n]*)", line):
            flags = re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-zA-Z](?=\s|$))", m.group(2))
            out.append((m.group(1), flags))
    return out


# ---------------------------------------------------------------------------- YAML


@pytest.mark.parametrize("path", [GITHUB, GITLAB], ids=["github", "gitlab"])
def test_template_parses_and_calls_the_script(path):
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict), f"{path.name}: expected a mapping at the top, got {type(doc).__name__}"
    scripts = []
    if path is GITHUB:
        assert {"cpu", "gpu"} <= set(doc["jobs"]), f"{path.name}: jobs {sorted(doc['jobs'])}, want cpu and gpu"
        assert "self-hosted" in doc["jobs"]["gpu"]["runs-on"], "the GPU job must target a self-hosted runner"
        for name, job in doc["jobs"].items():
            if name == "build":  # the sharded variant's build-once job (test_sharded_variant)
                continue
            runs = [s.get("run", "") for s in job["steps"]]
            scripts += runs
            assert any("ci/kvx-certify.sh" in r for r in runs), f"job {name} does not call ci/kvx-certify.sh"
            uploads = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")]
            assert uploads and uploads[0].get("if") == "always()", f"job {name}: upload artifacts always"
            paths = uploads[0]["with"]["path"]
            for a in ARTIFACTS:
                assert f"kvx-results/{a}" in paths, f"job {name} does not upload {a}: {paths!r}"
        env_names = set(doc.get("env", {}))
        for job in doc["jobs"].values():
            env_names |= set(job.get("env", {}))
            for s in job["steps"]:
                env_names |= set(s.get("env", {}) or {})
    else:
        jobs = {k: v for k, v in doc.items() if isinstance(v, dict) and "extends" in v}
        assert {"kvx-certify-cpu", "kvx-certify-gpu"} <= set(jobs), f"{path.name}: jobs {sorted(jobs)}"
        base = doc[".kvx-certify"]
        scripts += base["script"]
        assert any("ci/kvx-certify.sh" in s for s in base["script"]), "the GitLab job does not call the script"
        assert base["artifacts"]["when"] == "always"
        for a in ARTIFACTS:
            assert any(p in (f"kvx-results/{a}",) for p in base["artifacts"]["paths"]), f"artifact {a} missing"
        assert base["artifacts"]["reports"]["junit"] == "kvx-results/junit.xml"
        env_names = set(doc.get("variables", {}))
        for job in [v for v in doc.values() if isinstance(v, dict)]:
            env_names |= set(job.get("variables", {}) or {})
    known = _script_variables() | {"KVX_PROVIDER"}
    unknown = sorted(n for n in env_names if n.startswith("KVX_") and n not in known)
    assert not unknown, f"{path.name} sets {unknown}, which ci/kvx-certify.sh does not read (typo?)"
    assert "example.invalid" not in path.read_text(), f"{path.name} still has a placeholder install spec"
    for s in scripts:
        for word in shlex.split(s, comments=True):
            if word.startswith(("examples/", "ci/")) and not word.endswith(".so"):
                assert (ROOT / word).exists(), f"{path.name} names {word}, which does not exist"


def test_sharded_variant():
    """Shards (a GitHub matrix, GitLab `parallel:`) run one built binary, then one job merges and verifies."""
    gh = yaml.safe_load(GITHUB.read_text())["jobs"]
    matrix = gh["shard"]["strategy"]["matrix"]["shard"]
    assert gh["shard"]["needs"] == "build" and gh["merge"]["needs"] == "shard"
    assert gh["merge"]["if"] == "${{ !cancelled() }}", "merge must run (or refuse) after a failed shard"
    step = next(s for s in gh["shard"]["steps"] if "ci/kvx-certify.sh" in s.get("run", ""))
    assert step["env"]["KVX_SHARD"] == f"${{{{ matrix.shard }}}}/{len(matrix)}" and matrix == list(
        range(1, len(matrix) + 1)), (step["env"], matrix)
    up = [s for s in gh["shard"]["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert up[0]["with"]["name"] == "kvx-shard-${{ matrix.shard }}" and "kvx-results/results.json" in \
        up[0]["with"]["path"]
    down = [s["with"] for s in gh["merge"]["steps"] if str(s.get("uses", "")).startswith("actions/download")]
    assert {"name": "kvx-provider", "path": "examples/minimal_provider"} in down
    assert {"pattern": "kvx-shard-*", "path": "kvx-parts"} in down
    merge = next(s for s in gh["merge"]["steps"] if "ci/kvx-certify.sh" in s.get("run", ""))
    assert merge["env"]["KVX_MERGE_FROM"] == "kvx-parts/*"
    built = gh["build"]["steps"][-1]["with"]["path"]
    assert built == yaml.safe_load(GITHUB.read_text())["env"]["KVX_PROVIDER"]

    gl = yaml.safe_load(GITLAB.read_text())
    shard, merge, build = gl["kvx-certify-shard"], gl["kvx-certify-merge"], gl["kvx-provider-build"]
    assert isinstance(shard["parallel"], int) and shard["parallel"] >= 2
    assert any('KVX_SHARD="$CI_NODE_INDEX/$CI_NODE_TOTAL"' in line for line in shard["script"])
    assert any('"kvx-parts/$CI_NODE_INDEX"' in line for line in shard["script"]), "each shard needs its own folder"
    assert "kvx-parts/" in shard["artifacts"]["paths"] and shard["artifacts"]["when"] == "always"
    assert merge["variables"]["KVX_MERGE_FROM"] == "kvx-parts/*" and merge["when"] == "always"
    assert set(merge["needs"]) == {"kvx-provider-build", "kvx-certify-shard"}
    assert shard["needs"] == ["kvx-provider-build"]
    assert gl["variables"]["KVX_PROVIDER"] in build["artifacts"]["paths"]
    stages = gl["stages"]
    assert stages.index(build["stage"]) < stages.index(shard["stage"]) < stages.index(merge["stage"])
    for a in ARTIFACTS:
        assert f"kvx-results/{a}" in merge["artifacts"]["paths"]


# ---------------------------------------------------------------------------- commands named in text


@pytest.mark.parametrize("path", [GITHUB, GITLAB, SCRIPT, DOC], ids=["github", "gitlab", "script", "doc"])
def test_named_commands_and_flags_exist(path):
    subs = _subparsers()
    mentions = _kvx_mentions(path.read_text())
    assert mentions or path is GITLAB, f"{path.name} names no kvx-conform command"
    for sub, flags in mentions:
        assert sub in cli.COMMANDS, f"{path.name}: `kvx-conform {sub}` is not a command (cli.COMMANDS: " \
                                    f"{sorted(cli.COMMANDS)})"
        bad = [f for f in flags if f not in _option_strings(subs[sub])]
        assert not bad, f"{path.name}: `kvx-conform {sub}` has no option {bad}"


# ---------------------------------------------------------------------------- the shell script


def test_script_is_valid_bash():
    r = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 0, f"bash -n ci/kvx-certify.sh: {r.stderr}"


RECORDER = """\
#!{python}
# Records one kvx-conform command line after parsing it with the real parser.
import json, os, sys
sys.path.insert(0, {root!r})
from kvx_conformance import cli
argv = sys.argv[1:]
if argv == ["--version"]:
    print("kvx-conform (recorder)")
    sys.exit(0)
cli.build_parser().parse_args(argv)  # exits 2 on an unknown command or flag
with open(os.environ["KVX_RECORD"], "a") as f:
    f.write(json.dumps(argv) + "\\n")
codes = json.loads(os.environ.get("KVX_RECORD_CODES", "{{}}"))
sys.exit(int(codes.get(argv[0], 0)))
"""


@pytest.fixture()
def recorder(tmp_path):
    exe = tmp_path / "kvx-conform-recorder"
    exe.write_text(RECORDER.format(python=sys.executable, root=str(ROOT)))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    provider = tmp_path / "libfoo.so"
    provider.write_bytes(b"\x7fELF not really")
    baseline = tmp_path / "base.json"
    baseline.write_text("{}")

    def run(codes=None, **env):
        record = tmp_path / "record.jsonl"
        record.unlink(missing_ok=True)
        e = {k: v for k, v in os.environ.items() if not k.startswith(("KVX_", "GITHUB_"))}
        e.update(KVX_CONFORM=str(exe), KVX_RECORD=str(record), KVX_RECORD_CODES=json.dumps(codes or {}))
        e.update({k: str(v).format(baseline=baseline) for k, v in env.items()})
        r = subprocess.run(["bash", str(SCRIPT), str(provider), str(tmp_path / "out")], capture_output=True,
                           text=True, env=e, cwd=tmp_path, timeout=120)
        lines = record.read_text().splitlines() if record.exists() else []
        return r, [json.loads(x) for x in lines]

    return run


def test_script_command_lines_parse(recorder):
    claims = ROOT / "examples" / "minimal_provider" / "kvx-claims.yaml"
    r, calls = recorder(KVX_CLAIMS=claims, KVX_EXPECTATIONS=claims.with_name("kvx-expectations.yaml"),
                        KVX_MEMORY="host", KVX_PROFILES="core robustness", KVX_WORKERS=2, KVX_BENCH="quick",
                        KVX_BENCH_BASELINE="{baseline}", KVX_MAX_REGRESSION=7, KVX_FAIL_BELOW=10,
                        KVX_MIN_BYTES="256e6", KVX_BENCH_ARGS="--filter 'write-nhd-*' --no-peers")
    assert r.returncode == 0, f"expected exit 0, got {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert [c[0] for c in calls] == ["run", "verify", "bench", "compare"], calls
    run, verify, bench, compare = calls
    assert run[run.index("--claims") + 1] == str(claims)
    assert run.count("--profile") == 2 and "--junit-xml" in run and run[run.index("-n") + 1] == "2"
    assert verify[1].endswith("out/certificate.json") and "--provider" in verify
    assert bench[bench.index("--preset") + 1] == "quick" and bench[bench.index("--filter") + 1] == "write-nhd-*"
    assert "--no-peers" in bench and compare[compare.index("--min-bytes") + 1] == "256e6"
    assert compare[2].endswith("out/bench/results.json")
    assert compare[compare.index("--max-regression") + 1] == "7" and compare[compare.index("--fail-below") + 1] == "10"


def test_script_shard_and_merge(recorder, tmp_path):
    dur = tmp_path / "durations.json"
    dur.write_text("{}")
    r, calls = recorder(KVX_SHARD="2/3", KVX_DURATIONS=dur, KVX_BENCH="quick", KVX_GPUS="0,1")
    assert r.returncode == 0, r.stderr
    assert [c[0] for c in calls] == ["run"], "a shard is not a certificate: no verify, no bench"
    run = calls[0]
    assert run[run.index("--shard") + 1] == "2/3" and run[run.index("--durations-from") + 1] == str(dur)
    assert run[run.index("--gpus") + 1] == "0,1"
    r, calls = recorder(codes={"run": 1}, KVX_SHARD="1/3")
    assert r.returncode == 1 and [c[0] for c in calls] == ["run"]
    for k in (1, 2):
        (tmp_path / "parts" / f"kvx-shard-{k}").mkdir(parents=True)
    r, calls = recorder(KVX_MERGE_FROM="parts/*")
    assert r.returncode == 0, r.stderr
    assert [c[0] for c in calls] == ["merge", "verify"], calls
    assert calls[0][1:3] == ["parts/kvx-shard-1", "parts/kvx-shard-2"] and "--output-dir" in calls[0]
    r, calls = recorder(codes={"merge": 14}, KVX_MERGE_FROM="parts/*")
    assert r.returncode == 14 and [c[0] for c in calls] == ["merge"]


@pytest.mark.parametrize("failing,code,expected_calls", [
    ("run", 10, ["run"]),              # e.g. memory type unavailable: the run's code, no verify, no bench
    ("verify", 1, ["run", "verify"]),  # certificate mismatch: no bench
    ("compare", 1, ["run", "verify", "bench", "compare"]),  # bandwidth regression
])
def test_script_exit_status_is_the_first_failure(recorder, failing, code, expected_calls):
    r, calls = recorder(codes={failing: code}, KVX_BENCH_BASELINE="{baseline}")
    assert r.returncode == code, f"{failing} exiting {code}: expected script exit {code}, got {r.returncode}\n" \
                                 f"{r.stdout}\n{r.stderr}"
    assert [c[0] for c in calls] == expected_calls


def test_script_rejects_missing_inputs(recorder, tmp_path):
    r, calls = recorder(KVX_CLAIMS=tmp_path / "nope.yaml")
    assert r.returncode == 9 and not calls and "nope.yaml" in r.stderr, (r.returncode, r.stderr)
    r, calls = recorder(KVX_BENCH_BASELINE=tmp_path / "nope.json")
    assert r.returncode == 9 and not calls and "record one with" in r.stderr, (r.returncode, r.stderr)
    r2 = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "missing.so")], capture_output=True, text=True,
                        env={**os.environ, "KVX_CONFORM": "/bin/false"}, cwd=tmp_path)
    assert r2.returncode == 3 and "provider not found" in r2.stderr, (r2.returncode, r2.stderr)
