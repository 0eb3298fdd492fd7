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

The launch tuning rule of cuda/tuning.h (memory depth from the device's memory
clock, bus width and SM count, docs/cuda-reference.md "Eighth round") is plain
C++ too, so csrc/tests/tuning_check.cpp checks it here on the parts it was
measured on and on others, with the lean kernel's choice and its 32-bit offset
bound ("Ninth round") and the FP4 lean write's deep form (docs/fp4.md,
"Eleventh round").
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
    # all eleven parts ran, each with 0 mismatches; the packed F16 step (e2m1_h) over every input;
    # the 16-bit writes' thresholds at every scale byte (12 g) and exponent, around every threshold;
    # the NVFP4 gathers' packed products at every scale and code byte (a spread of g, and g about
    # each scale's floor and overflow bounds); the same products' operands by byte permutes for every
    # code byte in each word of a code word; the MX gathers' E2M1 values by byte permutes; the
    # gathers' tables made by the compiler, every scale byte of both scale types and every code byte
    assert len(lines) == 11 and all(line.endswith(" 0 mismatches") for line in lines), out
    assert lines[5].startswith("e2m1_h: 9275520 "), out
    assert lines[6].startswith("e2m1 thresholds: 1760352 "), out
    assert lines[7].startswith("nv pairs: 24208896 "), out
    assert lines[8].startswith("nv alu words: 11448320 "), out
    assert lines[9].startswith("mx alu words: 16384 "), out
    assert lines[10].startswith("scale and pair tables: 512 scale bytes, 512 code bytes"), out


@pytest.fixture(scope="module")
def tuning_check(tmp_path_factory) -> tuple[Path, list[str]]:
    """csrc/tests/tuning_check.cpp built once: (the executable, the command that built it)."""
    if CXX is None:
        pytest.skip("needs a C++ compiler (g++), as the package build does")
    exe = tmp_path_factory.mktemp("tuning") / "tuning_check"
    cmd = [CXX, "-O2", "-std=c++17", f"-I{ROOT / 'csrc/reference'}", str(ROOT / "csrc/tests/tuning_check.cpp"),
           "-o", str(exe)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return exe, cmd


def _tuning(exe: Path, *args: object) -> list[str]:
    """The words tuning_check prints for ``args`` (it must exit 0)."""
    run = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout.split()


def _depth(exe: Path, *args: object) -> tuple[float, int]:
    words = _tuning(exe, *args)
    assert words[0] == "per_sm_gbps" and words[2] == "depth", words
    return float(words[1]), int(words[3])


@pytest.mark.parametrize("part, sms, khz, bits, per_sm, depth", [
    # memory clock and bus width as cudaDeviceGetAttribute reads them (docs/cuda-reference.md, "Eighth round")
    ("H100 SXM 80GB HBM3", 132, 2619000, 5120, 25.40, 1),
    ("H200", 132, 3201000, 6016, 36.47, 2),
    # other parts, from their vendors' figures: the rule needs no entry for them
    ("H100 PCIe", 114, 1593000, 5120, 17.89, 1),
    ("A100 SXM 80GB", 108, 1593000, 5120, 18.88, 1),
    ("a part with 8 TB/s over 148 SMs", 148, 4000000, 8192, 55.35, 2),
    ("a part with 10 TB/s over 66 SMs", 66, 5000000, 8192, 155.15, 4),  # ceil 5.2, capped at 4
    ("properties unknown (attribute reads failed)", 0, 0, 0, 0.0, 1),
])
def test_memory_depth_follows_the_bandwidth_per_sm(tuning_check, part, sms, khz, bits, per_sm, depth):
    exe, cmd = tuning_check
    got = _depth(exe, sms, khz, bits)
    assert got[0] == pytest.approx(per_sm, abs=0.01) and got[1] == depth, (
        f"{part}: expected {per_sm} GB/s per SM and depth {depth}, got {got}\n"
        f"repro: {' '.join(cmd)} && {exe} {sms} {khz} {bits}")


def test_memory_depth_steps_at_each_multiple_of_the_unit(tuning_check):
    exe, _ = tuning_check
    # one SM and an 8-bit bus move 2 x khz x 1e3 bytes/s; 30 GB/s per SM is one unit: at or
    # below it depth 1, just above it 2, ... at most 4
    depths = [_depth(exe, 1, k, 8, 30)[1] for k in (15000000, 15000001, 30000000, 30000001, 45000001, 90000000)]
    assert depths == [1, 2, 2, 3, 4, 4], depths
    assert _depth(exe, 1, 30000001, 8, 1000)[1] == 1  # a larger unit (the build knob) keeps every part at depth 1


def _word(exe: Path, key: str, *args: object) -> int:
    words = _tuning(exe, key, *args)
    assert words[:1] == [key], words
    return int(words[1])


@pytest.mark.parametrize("depth, lookup, lg_tg, lean", [
    (1, False, 0, False),  # H100: writes and PACKED gathers keep move_fast (its writes lost 0.5 to 1 point to move_rows)
    (1, False, 1, False),  # ... 2 rows per task too (8 heads of 64: writes -1 point with move_rows)
    (1, True, 0, True),    # ... RAGGED / KV_OFFSETS gathers take move_rows (+0.8 and +3 points)
    (1, False, 2, True),   # ... and tasks of 4 or more short rows (one head of 64 to 256: +0.5 to +14 points)
    (1, False, 3, True),
    (2, False, 0, True),   # H200: every large NHD/HND call (+2 to +7.5 points, FP8 writes +6 to +9)
    (2, True, 0, True),
    (4, False, 0, True),
])
def test_the_lean_kernel_follows_the_memory_depth(tuning_check, depth, lookup, lg_tg, lean):
    exe, cmd = tuning_check
    got = _word(exe, "lean", depth, int(lookup), lg_tg)
    assert got == int(lean), (f"memory depth {depth}, lookup gather {lookup}, 2^{lg_tg} rows per task: expected lean "
                              f"{int(lean)}, got {got}\nrepro: {' '.join(cmd)} && {exe} lean {depth} {int(lookup)} {lg_tg}")


@pytest.mark.parametrize("rule, depth, on", [
    # rows_invert_for: the lean kernel's large writes over the cache's slots
    ("rowsinv", 1, False),  # H100: with the lean kernel forced there, 65536 rows -3 points, 262144 -1
    ("rowsinv", 2, True),   # H200: 16-bit writes of 262144 rows 92.0 -> 95.5 %, FP8 into HND 84.2 -> 90.0 %
    ("rowsinv", 4, True),
    # rows_write_early_for: the lean kernel's writes over the IO rows load the rows before the slots
    ("rowsearly", 1, False),  # H100: unmeasured (its lean writes are tasks of 4 or more short rows only)
    ("rowsearly", 2, True),   # H200: 16-bit rows of 8 x 128 at 65536 tokens 89.9-90.1 -> 90.8-91.7 %
    ("rowsearly", 4, True),
    # fp4_lean_deep_for: the FP4 lean write's L2 prefetch and fitted grid
    ("fp4deep", 1, False),  # H100: the FP4 lean write from F16/BF16 93 % of copy plain, 85-88.6 % with the L2 prefetch
    ("fp4deep", 2, True),   # H200: 79 % plain, 84 % with the prefetch, 85-85.9 % with the fitted grid as well
    ("fp4deep", 4, True),
])
def test_depth_rules(tuning_check, rule, depth, on):
    """The kernel forms that follow the memory depth (cuda/tuning.h; docs/cuda-reference.md,
    "Thirteenth round" and "Twentieth round", docs/fp4.md, "Eleventh round")."""
    exe, cmd = tuning_check
    got = _word(exe, rule, depth)
    assert got == int(on), (f"{rule}, memory depth {depth}: expected {int(on)}, got {got}\n"
                            f"repro: {' '.join(cmd)} && {exe} {rule} {depth}")


@pytest.mark.parametrize("rule, what, args, on", [
    # fit32 (row_offsets_fit32): (heads, head_dim, cache head stride, cache element size, IO head stride, IO size)
    ("fit32", "NHD F16 row of 8 x 128 (cache and IO head stride 128)", (8, 128, 128, 2, 128, 2), True),
    ("fit32", "HND F16, 16-token blocks (cache head stride 16 x 128)", (8, 128, 2048, 2, 128, 2), True),
    ("fit32", "the last head ends at exactly 2^31 bytes", (2, 1 << 29, 1 << 29, 2, 0, 2), True),
    ("fit32", "... one element further", (2, (1 << 29) + 1, 1 << 29, 2, 0, 2), False),
    ("fit32", "head stride x heads past 2^31 on the cache side", (64, 128, 1 << 25, 2, 128, 2), False),
    ("fit32", "... on the IO side", (64, 128, 128, 2, 1 << 25, 2), False),
    ("fit32", "a negative head stride", (8, 128, -128, 2, 128, 2), False),
    ("fit32", "a stride so large that heads x stride overflows 64 bits", (3, 128, (1 << 62), 4, 128, 4), False),
    ("fit32", "one head, stride 0", (1, 128, 0, 4, 0, 4), True),
    # pairs (lean_gather_pairs_for, "Twentieth round"): (depth, PACKED gather, NHD token rows, lg_tg,
    # chunks of one row's K and V, chunks a task aims at)
    ("pairs", "H200, NHD PACKED gather, 8 x 128 16-bit (256 chunks)", (2, 1, 1, 0, 256, 256), True),  # +1.2 to +2 points
    ("pairs", "H100 (depth 1): move_fast takes it, no pairs", (1, 1, 1, 0, 256, 256), False),
    ("pairs", "HND rows (heads a block apart)", (2, 1, 0, 0, 256, 256), False),                     # +-0.5: nothing to gain
    ("pairs", "RAGGED / KV_OFFSETS gathers", (2, 0, 1, 0, 256, 256), False),
    ("pairs", "rows already two per task (8 x 64 16-bit)", (2, 1, 1, 1, 128, 256), False),          # four per task: -1.3
    ("pairs", "F32 rows of 8 x 128 (512 chunks)", (2, 1, 1, 0, 512, 256), False),
    ("pairs", "16-bit rows of 8 x 256 (512 chunks)", (2, 1, 1, 0, 512, 256), False),
    ("pairs", "one chunk under twice the task", (2, 1, 1, 0, 511, 256), True),
    ("pairs", "depth 4", (4, 1, 1, 0, 256, 256), True),
    # fp8affine (rows_fp8_affine_for, "Twenty-sixth round"): (lg_tg, 16-byte chunks of a head, heads,
    # per-head scales) of an FP8 write through the lean kernel
    ("fp8affine", "8 x 128 from BF16 / F16 (16 chunks a head)", (0, 16, 8, 0), True),  # H200 BF16: 84 -> 93 %
    ("fp8affine", "8 x 128 from F32 (32 chunks a head)", (0, 32, 8, 0), True),          # H200: 89 -> 96.5-97 %
    ("fp8affine", "8 x 64 from BF16 (8 chunks a head)", (0, 8, 8, 0), True),
    ("fp8affine", "per-head scales", (0, 16, 8, 1), False),
    ("fp8affine", "one head of 16 chunks (a half of 16 chunks)", (0, 16, 1, 0), False),
    ("fp8affine", "heads of 64 chunks (8 x 512 from F16)", (0, 64, 8, 0), False),
    ("fp8affine", "heads of 12 chunks (192 from F16)", (0, 12, 8, 0), False),
    ("fp8affine", "rows two per task", (1, 16, 8, 0), False),
])
def test_lean_kernel_rules_on_rows(tuning_check, rule, what, args, on):
    """The lean kernel's rules on a call's rows (cuda/tuning.h): the rows its 32-bit offsets reach
    (row_offsets_fit32), the gathers that take two rows per task (lean_gather_pairs_for) and the FP8
    writes whose chunk offsets step by constants (rows_fp8_affine_for)."""
    exe, cmd = tuning_check
    got = _word(exe, rule, *args)
    assert got == int(on), (f"{what}: expected {rule} {int(on)}, got {got}\n"
                            f"repro: {' '.join(cmd)} && {exe} {rule} {' '.join(map(str, args))}")
