"""Shared helpers of the harness / CLI tests: tiny C providers, fake suites, a CLI runner.

Holds the unit tests of the pure-Python pieces (claims, waivers, verdicts, writer) too.
The fake providers are built with ``cc -shared`` from the project's own header; the fake
suites are written into a tmp dir and run through ``kvx-conform run --suite DIR``, so
these tests need neither the reference provider nor the real suites.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEADER_DIR = REPO / "csrc" / "include"

FAKE_PROVIDER_C = r"""
#include <signal.h>
#include <unistd.h>
#include "kvx/kvx_abi.h"

#ifndef FAKE_MAJOR
#define FAKE_MAJOR 1
#endif

#ifdef FAKE_CRASH_ON_LOAD
__attribute__((constructor)) static void fake_crash_on_load(void) { raise(SIGSEGV); }
#endif

/* FAKE_WRITE_MODE / FAKE_GATHER_MODE / FAKE_VERSION_MODE: 0 behave, 1 crash (SIGSEGV), 2 hang */
#ifndef FAKE_WRITE_MODE
#define FAKE_WRITE_MODE 0
#endif
#ifndef FAKE_GATHER_MODE
#define FAKE_GATHER_MODE 0
#endif
#ifndef FAKE_VERSION_MODE
#define FAKE_VERSION_MODE 0
#endif

static void fake_misbehave(int mode) {
    if (mode == 1) raise(SIGSEGV);
    if (mode == 2) for (;;) sleep(1);
}

#define SMALL(p) ((p).size < sizeof(p))
#define INVALID KVX_STATUS_INVALID_ARGUMENT

KVX_API kvx_status_t kvx_get_version(kvx_version_t* v) {
    fake_misbehave(FAKE_VERSION_MODE);
    if (!v || SMALL(*v)) return INVALID;
    v->size = sizeof(*v);
    v->abi_major = FAKE_MAJOR;
    v->abi_minor = 1;
    v->abi_patch = 0;
    return KVX_STATUS_OK;
}

static kvx_status_t fake_cache(const kvx_cache_desc_t* c) {
    if (!c || SMALL(*c) || SMALL(c->k) || SMALL(c->v)) return INVALID;
    if (!c->num_blocks || !c->block_size || !c->num_kv_heads || !c->head_dim) return INVALID;
    if (!c->k.data || !c->v.data) return INVALID;
    return KVX_STATUS_OK;
}

KVX_API kvx_status_t kvx_validate_cache_desc(const kvx_cache_desc_t* c) { return fake_cache(c); }

KVX_API kvx_status_t kvx_write_kv(const kvx_cache_desc_t* c, const kvx_write_desc_t* d, void* stream) {
    (void)stream;
    fake_misbehave(FAKE_WRITE_MODE);
    kvx_status_t st = fake_cache(c);
    if (st) return st;
    if (!d || SMALL(*d) || SMALL(d->io) || SMALL(d->io.key) || SMALL(d->io.value) || SMALL(d->slots)
        || SMALL(d->k_scale_desc) || SMALL(d->v_scale_desc)) return INVALID;
    return KVX_STATUS_OK;
}

KVX_API kvx_status_t kvx_gather_kv(const kvx_cache_desc_t* c, const kvx_gather_desc_t* d, void* stream) {
    (void)stream;
    fake_misbehave(FAKE_GATHER_MODE);
    kvx_status_t st = fake_cache(c);
    if (st) return st;
    if (!d || SMALL(*d) || SMALL(d->io) || SMALL(d->io.key) || SMALL(d->io.value) || SMALL(d->block_table)
        || SMALL(d->seq_lens)) return INVALID;
    return KVX_STATUS_OK;
}
"""

NOT_A_PROVIDER_C = "int not_kvx(void) { return 42; }\n"


def have_cc() -> bool:
    return shutil.which("cc") is not None


def build_so(tmp: Path, name: str, source: str, defines: tuple[str, ...] = ()) -> Path:
    src = tmp / f"{name}.c"
    src.write_text(source)
    out = tmp / f"lib{name}.so"
    cmd = ["cc", "-shared", "-fPIC", "-O1", "-DKVX_BUILD_PROVIDER", f"-I{HEADER_DIR}", *[f"-D{d}" for d in defines],
           "-o", str(out), str(src)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def build_fake_provider(tmp: Path, name: str = "fake", *defines: str) -> Path:
    return build_so(tmp, name, FAKE_PROVIDER_C, defines)


def cli_env() -> dict:
    """The environment of a CLI subprocess: this interpreter's package, no pytest autoload surprises."""
    env = dict(os.environ)
    # the test process found kvx_conformance through PYTHONPATH or an install; keep both working
    import kvx_conformance

    pkg_parent = str(Path(kvx_conformance.__file__).resolve().parents[1])
    if "PYTHONPATH" in env or pkg_parent == str(REPO):
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if not any(Path(p).resolve() == REPO for p in parts) and not _installed_elsewhere():
            parts.insert(0, str(REPO))
        env["PYTHONPATH"] = os.pathsep.join(parts)
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)
    env["COLUMNS"] = "200"
    return env


def _installed_elsewhere() -> bool:
    r = subprocess.run([sys.executable, "-c", "import kvx_conformance"], env={**os.environ, "PYTHONPATH": ""},
                       capture_output=True, cwd="/")
    return r.returncode == 0


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvx_conformance.cli", *map(str, args)], cwd=cwd,
                          env=cli_env(), capture_output=True, text=True, timeout=timeout)


def write_suite(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    return root


# ----------------------------------------------------------------------------- unit tests of the pure parts

from kvx_conformance.results.claims import Claims, InputFileError, Waiver, load_claims, load_expectations  # noqa: E402
from kvx_conformance.results.outcomes import PROFILES  # noqa: E402
from kvx_conformance.results.record import ResultsWriter, TestRecord, load_results, summarize  # noqa: E402


def _rec(id, outcome, level="required", profile="core", message=""):
    return TestRecord(id=id, nodeid=f"t.py::{id}", clause="7.1", level=level, profile=profile, entry=[],
                      feature=None, outcome=outcome, message=message)


def test_claims_yaml_and_json_and_errors(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("profiles: [core, tables]\nfeatures: [ragged]\n")
    c = load_claims(y)
    assert c.profiles == ("core", "tables") and c.features == {"ragged"}
    j = tmp_path / "c.json"
    j.write_text(json.dumps({"features": ["fp8"]}))
    dflt = load_claims(j)  # no 'profiles': every profile but the opt-in ones is claimed, not explicitly
    assert set(dflt.profiles) == set(PROFILES) - {"fp4_exact"} and not dflt.explicit
    assert dflt.not_claimed == ["fp4_exact"]
    assert c.explicit and "layouts" in c.not_claimed
    bad = tmp_path / "bad.yaml"
    bad.write_text("features: [warp_drive]\n")
    with pytest.raises(InputFileError, match="unknown feature.*warp_drive"):
        load_claims(bad)
    with pytest.raises(InputFileError, match="not found"):
        load_claims(tmp_path / "missing.yaml")


def test_exact_fp4_tier_is_opt_in(tmp_path):
    """Product readings, FP4 extension: "Two conformance tiers": the compatible one (``fp4``) is
    conformance, so the default claims leave out only the exact tier (``fp4_exact``). A claims file
    adds it with ``opt_in:`` (the default claims' reading kept) or names it in ``profiles:``."""
    from kvx_conformance.results.claims import DEFAULT_PROFILES, OPT_IN_PROFILES, reference_claims_file

    assert OPT_IN_PROFILES == ("fp4_exact",)
    assert DEFAULT_PROFILES == tuple(p for p in PROFILES if p != "fp4_exact")
    assert Claims().not_claimed == ["fp4_exact"] and not Claims().explicit
    opt = tmp_path / "opt.json"
    opt.write_text(json.dumps({"opt_in": ["fp4_exact"], "features": ["fp4"]}))
    c = load_claims(opt)
    assert set(c.profiles) == set(PROFILES) and not c.explicit and c.not_claimed == [] and c.features == {"fp4"}
    for body, match in (({"opt_in": ["core"]}, "opt-in profiles only, not core"),
                        ({"opt_in": ["fp4_exact"], "profiles": ["core"]}, "not both")):
        opt.write_text(json.dumps(body))
        with pytest.raises(InputFileError, match=match):
            load_claims(opt)
    # the bundled reference (and its mutants) claims every profile, with the default claims' reading
    ref = load_claims(reference_claims_file())
    assert set(ref.profiles) == set(PROFILES) and not ref.explicit and ref.features == frozenset()


def test_compatible_tier_fp4_certified_unless_the_exact_tier_is_claimed(tmp_path):
    """A provider whose FP4 meets the compatible tier only: certified by the default claims, its
    fp4_exact verdict still computed and reported (not claimed); NOT CERTIFIED once it claims
    fp4_exact (``opt_in:``, ``profiles:`` or ``--profile``)."""
    tests = [_rec("write.x", "pass"), _rec("fp4.write.compatible[x]", "pass", profile="fp4"),
             _rec("fp4_exact.write.ties[x]", "fail", profile="fp4_exact"),
             _rec("fp4_exact.write[x]", "pass", profile="fp4_exact")]
    s = summarize(tests, Claims(), [], quick=False, partial=False, complete=True)
    assert s["verdict"] == "certified" and s["claimed_profiles_certified"], s
    ex = s["profiles"]["fp4_exact"]
    assert ex["verdict"] == "not certified" and not ex["claimed"] and ex["blocking"] == ["fp4_exact.write.ties[x]"]
    assert s["profiles"]["fp4"]["claimed"] and s["profiles"]["fp4"]["verdict"] == "certified"
    assert s["not_claimed"] == ["fp4_exact"]
    f = tmp_path / "claims.json"
    for body in ({"opt_in": ["fp4_exact"]}, {"profiles": ["core", "fp4", "fp4_exact"]}):
        f.write_text(json.dumps(body))
        s = summarize(tests, load_claims(f), [], quick=False, partial=False, complete=True)
        assert s["verdict"] == "not certified" and not s["claimed_profiles_certified"], (body, s)
        assert s["profiles"]["fp4_exact"]["claimed"] and "fp4_exact" not in s["not_claimed"], (body, s)
    # --profile fp4 --profile fp4_exact names the claims (plugin config: explicit)
    s = summarize(tests, Claims(("fp4", "fp4_exact")), [], quick=False, partial=False, complete=True)
    assert s["verdict"] == "not certified" and s["profiles"]["fp4_exact"]["claimed"]
    # an exact provider certifies either way
    tests[2].outcome = "pass"
    for claims in (Claims(), load_claims(f)):
        assert summarize(tests, claims, [], quick=False, partial=False, complete=True)["verdict"] == "certified"


def test_a_crash_blocks_at_every_level():
    """R-VERDICT: a test's level grades the answer a call gives; a call that crashes gives none
    (spec 8: every entry point returns a kvx_status_t), so a crash in a recommended or an
    informational test blocks its profile as a required one's does. A fail there still only warns
    (recommended) or is recorded (informational); a waiver covers a crash as any other outcome."""
    kw = dict(quick=False, partial=False, complete=True)
    for level in ("recommended", "informational"):
        s = summarize([_rec("a", "pass"), _rec("b", "crash", level=level)], Claims(), [], **kw)
        assert s["verdict"] == "not certified" and s["profiles"]["core"]["blocking"] == ["b"], (level, s)
        s = summarize([_rec("a", "pass"), _rec("b", "fail", level=level)], Claims(), [], **kw)
        assert s["verdict"] == "certified" and s["profiles"]["core"]["blocking"] == [], (level, s)
        s = summarize([_rec("a", "pass"), _rec("b", "crash", level=level)], Claims(), [Waiver("b", "known")], **kw)
        assert s["verdict"] == "certified" and s["profiles"]["core"]["waived"] == ["b"], (level, s)
    # a timeout in a recommended test still only warns: it may be the machine's (a slow runner)
    s = summarize([_rec("a", "pass"), _rec("b", "timeout", level="recommended")], Claims(), [], **kw)
    assert s["verdict"] == "certified" and s["profiles"]["core"]["warnings"] == ["b"], s


def test_expectations_and_glob_waivers(tmp_path):
    e = tmp_path / "e.yaml"
    e.write_text("waivers:\n  - {id: 'write.x[S32]', reason: r1}\n  - {id: 'gather.*', reason: r2}\n")
    ws = load_expectations(e)
    assert ws[0].matches("write.x[S32]") and not ws[0].matches("write.x[S64]")
    assert ws[1].matches("gather.oob[S64]") and not ws[1].matches("write.gather")
    e.write_text("- {id: a}\n")
    with pytest.raises(InputFileError, match="needs a 'reason'"):
        load_expectations(e)


def test_verdicts_per_profile():
    tests = [_rec("a", "pass"), _rec("b", "unsupported"), _rec("c", "fail", level="recommended"),
             _rec("d", "pass", profile="tables"), _rec("e", "crash", profile="tables"),
             _rec("f", "unsupported", profile="fp8"), _rec("g", "fail", profile="layouts")]
    s = summarize(tests, Claims(("core", "tables")), [Waiver("g", "known")], quick=False, partial=False,
                  complete=True)
    p = s["profiles"]
    assert p["core"]["verdict"] == "certified" and p["core"]["warnings"] == ["c"]
    assert p["tables"]["verdict"] == "not certified" and p["tables"]["blocking"] == ["e"]
    assert p["fp8"]["verdict"] == "not served" and not p["fp8"]["served"]
    assert p["layouts"]["verdict"] == "certified" and p["layouts"]["waived"] == ["g"]
    assert s["verdict"] == "not certified" and s["certifying"]
    assert any("recommended" in w for w in s["warnings"])
    s2 = summarize(tests, Claims(("core",)), [], quick=True, partial=False, complete=True)
    assert s2["verdict"] == "not certifying (quick)" and s2["claimed_profiles_certified"]


def test_exact_tier_not_certified_without_the_compatible_tier():
    """fp4_exact builds on fp4 (record.PROFILE_INCLUDES): a provider whose compatible-tier test
    fails reads not certified in both, the failing id among fp4_exact's blockers."""
    tests = [_rec("fp4.write.compatible[x]", "pass", profile="fp4"), _rec("fp4.write.slots[x]", "fail", profile="fp4"),
             _rec("fp4_exact.write[x]", "pass", profile="fp4_exact")]
    p = summarize(tests, Claims(), [], quick=False, partial=False, complete=True)["profiles"]
    assert p["fp4"]["verdict"] == "not certified" and p["fp4_exact"]["verdict"] == "not certified"
    assert p["fp4_exact"]["blocking"] == ["fp4.write.slots[x]"] and p["fp4_exact"]["includes"] == ["fp4"]
    tests[1].outcome = "pass"
    p = summarize(tests, Claims(), [], quick=False, partial=False, complete=True)["profiles"]
    assert p["fp4_exact"]["verdict"] == "certified" and p["fp4_exact"]["blocking"] == []
    assert p["fp4"]["includes"] == []


def test_writer_is_readable_at_every_step(tmp_path):
    w = ResultsWriter(tmp_path, {"provider": {"path": "x"}}, every_tests=2, every_seconds=1e9)
    assert load_results(tmp_path / "results.json")["complete"] is False
    for i in range(5):
        w.add(_rec(f"t{i}", "pass"))
    doc = load_results(tmp_path / "results.json")
    assert doc["finished"] == 4 and not doc["complete"]  # rewritten every 2 tests
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 5  # appended at once
    w.total = 5
    doc = w.close()
    assert doc["complete"] and doc["finished"] == 5 and doc["verdict"] == "certified"


def test_hide_test_environment_from_concurrent_threads():
    """The concurrency tests call providers from several threads at once, and each call first hides
    the PYTEST_* variables (loader.hide_test_environment): two threads removing one variable must
    not raise (a KeyError there was a harness error of concurrency.threads.gather)."""
    import threading

    from kvx_conformance.abi.loader import hide_test_environment

    saved = {k: v for k, v in os.environ.items() if k.startswith("PYTEST_")}
    interval = sys.getswitchinterval()
    errors: list[str] = []

    def run():
        try:
            for _ in range(20):
                hide_test_environment()
        except Exception as e:  # noqa: BLE001 - the failure under test
            errors.append(repr(e))

    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        for _ in range(300):
            for i in range(30):
                os.environ[f"PYTEST_KVX_PROBE_{i}"] = "x"
            threads = [threading.Thread(target=run) for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        sys.setswitchinterval(interval)
        for k in [k for k in os.environ if k.startswith("PYTEST_KVX_PROBE_")]:
            del os.environ[k]
        os.environ.update(saved)
    assert not errors, errors[:3]
    assert not any(k.startswith("PYTEST_KVX_PROBE_") for k in os.environ)
