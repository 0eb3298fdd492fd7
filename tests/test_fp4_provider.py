"""The reference provider's FP4 caches (KVX 1.2) against the numpy oracle, bit for bit.

Randomized rows full of edge values (every E2M1 tie point, E4M3-subnormal and
underflowing NVFP4 scales, scale saturation, MXFP4 amax/6 exactly at and one ulp
above a power of two, FP32 subnormals, -0, NaN, +-Inf, values near FLT_MAX) are
written through ``kvx_write_kv`` and compared with ``reference_impl.fp4``; the oracle's
cache is then gathered into F32/F16/BF16 and raw, and compared again. Repro: the seed
is in the test id (``pytest tests/test_fp4_provider.py -k 'seed3'``).
"""
from __future__ import annotations

import numpy as np
import pytest

from kvx_conformance.abi import native
from kvx_conformance.abi.header import DType, Fp4Format, Layout, Memory, Status
from kvx_conformance.abi.loader import load_provider
from kvx_conformance.cases import fp4 as fx

FMTS = [Fp4Format.NVFP4, Fp4Format.MXFP4, Fp4Format.MXFP4_OCP]
TIES = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)


@pytest.fixture(scope="module")
def provider():
    return load_provider(native.reference_provider())


def _memory_param(m: Memory):
    from kvx_conformance.abi.buffers import memory_available

    reason = None if m == Memory.HOST else memory_available(m)
    return pytest.param(m, id=m.name.lower(), marks=pytest.mark.skipif(reason is not None, reason=str(reason)))


#: Host always; DEVICE (the CUDA backend, cuda/move_fp4_*.cu) where torch sees a GPU.
MEMORIES = [_memory_param(Memory.HOST), _memory_param(Memory.DEVICE)]


def nasty_rows(rng: np.random.Generator, n: int, H: int, D: int, fmt: Fp4Format, g: float) -> np.ndarray:
    """[n, H, D] FP32 rows, each 16/32-value block drawn from one edge-case family."""
    B = fx.block_values(fmt)
    x = rng.standard_normal((n, H, D // B, B)).astype(np.float32)
    kinds = rng.integers(0, 12, size=(n, H, D // B))
    for idx in np.ndindex(kinds.shape):
        k, blk = kinds[idx], x[idx]
        if k == 0:  # ties: amax 6 * unit so that x / scale hits the tie points exactly
            unit = np.float32(2.0) ** rng.integers(-8, 8)
            blk[:] = rng.choice(np.concatenate([TIES, -TIES, [6.0, -6.0, 0.0]]), B).astype(np.float32) * unit
            blk[0] = np.float32(6.0) * unit  # amax: scale exactly `unit` (g * 1 for NVFP4 when unit = g)
            if fmt == Fp4Format.NVFP4:
                blk *= np.float32(g)
        elif k == 1:
            blk[:] = 0.0
        elif k == 2:
            blk[:] = -0.0
            blk[rng.integers(B)] = rng.standard_normal()
        elif k == 3:  # tiny: E4M3-subnormal / underflowing NVFP4 scale, FP32 subnormals
            blk *= np.float32(2.0) ** rng.integers(-150, -100)
        elif k == 4:  # huge: scale saturation (NVFP4), exponent clamp (MX)
            blk *= np.float32(2.0) ** rng.integers(100, 127)
        elif k == 5:
            blk[rng.integers(B)] = np.nan
        elif k == 6:
            blk[rng.integers(B)] = rng.choice([np.inf, -np.inf])
        elif k == 7:  # amax / 6 exactly a power of two, and one ulp above
            e = rng.integers(-20, 20)
            amax = np.float32(6.0) * np.float32(2.0) ** e
            if rng.integers(2):
                amax = np.nextafter(amax, np.float32(np.inf))
            blk[:] = np.clip(blk, -1, 1) * amax
            blk[rng.integers(B)] = amax
        elif k == 8:
            blk[:] = rng.choice([np.float32(3.4e38), np.float32(-3.4e38), np.float32(1.0)], B)
        elif k == 9:  # wide dynamic range inside one block
            blk *= np.float32(2.0) ** rng.integers(-30, 30, B).astype(np.float32)
        # 10, 11: plain Gaussian
    return x.reshape(n, H, D)


@pytest.mark.parametrize("memory", MEMORIES)
@pytest.mark.parametrize("seed", range(6), ids=lambda s: f"seed{s}")
@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name.lower())
def test_write_then_gather_bit_exact(provider, fmt, seed, memory):
    rng = np.random.default_rng(1000 + seed)
    layout = Layout.BLOCK_NHD if seed % 2 == 0 else Layout.BLOCK_HND
    H, D, bs, nb = 2, 64, 4, 10
    gk = [None, np.float32(1.0), np.float32(2.0) ** -9, [0.004, 1.5]][seed % 4]
    g = 1.0 if gk is None else float(np.atleast_1d(gk)[0])
    cache = fx.new_cache(fmt, nb, bs, H, D, layout, k_global=gk, v_global=None if gk is None else np.float32(0.37))
    n = 24
    key = nasty_rows(rng, n, H, D, fmt, g)
    value = nasty_rows(rng, n, H, D, fmt, 0.37 if gk is not None else 1.0)
    io = [np.float32, np.float16][seed % 2]
    if io is np.float16:  # F16 IO: the oracle sees the same F16 values widened exactly
        with np.errstate(over="ignore"):
            key, value = key.astype(np.float16), value.astype(np.float16)
    slots = rng.permutation(nb * bs)[:n].astype(np.int64)
    slots[rng.integers(n)] = -1
    res = fx.run_write(provider, cache, key, value, slots, memory=memory)
    assert res.status == Status.OK and not res.violations, (res.status, res.violations)
    want = fx.expected_write(cache, key.astype(np.float32), value.astype(np.float32), slots)
    for a in ("k_codes", "v_codes", "k_scales", "v_scales"):
        got, exp = getattr(res.cache, a), getattr(want, a)
        bad = np.argwhere(got != exp)
        assert bad.size == 0, f"{fmt.name} {a}: {len(bad)} bytes differ, first at {bad[:3].tolist()} " \
                              f"expected {exp[tuple(bad[0])]:#04x} got {got[tuple(bad[0])]:#04x} (seed {seed})"
    table = rng.permutation(nb)[:6].reshape(2, 3).astype(np.int32)
    lens = [12, 9]
    for od in (DType.F32, DType.F16, DType.BF16, DType.F4_E2M1):
        gr = fx.run_gather(provider, want, table, lens, 12, od, memory=memory)
        assert gr.status == Status.OK and not gr.violations, (od.name, gr.status, gr.violations)
        with np.errstate(over="ignore", invalid="ignore"):
            exp = fx.expected_gather(want, table, lens, 12, od, fx.out_init(want, 24, od))
        for k in exp:
            g8, e8 = gr.out[k].view(np.uint8), exp[k].view(np.uint8)
            assert np.array_equal(g8, e8), f"{fmt.name} gather {od.name} {k}: {np.count_nonzero(g8 != e8)} bytes differ"


@pytest.mark.parametrize("memory", MEMORIES)
@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name.lower())
def test_raw_write_copies_codes_and_scales(provider, fmt, memory):
    rng = np.random.default_rng(7)
    cache = fx.new_cache(fmt, 5, 4, 2, 64)
    n = 9
    codes = rng.integers(0, 256, (n, 2, 32), dtype=np.uint8)
    ks = rng.integers(0, 255, (n, 2, 64 // cache.B), dtype=np.uint8)
    vs = rng.integers(0, 255, (n, 2, 64 // cache.B), dtype=np.uint8)
    slots = rng.permutation(20)[:n]
    res = fx.run_write(provider, cache, codes, codes[::-1].copy(), slots, raw_scales=(ks, vs), memory=memory)
    assert res.status == Status.OK and not res.violations
    for i, s in enumerate(slots):
        b, t = divmod(int(s), 4)
        assert np.array_equal(cache.row(res.cache.k_codes, b, t), codes[i])
        assert np.array_equal(cache.row(res.cache.v_codes, b, t), codes[::-1][i])
        assert np.array_equal(cache.row(res.cache.k_scales, b, t), ks[i])
        assert np.array_equal(cache.row(res.cache.v_scales, b, t), vs[i])


def test_head_dim_not_multiple_of_block_is_invalid(provider):
    cache = fx.new_cache(Fp4Format.MXFP4_OCP, 4, 4, 1, 48)  # 48 % 32 != 0
    res = fx.run_write(provider, cache, np.ones((1, 1, 48), np.float32), np.ones((1, 1, 48), np.float32), [0])
    assert res.status == Status.INVALID_ARGUMENT
