"""Bits compared only where the readings pin them (docs/numerics.md), proved on
providers other than the bundled reference:

- the comparison itself: a conversion's NaN is compared as a class (any encoding,
  either sign), a plain copy's NaN bit for bit, a NaN turned finite and an element
  the call does not write are never excused;
- ``libkvx_testing_hwconv_host.so`` (csrc/testing/hwconv, an independent provider
  that encodes every NaN of a conversion differently from the reference and refuses
  HND_PACKED, CUSTOM, RAGGED and KV_OFFSETS with UNSUPPORTED) certifies on host
  memory with default options, its FP8 tests passed, not skipped;
- ``libkvx_variant_nan_payload.so`` (the reference with only its conversions' NaN
  encodings changed; not a mutant) certifies;
- on a GPU, ``libkvx_testing_hwconv_cuda.so`` (the same front end on the GPU's own
  conversion instructions) certifies on device memory, fp8 included.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvx_conformance import reference_impl
from kvx_conformance.abi import buffers, native
from kvx_conformance.abi.dtypes import bits_view
from kvx_conformance.abi.header import DType, Memory
from kvx_conformance.abi.loader import load_provider
from kvx_conformance.cases import build as cb, execute
from kvx_conformance.cases.case import Result
from kvx_conformance.cases.checks import check_arrays, verify_write
from kvx_conformance.results.outcomes import ConformanceFailure

SEED = 2601
G = cb.GEOM


def kvx_cmd() -> list[str]:
    script = Path(sys.executable).with_name("kvx-conform")
    return [str(script)] if script.exists() else [sys.executable, "-m", "kvx_conformance.cli"]


def built(path: Path) -> str:
    if not path.exists():
        pytest.fail(f"{path} is not built: the package build (csrc/testing, csrc/mutants) must produce it")
    return str(path)


def run(lib: str, out: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    p = subprocess.run([*kvx_cmd(), "run", lib, "--output-dir", str(out), "--progress", "none", *extra],
                       capture_output=True, text=True, timeout=600)
    res = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    return p, res


def outcomes(res: dict) -> dict[str, str]:
    return {t["id"]: t["outcome"] for t in res.get("tests", [])}


# ----------------------------------------------------------------------------- the comparison


def _fp8_write(dtype=DType.F8_E5M2, io=DType.F32):
    cache = cb.simple_cache(G, "nhd", dtype, seed=SEED)
    case = cb.write_case(cache, cb.spread_slots(G, 6, SEED), io_dtype=io, seed=SEED + 1, specials=True,
                         label="NaN into FP8")
    return case, reference_impl.expected_write(case)


def _with(result: Result, key: str, index: int, bits: int) -> Result:
    arrays = {k: v.copy() for k, v in result.arrays.items()}
    bits_view(arrays[key])[index] = bits
    return Result(result.status, arrays)


def _nan_index(res: Result, case, key="k") -> int:
    init = bits_view(case.cache.k_init if key == "k" else case.cache.v_init)
    arr = res.arrays[key]
    with np.errstate(invalid="ignore"):
        idx = np.nonzero(np.isnan(arr.astype(np.float32)) & (bits_view(arr) != init))[0]
    assert idx.size, f"seed {SEED}: the case writes no NaN"
    return int(idx[0])


def test_conversion_nan_compared_as_class():
    case, exp = _fp8_write()
    i = _nan_index(exp, case)
    assert int(bits_view(exp.arrays["k"])[i]) & 0x7F == 0x7E  # ml_dtypes' E5M2 NaN
    for other in (0x7F, 0xFF, 0x7D, 0xFE):  # CUDA's saturating conversion stores 0x7F
        check_arrays(_with(exp, "k", i, other), exp, case, clause="R-FP8")


def test_conversion_nan_to_finite_or_inf_fails_and_says_class():
    case, exp = _fp8_write()
    i = _nan_index(exp, case)
    for finite in (0x7B, 0x7C, 0x00):  # largest finite, inf, zero
        with pytest.raises(ConformanceFailure) as e:
            check_arrays(_with(exp, "k", i, finite), exp, case, clause="R-FP8")
        text = str(e.value)
        assert "compared as a class" in text and "any NaN is accepted here" in text, text


def test_plain_copy_nan_stays_bit_exact():
    cache = cb.simple_cache(G, "nhd", DType.F16, seed=SEED)
    case = cb.write_case(cache, cb.spread_slots(G, 6, SEED), io_dtype=DType.F16, seed=SEED + 1, nan_payloads=True)
    exp = reference_impl.expected_write(case)
    i = _nan_index(exp, case)
    with pytest.raises(ConformanceFailure) as e:
        check_arrays(_with(exp, "k", i, 0x7FFF), exp, case, clause="R-CONVERT")
    assert "bit-exact equality" in str(e.value)


def test_unwritten_nan_element_stays_bit_exact():
    """A converting write: an element the call does not write keeps its exact bits even
    when it holds a NaN (a NaN class is granted only to what the conversion produced)."""
    case, _ = _fp8_write()
    k_init = case.cache.k_init.copy()
    written = set()
    exp0 = reference_impl.expected_write(case)
    written = np.nonzero(bits_view(exp0.arrays["k"]) != bits_view(k_init))[0]
    j = next(i for i in range(k_init.size) if i not in set(written.tolist()))
    bits_view(k_init)[j] = 0x7E
    case = cb.replace(case, cache=cb.replace(case.cache, k_init=k_init))
    exp = reference_impl.expected_write(case)
    with pytest.raises(ConformanceFailure):
        check_arrays(_with(exp, "k", j, 0x7F), exp, case, clause="R-FP8")


# ----------------------------------------------------------------------------- providers


def test_host_twin_nan_bytes_differ_and_pass():
    """The host twin stores E5M2 NaN as 0x7F | sign (the oracle: 0x7E | sign), and the
    suites' comparison accepts it."""
    provider = load_provider(built(native.testing_provider("hwconv_host")))
    case, exp = _fp8_write()
    got = execute.run_write(provider, case, execute.CallOptions())
    i = _nan_index(exp, case)
    assert int(bits_view(got.arrays["k"])[i]) & 0x7F == 0x7F, f"seed {SEED}"
    verify_write(provider, case, clause="R-FP8", feature="fp8")


def test_host_twin_certifies_with_default_options(tmp_path):
    p, res = run(built(native.testing_provider("hwconv_host")), tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "verdict: CERTIFIED" in p.stdout
    got = outcomes(res)
    for tid in ("fp8.write.saturation_and_specials[e4m3]", "fp8.write.saturation_and_specials[e5m2]",
                "dtype.write.convert[cache_f16-io_f32]", "dtype.gather.convert[cache_f32-io_bf16]"):
        assert got.get(tid) == "pass", (tid, got.get(tid))
    # what it does not serve is refused, and refused only as UNSUPPORTED
    assert any(o == "unsupported" for t, o in got.items() if "ragged" in t), "RAGGED not refused"


def test_nan_payload_variant_certifies(tmp_path):
    p, res = run(built(native.native_dir() / "libkvx_variant_nan_payload.so"), tmp_path,
                 "--profile", "core", "--profile", "fp8")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert outcomes(res).get("fp8.write.saturation_and_specials[e5m2]") == "pass"


def test_cuda_provider_certifies_on_device(tmp_path):
    path = native.native_dir() / "libkvx_testing_hwconv_cuda.so"
    if not native.have_cuda():
        pytest.skip("built without CUDA (no nvcc): the device provider is not built")
    why = buffers.memory_available(Memory.DEVICE)
    if why:
        pytest.skip(why)
    p, res = run(built(path), tmp_path, "--memory", "device")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    got = outcomes(res)
    assert got.get("fp8.write.saturation_and_specials[e5m2]") == "pass", got.get(
        "fp8.write.saturation_and_specials[e5m2]")
