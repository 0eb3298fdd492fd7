"""``kvx-conform accuracy``: text, --json rows, the HTML section, --add-to, and provider vs oracle paths.

The runs use a tiny benchmark configuration (monkeypatched over QUICK) to stay fast;
the figures themselves are tested in tests/test_accuracy.py.
"""
from __future__ import annotations

import json

import pytest

from kvx_conformance import cli
from kvx_conformance.abi import native
from kvx_conformance.accuracy import BenchConfig, runner
from kvx_conformance.reference_impl import quant

TINY = BenchConfig(tokens=128, kv_heads=1, q_heads=2, head_dim=32, block_size=16, num_seqs=2, decode_steps=1,
                   logit_queries=2)
FP4 = {"nvfp4", "mxfp4_16", "mxfp4_32_ocp"}


@pytest.fixture(autouse=True)
def tiny(monkeypatch):
    monkeypatch.setattr(runner, "QUICK", TINY)


def _json(capsys, argv):
    assert cli.main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_registered():
    assert cli.COMMANDS["accuracy"] == "kvx_conformance.accuracy.cli"
    assert "accuracy" in cli.build_parser().format_help()


def test_json_rows_oracle(capsys):
    rows = _json(capsys, ["accuracy", "--quick", "--json"])
    methods = {m.name for m in quant.METHODS}
    assert {(r["method"], r["distribution"]) for r in rows} == {(m, d) for m in methods for d in runner.DISTRIBUTIONS}
    assert len(rows) == len(methods) * len(runner.DISTRIBUTIONS)
    for r in rows:
        assert {"method", "distribution", "rel_rmse", "snr_db", "cosine"} <= set(r)
        assert r["path"] == "oracle" and 0 < r["rel_rmse"] < 1 and -1 <= r["cosine"] <= 1


def test_json_rows_through_provider(capsys):
    rows = _json(capsys, ["accuracy", str(native.reference_provider()), "--quick", "--json"])
    assert {r["method"] for r in rows if r["path"] == "provider"} == FP4
    assert {r["method"] for r in rows if r["path"] == "oracle"} == {m.name for m in quant.METHODS} - FP4
    orc = {(r["method"], r["distribution"]): r for r in _json(capsys, ["accuracy", "--quick", "--json"])}
    for r in rows:  # the reference's FP4 codec is the oracle's, bit for bit
        assert r["rel_rmse"] == orc[(r["method"], r["distribution"])]["rel_rmse"]


def test_v11_provider_falls_back_to_oracle(capsys):
    rows = _json(capsys, ["accuracy", str(native.reference_provider_v1_1()), "--quick", "--json"])
    assert {r["path"] for r in rows} == {"oracle"}


def test_text_html_and_add_to(tmp_path, capsys):
    html = tmp_path / "acc.html"
    results = tmp_path / "results.json"
    from kvx_conformance.results.record import ResultsWriter

    header = {"harness": {"name": "kvx-conform", "version": "0"},
              "provider": {"path": "/x/libp.so", "sha256": "0" * 64, "abi_version": "1.2.0"},
              "environment": {"python": "3", "machine": "x86_64", "cpu": "cpu", "cpu_count": 2, "torch": None},
              "memory_types": ["host"],
              "config": {"memory": "host", "suites_hash": "0" * 64, "workers": 2, "timeout_s": 30,
                         "hypothesis_max_examples": 100, "seed": None}}
    results.write_text(json.dumps(ResultsWriter(tmp_path, header).close()))
    assert cli.main(["accuracy", "--quick", "--html", str(html)]) == 0
    text = capsys.readouterr().out
    assert "[gaussian]" in text and "NVFP4" in text
    page = html.read_text()
    assert page.count("<svg") == 2 and page.count('class="accuracy-table"') == len(runner.DISTRIBUTIONS)
    assert cli.main(["accuracy", "--quick", "--add-to", str(results)]) == 0
    capsys.readouterr()
    stored = json.loads(results.read_text())
    assert len(stored["accuracy"]) == len(quant.METHODS) * len(runner.DISTRIBUTIONS)
    report = (tmp_path / "report.html").read_text()
    assert 'id="accuracy"' in report and report.count('class="accuracy-table"') == len(runner.DISTRIBUTIONS)


def test_missing_provider_exit_code(capsys, tmp_path):
    from kvx_conformance.abi.loader import EXIT_NOT_FOUND

    assert cli.main(["accuracy", str(tmp_path / "nope.so"), "--json"]) == EXIT_NOT_FOUND
    assert "not found" in capsys.readouterr().err


def test_device_fault_in_one_round_trip_is_recorded_and_the_rest_measured(capsys, monkeypatch, tmp_path):
    """A provider call that leaves a device fault (simulated on host memory by the fake
    checker, which also makes the command isolate its round trips) costs its row only."""
    from kvx_conformance.abi import health

    monkeypatch.setenv(health.FAKE_ENV, "kvx_write_kv:accuracy/nvfp4/k_outliers")
    html = tmp_path / "acc.html"
    assert cli.main(["accuracy", str(native.reference_provider()), "--quick", "--json", "--html", str(html)]) == 1
    out, err = capsys.readouterr()
    rows = json.loads(out)
    assert len(rows) == len(quant.METHODS) * len(runner.DISTRIBUTIONS)
    bad = [r for r in rows if r.get("error")]
    assert [(r["method"], r["distribution"]) for r in bad] == [("nvfp4", "k_outliers")], bad
    f = bad[0]
    assert f["device_fault"]["entry"] == "kvx_write_kv" and f["device_fault"]["error"] == "cudaErrorIllegalAddress"
    assert f["error"] == "device fault: cudaErrorIllegalAddress in kvx_write_kv"
    assert all(f[k] is None for k in runner.MEASURED) and f["path"] == "provider"
    assert "nvfp4 on k_outliers: device fault: cudaErrorIllegalAddress in kvx_write_kv" in err
    # every other row is measured, FP4 through the provider, and equals the oracle's (the reference's codec)
    monkeypatch.delenv(health.FAKE_ENV)
    orc = {(r["method"], r["distribution"]): r for r in _json(capsys, ["accuracy", "--quick", "--json"])}
    for r in rows:
        if r is f:
            continue
        assert r["path"] == ("provider" if r["method"] in FP4 else "oracle"), r
        assert r["rel_rmse"] == orc[(r["method"], r["distribution"])]["rel_rmse"], r
    assert "device fault: cudaErrorIllegalAddress in kvx_write_kv" in html.read_text()
    text = runner.format_table(rows)
    assert "device fault: cudaErrorIllegalAddress in kvx_write_kv" in text and "1 row(s) without figures" in text


def test_a_crashed_round_trip_is_marked_with_how_it_died():
    from kvx_conformance.cases.isolation import failure

    crash = failure({"crash": {"kind": "signal", "signal": "SIGSEGV"}})
    assert crash == {"crash": {"kind": "signal", "signal": "SIGSEGV"}, "error": "crash: the process died (SIGSEGV)"}
    assert failure({"crash": {"kind": "exit", "exit_status": 3}})["error"] == "crash: the process died (exit status 3)"
    assert failure({"k": 0, "v": 0}) is None and failure({"unavailable": "no FP4"}) is None
    m = quant.METHODS[0]
    row = {**runner._row(TINY, m, "gaussian", "provider"), **crash}
    ok = runner._rows_for(TINY, "gaussian", "oracle", lambda m: m.roundtrip)
    text = runner.format_table([row] + ok[1:])
    assert "crash: the process died (SIGSEGV)" in text and "1 row(s) without figures" in text
    from kvx_conformance.accuracy.report import standalone_html

    assert "crash: the process died (SIGSEGV)" in standalone_html([row] + ok[1:])
