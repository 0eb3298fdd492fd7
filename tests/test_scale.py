"""Several GPUs and several machines, tested on the CPU (docs/scale.md).

- GPU parsing, assignment (device counts given: 8 GPUs / 5 workers, 2 GPUs / 4 workers,
  a replaced worker), binding env, the run's GPU plan, the slow-GPU flag and the bench
  split / join (probe figures injected);
- the real xdist hooks: workers bound through ``--kvx-gpus`` (no GPU needed: the binding
  is an environment variable), a crashed worker's replacement bound too, each record's
  ``gpu`` the one its worker saw;
- shards: balanced, deterministic partitions; three shards of the bundled host provider
  merged equal one full run (ids, outcomes, verdict) and give a certificate that
  verifies; a missing shard, a shard of another provider, overlapping or differently
  configured parts are refused with one line and exit 14;
- ``compare`` of two conformance results lists exactly the tests that changed.
"""
from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvx_conformance.abi import gpus
from kvx_conformance.abi.loader import EXIT_MERGE_REFUSED
from kvx_conformance.results import shards
from kvx_conformance.results.compare import compare_results

ROOT = Path(__file__).resolve().parents[1]


def kvx(*args, timeout=600):
    script = Path(sys.executable).with_name("kvx-conform")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "kvx_conformance.cli"]
    return subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------- GPUs


def test_parse_gpus():
    assert gpus.parse_gpus(None, 4) == [0, 1, 2, 3]
    assert gpus.parse_gpus("all", 2) == [0, 1]
    assert gpus.parse_gpus("0,2", 4) == [0, 2]
    assert gpus.parse_gpus("0-3,6", 8) == [0, 1, 2, 3, 6]
    assert gpus.parse_gpus(None, 0) == []
    for bad, why in [("0,8", "not visible"), ("1,1", "named twice"), ("x", "not a GPU index"), ("3-1", "backwards"),
                     ("0,,1", "empty entry"), ("0", "no GPU")]:
        with pytest.raises(gpus.GpuSpecError, match=why):
            gpus.parse_gpus(bad, 0 if why == "no GPU" else 8)


def test_visible_devices_and_binding():
    assert gpus.visible_devices(3, {}) == ["0", "1", "2"]
    env = {"CUDA_VISIBLE_DEVICES": "4,5,GPU-abc"}
    vis = gpus.visible_devices(3, env)
    assert vis == ["4", "5", "GPU-abc"]
    # its own GPU first, then the run's other GPUs; GPUs the run does not use stay hidden
    assert gpus.binding(2, [0, 2], vis) == "GPU-abc,4"
    assert gpus.binding(0, [0, 1, 2], vis) == "4,5,GPU-abc"
    with pytest.raises(ValueError):
        gpus.binding(1, [0, 2], vis)
    e: dict = {}
    assert gpus.bind_process(1, [0, 1], ["0", "1"], e) == [] and e == {"CUDA_VISIBLE_DEVICES": "1,0",
                                                                        "KVX_CONFORM_GPU": "1"}
    assert gpus.bound_gpu(e) == 1 and gpus.bound_gpu({}) is None


@pytest.mark.parametrize("count,workers,expected", [
    (8, 5, [0, 1, 2, 3, 4]),        # 8 GPUs, 5 workers: five GPUs get one each
    (2, 4, [0, 1, 0, 1]),           # 2 GPUs, 4 workers: two each
    (1, 3, [0, 0, 0]),
])
def test_assignment(count, workers, expected):
    chosen = gpus.parse_gpus(None, count)
    assert gpus.spread(workers, chosen) == expected
    a = gpus.Assigner(chosen)
    assert [a.assign(f"gw{i}") for i in range(workers)] == expected
    assert a.assign("gw0") == expected[0]  # idempotent


def test_replaced_worker_takes_the_freed_gpu():
    a = gpus.Assigner([0, 1])
    assert [a.assign(w) for w in ("gw0", "gw1", "gw2", "gw3")] == [0, 1, 0, 1]
    a.release("gw1")  # crashed; xdist starts gw4 in its place
    assert a.assign("gw4") == 1
    assert a.gpu_of("gw1") == 1 and a.gpu_of("gw4") == 1  # the crashed worker's tests ran on GPU 1
    a.release("gw0")
    a.release("gw2")
    assert [a.assign(w) for w in ("gw5", "gw6", "gw7", "gw8")] == [0, 0, 0, 1]  # least loaded, ties: first
    assert gpus.Assigner([]).assign("gw0") is None


def test_run_gpu_plan():
    from kvx_conformance.harness.scale import plan_gpus

    ns = lambda **kw: argparse.Namespace(**{"gpus": None, "workers": None, **kw})  # noqa: E731
    env8 = {"torch": {"gpu_count": 8}}
    p = plan_gpus(ns(), "device", env8, 4, env={})
    assert p.gpus == list(range(8)) and p.workers == 8  # default -n: one worker per GPU
    assert p.pytest_args() == ["--kvx-gpus", "0,1,2,3,4,5,6,7", "--kvx-gpu-visible", "0,1,2,3,4,5,6,7"]
    p = plan_gpus(ns(gpus="0-7", workers=5), "device", env8, 5, env={})
    assert p.workers == 5 and any("5,6,7 get no worker" in n for n in p.notes)
    p = plan_gpus(ns(), "device", {"torch": {"gpu_count": 1}}, 4, env={})
    assert p.gpus == [0] and p.workers == 4 and not p.notes  # one GPU: as before, records name GPU 0
    assert plan_gpus(ns(), "device", {"torch": None}, 4).gpus is None
    assert plan_gpus(ns(gpus="0"), "host", env8, 4).pytest_args() == []
    with pytest.raises(ValueError, match="not visible"):
        plan_gpus(ns(gpus="0,9"), "device", env8, 4, env={})
    with pytest.raises(ValueError, match="no GPU"):
        plan_gpus(ns(gpus="0"), "device", {"torch": {"gpu_count": 0}}, 4)


def test_slow_gpu_flag():
    g = 1e9
    assert gpus.slow_gpus({0: 3000 * g, 1: 2990 * g, 2: 3010 * g, 3: 2800 * g}) == \
        {3: {"figure": 2800 * g, "others_median": 3000 * g, "below_pct": 6.67}}
    assert gpus.slow_gpus({0: 3000 * g, 1: 2900 * g}) == {}  # 3.3 %: within 5 %
    assert set(gpus.slow_gpus({0: 3000 * g, 1: 2800 * g})) == {1}
    assert gpus.slow_gpus({0: 3000 * g}) == {} and gpus.slow_gpus({0: 3000 * g, 1: None}) == {}


def test_bench_split_and_join():
    from kvx_conformance.bench import multigpu
    from kvx_conformance.bench.sweep import preset

    cases = preset("quick", "device")
    plan = multigpu.split(cases, [0, 1, 2])
    assert sorted(c.id for g in plan for c in plan[g]) == sorted(c.id for c in cases)
    assert plan == multigpu.split(cases, [0, 1, 2])  # deterministic
    cost = {g: sum(c.bytes_moved() + multigpu.CASE_OVERHEAD_BYTES for c in v) for g, v in plan.items()}
    assert max(cost.values()) - min(cost.values()) <= max(c.bytes_moved() for c in cases) + multigpu.CASE_OVERHEAD_BYTES
    env = multigpu.child_env(1, ["4", "5", "6"], base={"PATH": "/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "5" and env["KVX_CONFORM_GPU"] == "1"

    def child(g, roof):
        recs = [{"case": c.to_dict(), "impls": {"provider": {"bandwidth_Bps": 1e11, "time_s": 1e-3,
                                                            "pct_roofline": 100e11 / roof}}, "ratios": {}}
                for c in plan[g]]
        return {"schema": "kvx-conform.bench/1", "preset": "quick", "memory": "device", "label": f"x (GPU {g})",
                "environment": {"gpu": {"name": f"H{g}", "sm_count": 132, "memory_bytes": 8e10, "l2_bytes": 5e7, "capability": "9.0"}}, "elapsed_s": 10.0 + g,
                "roofline": {"start": {"bandwidth_Bps": roof}, "end": {"bandwidth_Bps": roof},
                             "bandwidth_Bps": roof, "method": "copy", "drift_pct": 0.0}, "cases": recs}

    doc = multigpu.join({0: child(0, 3000e9), 1: child(1, 3010e9), 2: child(2, 2700e9)}, [c.id for c in cases])
    assert [r["case"]["id"] for r in doc["cases"]] == [c.id for c in cases]  # preset order
    assert all(r["gpu"] in (0, 1, 2) and r in [*doc["cases"]] for r in doc["cases"])
    assert {r["case"]["id"]: r["gpu"] for r in doc["cases"]} == {c.id: g for g in plan for c in plan[g]}
    assert set(doc["gpu_probe"]["slow"]) == {"2"} and doc["elapsed_s"] == 12.0 and doc["label"] == "x"
    assert doc["summary"]["cases"] == len(cases) and doc["gpus"]["1"]["cases"] == len(plan[1])
    assert "GPU 2 is 10.2% slower" in multigpu.slow_lines(doc)[0]
    from kvx_conformance.bench.report import render

    html = render(doc)
    assert "GPU 2" in html and "slower than the others" in html


# ---------------------------------------------------------------------------- the xdist hooks


SUITE = '''
import json, os, pytest
from kvx_conformance.results.outcomes import conformance

@conformance("bind.probe", "spec 7", "required", "core")
@pytest.mark.parametrize("i", range(6))
def test_probe(i):
    out = os.environ["PROBE_OUT"]
    with open(os.path.join(out, f"{i}.json"), "w") as f:
        json.dump({"cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpu": os.environ.get("KVX_CONFORM_GPU"),
                   "worker": os.environ.get("PYTEST_XDIST_WORKER")}, f)
    if i == 2 and os.environ.get("PYTEST_XDIST_WORKER") == "gw1":
        os._exit(3)  # the worker dies: xdist replaces it, the replacement is bound too
'''


def test_workers_bound_through_xdist(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_probe.py").write_text(textwrap.dedent(SUITE))
    probe, out = tmp_path / "probe", tmp_path / "out"
    probe.mkdir()
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\naddopts =\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["PROBE_OUT"] = str(probe)
    r = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ini), "--rootdir", str(suite), "-p",
                        "kvx_conformance.plugin", "-p", "no:cacheprovider", "-n", "2", "--dist", "load",
                        "--max-worker-restart", "4", "--kvx-output-dir", str(out), "--kvx-progress", "none",
                        "--kvx-gpus", "0,1", "--kvx-gpu-visible", "7,3", "-q", str(suite)],
                       capture_output=True, text=True, env=env, timeout=300)
    doc = json.loads((out / "results.json").read_text())
    recs = {t["id"]: t for t in doc["tests"]}
    assert len(recs) == 6, r.stdout[-2000:] + r.stderr[-2000:]
    seen = {int(p.stem): json.loads(p.read_text()) for p in probe.glob("*.json")}
    for i, s in seen.items():
        rec = recs[f"bind.probe[{i}]"]
        assert s["cvd"] == {"0": "7,3", "1": "3,7"}[s["gpu"]], s  # its GPU first, the other after it
        assert rec["gpu"] == int(s["gpu"]), (rec, s)
    crashed = recs["bind.probe[2]"]
    if crashed["outcome"] == "crash":  # load scheduling gave it to gw1 (GPU 1), which died
        assert crashed["gpu"] == 1 and crashed["worker"] == "gw1"
        # a replacement worker (gw2, ...) is bound like the others: the loop above checked its tests
        # (which GPU it takes depends on which workers are still live: tests above, on the Assigner)


# ---------------------------------------------------------------------------- shards


def test_partition_by_count_and_durations():
    tests = [(f"t{i:02d}", f"n{i:02d}") for i in range(10)]
    parts = shards.partition(tests, 3)
    assert sorted(parts.count(p) for p in range(3)) == [3, 3, 4]
    assert parts == shards.partition(list(tests), 3)
    assert shards.partition(list(reversed(tests)), 3) == list(reversed(parts))  # by id, not by given order
    dur = {"n00": 9.0, "n01": 5.0, "n02": 4.0, "n03": 3.0, "n04": 3.0}  # the others: the median, 4.0
    parts = shards.partition(tests, 3, dur)
    load = [sum(dur.get(t[1], 4.0) for t, p in zip(tests, parts) if p == k) for k in range(3)]
    assert max(load) - min(load) <= 4.0 and parts[0] != parts[1]
    keep, info = shards.select(tests, 2, 3, dur, "abc", "/x/results.json")
    assert [parts[i] for i in keep] == [1] * len(keep) and info["index"] == 2 and info["count"] == 3
    assert info["selection"] == {"tests": 10, "sha256": shards.selection_hash(t[1] for t in tests)}
    assert info["balance"] == "durations" and info["durations_from"]["sha256"] == "abc"
    for bad in ("3", "0/3", "4/3", "a/b", "1/0"):
        with pytest.raises(shards.ShardSpecError):
            shards.parse_shard(bad)


def _runs(base):
    """One full host run of the bundled provider, and its three shards balanced by its durations."""
    full = base / "full"
    p = kvx("run", "--output-dir", full, "--progress", "none", "-n", "2")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    parts = []
    for k in (1, 2, 3):
        d = base / f"part{k}"
        p = kvx("run", "--output-dir", d, "--progress", "none", "-n", "2", "--shard", f"{k}/3",
                "--durations-from", full / "results.json")
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        assert "NOT CERTIFYING: shard" in p.stdout
        parts.append(d)
    return base, full, parts


def _outcomes(doc):
    return {t["id"]: t["outcome"] for t in doc["tests"]}


def _three_shards_merged_equal_one_full_run(runs, tmp_path):
    base, full, parts = runs
    docs = [json.loads((d / "results.json").read_text()) for d in parts]
    full_doc = json.loads((full / "results.json").read_text())
    for k, d in enumerate(docs, 1):
        assert d["shard"]["index"] == k and d["shard"]["count"] == 3 and d["shard"]["balance"] == "durations"
        assert d["verdict"] == "not certifying (partial selection)" and not d["certifying"]
        cert = json.loads((parts[k - 1] / "certificate.json").read_text())
        assert not cert["certifying"] and cert["note"].startswith("NOT CERTIFYING")
    sizes = [len(d["tests"]) for d in docs]
    assert sum(sizes) == len(full_doc["tests"]) == docs[0]["shard"]["selection"]["tests"]
    out = tmp_path / "merged"
    p = kvx("merge", *parts, "--output-dir", out)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    merged = json.loads((out / "results.json").read_text())
    assert _outcomes(merged) == _outcomes(full_doc)
    assert merged["verdict"] == full_doc["verdict"] == "certified" and merged["certifying"]
    assert merged["counts"] == full_doc["counts"]
    assert merged["profiles"] == full_doc["profiles"]
    assert [m["shard"] for m in merged["merged_from"]] == [1, 2, 3]
    for f in ("certificate.json", "junit.xml", "report.html", "results.jsonl"):
        assert (out / f).is_file(), f
    v = kvx("verify", out / "certificate.json")
    assert v.returncode == 0 and v.stdout.startswith("valid:"), v.stdout + v.stderr
    sys.path.insert(0, str(Path(__file__).parent))
    from schema_doc import undocumented

    assert undocumented(merged, "results") == [] and undocumented(docs[0], "results") == []


def _refused(p) -> str:
    assert p.returncode == EXIT_MERGE_REFUSED, p.stdout[-2000:] + p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvx-conform: merge refused: "), p.stderr
    assert "Traceback" not in p.stdout + p.stderr
    return lines[0]


def _merge_refuses_a_missing_shard(runs, tmp_path):
    _, _, parts = runs
    assert "shard 2/3 missing" in _refused(kvx("merge", parts[0], parts[2], "--output-dir", tmp_path / "m"))


def _merge_refuses_overlap_and_other_settings(runs, tmp_path):
    _, full, parts = runs
    assert "given twice" in _refused(kvx("merge", parts[0], parts[0], parts[1], parts[2], "--output-dir",
                                         tmp_path / "m"))
    assert "not a shard run" in _refused(kvx("merge", full, parts[1], "--output-dir", tmp_path / "m"))
    doc = json.loads((parts[1] / "results.json").read_text())
    for key, value, why in [("seed", 1234, "seed"), ("memory", "unified", "memory"),
                            ("suites_hash", "0" * 64, "suites hash")]:
        other = tmp_path / f"other-{key}"
        other.mkdir()
        d = copy.deepcopy(doc)
        d["config"][key] = value
        (other / "results.json").write_text(json.dumps(d))
        assert f"parts differ in {why}" in _refused(kvx("merge", parts[0], other, parts[2], "--output-dir",
                                                        tmp_path / "m"))
    cut = tmp_path / "cut"
    cut.mkdir()
    d = copy.deepcopy(doc)
    d["tests"] = d["tests"][1:]
    (cut / "results.json").write_text(json.dumps(d))
    assert "left out" in _refused(kvx("merge", parts[0], cut, parts[2], "--output-dir", tmp_path / "m"))


def _merge_refuses_a_shard_of_another_provider(runs, tmp_path):
    from kvx_conformance.abi.native import mutant_provider

    _, _, parts = runs
    other = tmp_path / "mutant-part2"
    # the reference built with one defect (no check of the sequence count: 3 tests of the whole suite
    # fail), run as the same shard of the same split: of what merge compares (SAME), only the provider's
    # sha256 differs. Re-runs are no merge setting (and would only re-run deterministic failures)
    mutant = mutant_provider("seq_count_mismatch_unchecked")
    p = kvx("run", mutant, "--output-dir", other, "--progress", "none", "-n", "2", "--shard", "2/3",
            "--durations-from", runs[1] / "results.json", "--reruns", "0")
    assert p.returncode in (0, 1), p.stdout[-2000:] + p.stderr[-2000:]
    line = _refused(kvx("merge", parts[0], other, parts[2], "--output-dir", tmp_path / "m"))
    assert "parts differ in provider (sha256)" in line


def test_shard_usage_errors(tmp_path):
    for args, why in [(["--shard", "4/3"], "K must be between"), (["--durations-from", "x.json"], "--shard K/N"),
                      (["--shard", "1/2", "--durations-from", tmp_path / "none.json"], "file not found")]:
        p = kvx("run", "--output-dir", tmp_path / "o", *args)
        assert p.returncode == 2 and why in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


# ---------------------------------------------------------------------------- compare


def _doc(outcomes: dict, verdict="certified", levels=None):
    levels = levels or {}
    return {"schema_version": "1.0", "kind": "kvx-conform-results", "verdict": verdict,
            "provider": {"sha256": "x"},
            "tests": [{"id": i, "nodeid": i, "outcome": o, "level": levels.get(i, "required"), "profile": "core",
                       "waived": None} for i, o in outcomes.items()]}


def test_compare_conformance_lists_exactly_the_changes():
    base = _doc({"a": "pass", "b": "pass", "c": "fail", "d": "pass", "e": "pass", "f": "skip", "g": "pass",
                 "h": "pass", "gone": "pass"}, levels={"e": "recommended", "h": "recommended"})
    new = _doc({"a": "pass", "b": "crash", "c": "pass", "d": "flaky", "e": "unsupported", "f": "skip",
                "g": "timeout", "h": "fail", "new": "pass"}, verdict="not certified",
               levels={"e": "recommended", "h": "recommended"})
    res = compare_results(base, new)
    ids = lambda g: [r["id"] for r in res[g]]  # noqa: E731
    assert ids("newly_failing") == ["b", "g", "h"]
    assert ids("newly_passing") == ["c"]
    assert ids("flaky") == ["d"]
    assert ids("changed") == ["e"]
    assert ids("added") == ["new"] and ids("removed") == ["gone"]
    assert ids("regressions") == ["b", "g", "h"]  # recommended e (pass -> unsupported) is no regression
    assert res["verdict_regressed"]
    assert [r["id"] for r in compare_results(base, new, fail_on_flaky=True)["regressions"]] == ["b", "d", "g", "h"]
    assert compare_results(base, base)["regressions"] == [] and not compare_results(base, base)["verdict_regressed"]
    base2 = _doc({"r": "pass"})
    assert [r["id"] for r in compare_results(base2, _doc({"r": "skip"}))["regressions"]] == ["r"]  # required
    waived = _doc({"r": "fail"})
    waived["tests"][0]["waived"] = "ACME-1"
    assert compare_results(base2, waived)["regressions"] == []


def _compare_command_on_conformance_results(runs, tmp_path):
    _, full, _ = runs
    doc = json.loads((full / "results.json").read_text())
    new = copy.deepcopy(doc)
    changed = new["tests"][3]
    changed["outcome"] = "fail"
    (tmp_path / "new.json").write_text(json.dumps(new))
    p = kvx("compare", full / "results.json", tmp_path / "new.json")
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"{changed['id']}  pass -> fail" in p.stdout and "1 test(s) changed, 1 regression(s)" in p.stdout
    p = kvx("compare", full / "results.json", tmp_path / "new.json", "--json")
    res = json.loads(p.stdout)
    assert [r["id"] for r in res["newly_failing"]] == [changed["id"]] and not res["changed"]
    assert kvx("compare", full / "results.json", full / "results.json").returncode == 0
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"schema": "kvx-conform.bench/1", "cases": []}))
    p = kvx("compare", full / "results.json", bench)
    assert p.returncode == 9 and "same kind" in p.stderr


def test_shards_merge_and_compare_end_to_end(tmp_path):
    """One full run and three shards (the runs cost most of the time: shared by every check below)."""
    runs = _runs(tmp_path / "runs")
    for i, check in enumerate([_three_shards_merged_equal_one_full_run, _merge_refuses_a_missing_shard,
                               _merge_refuses_overlap_and_other_settings, _merge_refuses_a_shard_of_another_provider,
                               _compare_command_on_conformance_results]):
        d = tmp_path / f"check{i}"
        d.mkdir()
        check(runs, d)
