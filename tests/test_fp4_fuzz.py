"""The reference provider's FP4 write and gather on random geometries, against the oracle, bit for bit.

Aimed at the CUDA backend's kernels (csrc/reference/cuda/move_fp4_*.cu): random head
count, head_dim, block size, layout (NHD / HND: the packed and the strided paths), IO dtype
(F32 / F16 / BF16), global scales (absent, per tensor, per head, and values that force the
exact fallbacks), 1-199 tokens (writes of that size take the decode-sized kernels) and, in
``test_large_calls_bit_exact``, 257-600 tokens (the writes' row kernels, general and lean),
rows full of edge values (``test_fp4_provider.nasty_rows``), an invalid slot; then PACKED
gathers of the oracle's cache into F32, F16 and BF16 with random tables and lengths (the fast
gather at every size). The same cases run on HOST memory (the host backend) and, where torch
sees a GPU, on DEVICE memory (docs/fp4.md, "Tenth round", for the runs on an H100 and an
H200). Readings: "FP4 extension" (docs/spec-readings.md), docs/fp4.md. Repro: the seed range
is in the test id (``pytest tests/test_fp4_fuzz.py -k 'device and cases0'``); each failure
names its case.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_fp4_provider import MEMORIES, nasty_rows

from kvx_conformance.abi import native
from kvx_conformance.abi.header import DType, Fp4Format, Layout, Status
from kvx_conformance.abi.loader import load_provider
from kvx_conformance.cases import fp4 as fx

CLAUSE = "FP4 extension (docs/spec-readings.md; docs/fp4.md 'NVFP4', 'MXFP4')"
PER_CHUNK = 15


@pytest.fixture(scope="module")
def provider():
    return load_provider(native.reference_provider())


def _case(provider, seed: int, memory, large: bool = False) -> list[str]:
    """One random case; ``large``: 257-600 tokens (beyond the decode-sized path, so the CUDA
    backend's row kernels run), NHD for even seeds, F16 / BF16 / F32 IO and the global-scale kind by seed."""
    rng = np.random.default_rng((60000 if large else 50000) + seed)
    fmt = [Fp4Format.NVFP4, Fp4Format.MXFP4, Fp4Format.MXFP4_OCP][seed % 3]
    B = fx.block_values(fmt)
    H = int(rng.choice([1, 2, 3, 5, 8]))
    D = B * int(rng.integers(1, 9))
    bs = int(rng.choice([1, 3, 4, 16]))
    layout = [Layout.BLOCK_NHD, Layout.BLOCK_HND][seed % 2 if large else int(rng.integers(2))]
    n = int(rng.integers(257, 601)) if large else int(rng.integers(1, 200))
    nb = (n + bs - 1) // bs + int(rng.integers(0, 4))
    gsel = int(rng.integers(5))
    if large:  # every global-scale kind on the NVFP4 cases: NHD F16 without and per tensor, BF16 per head and extreme
        gsel = seed // 3 % 5
    gvals = [None, np.float32(rng.choice([1.0, 2.0 ** -9, 0.01, 3.7])),
             rng.choice([0.004, 1.5, 2.0 ** -70, 2.0 ** 70, 0.3], H).astype(np.float32),
             np.float32(rng.choice([2.0 ** -65, 2.0 ** 66, 1e-30, 1e30, 2.0 ** -50, 2.0 ** 50, 2.0 ** -36, 2.0 ** 44])),
             np.float32(0.37)]
    gk = gvals[gsel] if fmt == Fp4Format.NVFP4 else None
    gv = np.float32(0.37) if gk is not None else None
    cache = fx.new_cache(fmt, nb, bs, H, D, layout, k_global=gk, v_global=gv)
    g1 = 1.0 if gk is None else float(np.atleast_1d(gk)[0])
    with np.errstate(over="ignore"):
        key = nasty_rows(rng, n, H, D, fmt, g1)
        value = nasty_rows(rng, n, H, D, fmt, 0.37 if gk is not None else 1.0)
        io = ["f16", "bf16", "f32"][seed // 6 % 3] if large else ["f32", "f16", "bf16"][int(rng.integers(3))]
        if io == "bf16":
            key, value = key.astype(ml_dtypes.bfloat16), value.astype(ml_dtypes.bfloat16)
        elif io == "f16":
            key, value = key.astype(np.float16), value.astype(np.float16)
    slots = rng.permutation(nb * bs)[:n].astype(np.int64)
    slots[rng.integers(n)] = -1
    where = f"case {seed} ({fmt.name}, H={H}, D={D}, block_size={bs}, {layout.name}, {n} tokens, IO {io}, g kind {gsel})"
    res = fx.run_write(provider, cache, key, value, slots, memory=memory)
    if res.status != Status.OK or res.violations:
        return [f"{where}: write: expected OK and no violation, got status {res.status}, {res.violations[:2]}"]
    want = fx.expected_write(cache, key.astype(np.float32), value.astype(np.float32), slots)
    problems = []
    for a in ("k_codes", "v_codes", "k_scales", "v_scales"):
        got, exp = getattr(res.cache, a), getattr(want, a)
        bad = np.argwhere(got != exp)
        if bad.size:
            i = tuple(bad[0])
            problems.append(f"{where}: write {a}: {len(bad)} bytes differ, first at {[int(v) for v in i]}: "
                            f"expected {exp[i]:#04x}, got {got[i]:#04x}")
    S, msl = int(rng.integers(1, 4)), int(rng.integers(1, 3 * bs + 40))
    table = rng.integers(0, nb, size=(S, (msl + bs - 1) // bs)).astype(np.int32)
    lens = rng.integers(0, msl + 1, size=S)
    for od in (DType.F32, DType.F16, DType.BF16):
        gr = fx.run_gather(provider, want, table, lens, msl, od, memory=memory)
        if gr.status != Status.OK or gr.violations:
            problems.append(f"{where}: gather {od.name}: expected OK, got status {gr.status}, {gr.violations[:2]}")
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            exp = fx.expected_gather(want, table, lens, msl, od, fx.out_init(want, S * msl, od))
        for k in exp:
            g8, e8 = gr.out[k].view(np.uint8), exp[k].view(np.uint8)
            if not np.array_equal(g8, e8):
                problems.append(f"{where}: gather {od.name} {k}: expected the oracle's bytes, "
                                f"{np.count_nonzero(g8 != e8)} bytes differ")
    return problems


@pytest.mark.parametrize("memory", MEMORIES)
@pytest.mark.parametrize("chunk", range(4), ids=lambda c: f"cases{c * PER_CHUNK}-{c * PER_CHUNK + PER_CHUNK - 1}")
def test_random_geometries_bit_exact(provider, chunk, memory):
    problems = []
    for seed in range(chunk * PER_CHUNK, (chunk + 1) * PER_CHUNK):
        problems += _case(provider, seed, memory)
    assert not problems, (f"{CLAUSE}: {len(problems)} problems; first: " + " | ".join(problems[:3]) +
                          f"; repro: pytest tests/test_fp4_fuzz.py -k '{memory.name.lower()} and "
                          f"cases{chunk * PER_CHUNK}'")


@pytest.mark.parametrize("memory", MEMORIES)
@pytest.mark.parametrize("third", range(3), ids=lambda t: f"large{t * 9}-{t * 9 + 8}")
def test_large_calls_bit_exact(provider, third, memory):
    """27 calls of 257-600 tokens (every format, NHD and HND, F16, BF16 and F32 IO, every global-scale
    kind, edge-value rows): on DEVICE memory the CUDA backend's row kernels (general and lean),
    which the decode-sized calls above never reach."""
    problems = []
    for seed in range(third * 9, third * 9 + 9):
        problems += _case(provider, seed, memory, large=True)
    assert not problems, (f"{CLAUSE}: {len(problems)} problems; first: " + " | ".join(problems[:3]) +
                          f"; repro: pytest tests/test_fp4_fuzz.py -k '{memory.name.lower()} and large{third * 9}-'")


# NVFP4 global scales: K per tensor; then K per head at values whose products with some E4M3 scales
# fall just under the packed products' floor (2^-13 in F16, 2^-125 in BF16), where a floor one
# binade lower would give 768 wrong values (double rounding into subnormals; found by a host search
# over g), and V per tensor where A = RN(sf g) overflows F16 for the largest scales
EVERY_BYTE_CASES = [
    (Fp4Format.NVFP4, np.float32(0.37), None, "nvfp4"),
    (Fp4Format.NVFP4, np.array([float.fromhex("0x1.f05f86p-9"), float.fromhex("0x1.41fd64p-122")], np.float32),
     np.float32(333.3), "nvfp4-edge-globals"),
    (Fp4Format.MXFP4, None, None, "mxfp4"),
    (Fp4Format.MXFP4_OCP, None, None, "mxfp4_ocp"),
]


@pytest.mark.parametrize("memory", MEMORIES)
@pytest.mark.parametrize("fmt,k_global,v_global,name", EVERY_BYTE_CASES, ids=[c[3] for c in EVERY_BYTE_CASES])
def test_gather_every_scale_and_code_byte(provider, fmt, k_global, v_global, name, memory):
    """Every scale byte with every code byte, gathered into F32, F16 and BF16: the MX gathers'
    packed products into F16/BF16 (taken where the block's power of two is a normal value of the
    output type), the NVFP4 gathers' (2^k times the block's A or B, taken where A is finite and
    its half normal) and the FP32 path they stand in for give the oracle's bytes at every
    exponent, underflow and overflow included (docs/fp4.md, "Eleventh round", "Fourteenth
    round")."""
    H, D, bs = 2, 128, 16
    cache = fx.new_cache(fmt, 32, bs, H, D, k_global=k_global, v_global=v_global)
    B = cache.B
    # rows 2s and 2s + 1 hold code bytes 0..255 (K; V a permutation of them) in blocks of scale byte s
    codes = np.arange(256, dtype=np.uint8).reshape(2, H, D // 2)
    for s in range(256):
        for r in range(2):
            b, t = divmod(2 * s + r, bs)
            cache.k_codes[b, t] = codes[r]
            cache.v_codes[b, t] = codes[1 - r] ^ 0x5A
            cache.k_scales[b, t] = s
            cache.v_scales[b, t] = 255 - s
    assert cache.k_scales.shape[-1] == D // B
    table = np.arange(32, dtype=np.int32).reshape(2, 16)
    lens = np.array([256, 256])
    problems = []
    for od in (DType.F32, DType.F16, DType.BF16):
        gr = fx.run_gather(provider, cache, table, lens, 256, od, memory=memory)
        if gr.status != Status.OK or gr.violations:
            problems.append(f"gather {od.name}: expected OK, got status {gr.status}, {gr.violations[:2]}")
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            exp = fx.expected_gather(cache, table, lens, 256, od, fx.out_init(cache, 512, od))
        for k in exp:
            g8, e8 = gr.out[k].view(np.uint8), exp[k].view(np.uint8)
            if not np.array_equal(g8, e8):
                bad = np.flatnonzero(g8 != e8)
                problems.append(f"gather {od.name} {k}: expected the oracle's bytes, {bad.size} bytes differ, "
                                f"first at byte {int(bad[0])}")
    assert not problems, (f"{CLAUSE}: {name}: " + " | ".join(problems[:3]) +
                          f"; repro: pytest 'tests/test_fp4_fuzz.py::test_gather_every_scale_and_code_byte["
                          f"{name}-{memory.name.lower()}]'")
