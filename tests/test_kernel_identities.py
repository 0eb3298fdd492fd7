"""The CUDA kernels' exact floating-point shortcuts, checked on the host in CI.

The CUDA backend replaces some of the host backend's operations with cheaper
ones that give the same bits: Markstein's reciprocal division (FP8 and NVFP4
quantization), an integer E2M1 rounding, packed 16x2 range tests of F16/BF16
inputs (docs/cuda-reference.md "FP8 division"), and the fast FP4 kernels' E2M1
and E4M3 shortcuts of cuda/fp4_fast.h (docs/fp4.md "CUDA figures").
csrc/tests/fp_identities_check.cpp and csrc/tests/fp4_fast_check.cpp compare those
formulas with the host backend's (convert.h / fp4.h) operations; CI has no GPU,
so this is where a change to one of them is caught on every run. The "quick"
mode samples the exhaustive run (docs give its figures) and covers every
rounding boundary densely.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CXX = shutil.which("g++") or shutil.which("c++")


def _build_and_run(source: str, tmp_path: Path, *args: str) -> str:
    exe = tmp_path / Path(source).stem
    cmd = [CXX, "-O2", "-ffp-contract=off", "-std=c++17", f"-I{ROOT / 'csrc/reference'}",
           f"-I{ROOT / 'csrc/include'}", str(ROOT / source), "-o", str(exe)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    run = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, (
        f"{source} found mismatches (expected none)\n{run.stdout}{run.stderr}\n"
        f"repro: {' '.join(cmd)} && {exe} {' '.join(args)}")
    return run.stdout


@pytest.mark.skipif(CXX is None, reason="needs a C++ compiler (g++), as the package build does")
def test_fp8_division_e2m1_and_packed_range_identities(tmp_path):
    out = _build_and_run("csrc/tests/fp_identities_check.cpp", tmp_path, "quick")
    # each part ran over a non-trivial input set and reported its count
    assert "division: " in out and " 0 mismatches" in out.splitlines()[0], out
    assert "e2m1: " in out and "packed range tests: every 16-bit half, 0 mismatches" in out, out
    # part 4: BF16 inputs below 2^-60 with |scale| >= 2^-40 (the upper-bound-only range test)
    assert "small-x FP8 (div_hi_words): 13720000 pairs, 0 mismatches" in out, out


@pytest.mark.skipif(CXX is None, reason="needs a C++ compiler (g++), as the package build does")
def test_fp4_fast_encode_shortcuts(tmp_path):
    out = _build_and_run("csrc/tests/fp4_fast_check.cpp", tmp_path, "quick")
    lines = out.splitlines()
    # all six parts ran, each with 0 mismatches; the packed F16 step (e2m1_h) over every input
    assert len(lines) == 6 and all(line.endswith(" 0 mismatches") for line in lines), out
    assert lines[5].startswith("e2m1_h: 9275520 "), out
