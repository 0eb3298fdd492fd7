"""KVX 1.2 FP4 extension (readings "FP4 extension"; docs/fp4.md): profiles ``fp4`` and ``fp4_exact``.

Two tiers. ``fp4`` (the "compatible" tier, required for the fp4 profile): write
quantizes into packed E2M1 codes and a scale pool in lockstep with the block ids, each
scale within one E4M3 step or one exponent of the oracle's, each code within one grid
step of the oracle's code for the provider's own scale, error within 5 % of the
oracle's, all-zero blocks exactly scale 0 / codes 0; gather dequantizes within one ulp
of the output dtype or copies codes and scales raw; validation of the extension.
``fp4_exact`` (the "exact" tier): codes, scales and decoded values bit-identical to
``kvx_conformance.reference_impl.fp4``. A provider whose ABI minor is below 2, or that
answers UNSUPPORTED, is "unsupported" for the optional feature ``fp4``.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given

from kvx_conformance.abi.header import DType, Fp4Format, Layout, Status
from kvx_conformance.abi.loader import status_name
from kvx_conformance.cases import build as cb
from kvx_conformance.cases import fp4 as fx
from kvx_conformance.cases import strategies as strat
from kvx_conformance.cases.generators import fp4 as gfp4
from kvx_conformance.cases.checks import CL_INPUTS
from kvx_conformance.cases.threads import BarrierProvider, run_threads
from kvx_conformance.results.outcomes import (
    INFORMATIONAL,
    REQUIRED,
    ConformanceFailure,
    Unsupported,
    conformance,
    note_served_call,
)

CL = "KVX 1.2 FP4 extension (readings: FP4 extension; docs/fp4.md)"
CL_EXACT = CL + ", exact tier"
CL_COMPAT = CL + ", compatible tier"
FMTS = [pytest.param(f, id=fx.FORMAT_NAMES[f]) for f in (Fp4Format.NVFP4, Fp4Format.MXFP4, Fp4Format.MXFP4_OCP)]
IO = [pytest.param(d, id=d.name.lower()) for d in (DType.F32, DType.F16, DType.BF16)]
LAYOUTS = [pytest.param(Layout.BLOCK_NHD, id="nhd"), pytest.param(Layout.BLOCK_HND, id="hnd")]


def _core(kvx_provider, kvx_call_options) -> Layout:
    """The provider's core layout (NHD, or HND where its writes serve HND alone: cb.core_layout). An
    FP4 test whose subject is not the layout builds its cache in it, so that a provider serving HND
    alone is tested by it, not excused as refusing NHD (R-REFUSAL; readings, core: "at least one of
    NHD/HND")."""
    return Layout.BLOCK_NHD if cb.core_layout(kvx_provider, kvx_call_options().memory) == "nhd" else Layout.BLOCK_HND


TIES = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
NB, BS, H, D = 12, 4, 2, 64


def _need_fp4(provider):
    if fx.provider_minor(provider) < 2:
        raise Unsupported(f"provider reports ABI minor {fx.provider_minor(provider)} (< 2): no FP4 extension",
                          feature="fp4")


def _status(st: int, want: int, what: str, clause: str, seed: int | None = None, case: str = "",
            feature: str | tuple[str, ...] = "fp4"):
    """``feature``: the optional feature(s) a refusal of this call names (R-REFUSAL: acceptable
    while any of them is unclaimed); "fp4" unless the case also uses another one. The cache's
    layout is named too where it is not the provider's core layout (``fx.layout_feature``)."""
    if st in (Status.UNSUPPORTED, Status.INVALID_ARGUMENT) and st != want:
        feature = tuple(dict.fromkeys(((feature,) if isinstance(feature, str) else tuple(feature))
                                      + fx.layout_feature()))
    if st == Status.UNSUPPORTED and want != Status.UNSUPPORTED:
        raise Unsupported(f"{what}: UNSUPPORTED", feature=feature)
    if st == Status.INVALID_ARGUMENT and want == Status.OK:  # spec 8: "unsupported field"
        raise Unsupported(f"{what}: INVALID_ARGUMENT", feature=feature, refused_with="INVALID_ARGUMENT")
    if st != want:
        raise ConformanceFailure(f"{what}: unexpected status", expected=status_name(want), got=status_name(st),
                                 clause=clause, case=case, seed=seed)
    if st == Status.OK:
        note_served_call()  # a valid FP4 call answered OK (the test then checks the values)


def _fail_if(probs: list[str], what: str, expected: str, clause: str, seed: int, case: str):
    if probs:
        raise ConformanceFailure(what, expected=expected, got="; ".join(probs[:6]), clause=clause, case=case, seed=seed)


def _g(fmt, seed, heads: int | None = None):
    """Global scales: per tensor for K, per head for V (NVFP4; MXFP4 has none). ``heads``: V's scales for
    that many heads, each its own (None: the suite's two heads)."""
    if fmt != Fp4Format.NVFP4:
        return None, None
    v = [np.float32(0.002), np.float32(0.31)] if heads is None else [np.float32(0.002 * (1 + 3 * h))
                                                                      for h in range(heads)]
    return np.float32(0.0123 * (1 + seed % 3)), v


def _data(seed: int, n: int, B: int, edges: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """K (lognormal channel scales) and V rows [n, H, D] with zero blocks, -0 and tiny/huge blocks."""
    rng = np.random.default_rng(seed)
    k = (rng.standard_normal((n, H, D)) * rng.lognormal(0, 1.5, (1, H, D))).astype(np.float32)
    v = (rng.standard_normal((n, H, D)) * rng.lognormal(0, 1, (n, 1, 1))).astype(np.float32)
    if edges:
        k[0, 0, :B] = 0.0  # all-zero block
        v[1, 1, B:2 * B] = -0.0  # all -0 block
        k[2, 1, :B] *= np.float32(2.0 ** -60)  # NVFP4 scale underflow / tiny exponent
        v[3, 0, :B] *= np.float32(2.0 ** 40)  # NVFP4 scale saturation
        k[4, 0, 3] = -0.0
    return k, v


def _case(fmt, io, layout, seed, note=""):
    return f"{fx.FORMAT_NAMES[fmt]} cache ({layout.name}), {io.name} IO, H={H} D={D} block_size={BS}{note}"


def _write(provider, opts, fmt, io, layout, seed, key=None, value=None, n=20, slots=None, globals_=None, note="",
           cache_kw=None):
    _need_fp4(provider)
    gk, gv = globals_ if globals_ is not None else _g(fmt, seed)
    cache = fx.new_cache(fmt, NB, BS, H, D, layout, k_global=gk, v_global=gv, **(cache_kw or {}))
    if key is None:
        key, value = _data(seed, n, cache.B)
    n = key.shape[0]
    if slots is None:  # scattered physical blocks, one no-op slot
        slots = np.random.default_rng(seed + 99).permutation(NB * BS)[:n].astype(np.int64)
        slots[min(5, n - 1)] = -1
    np_io = fx.IO_NP[io]
    with np.errstate(over="ignore"):
        k_io, v_io = key.astype(np_io), value.astype(np_io)
    res = fx.run_write(provider, cache, k_io, v_io, slots, memory=opts.memory)
    return cache, k_io.astype(np.float32), v_io.astype(np.float32), slots, res


def _check_guards(res, clause, seed, case):
    if res.input_changes:
        raise ConformanceFailure("the provider modified an input it may only read",
                                 expected="every input buffer unchanged by the call",
                                 got="; ".join(res.input_changes), clause=CL_INPUTS, case=case, seed=seed)
    if res.violations:
        raise ConformanceFailure("memory outside the described tensors was modified", expected="no change",
                                 got="; ".join(res.violations), clause=clause, case=case, seed=seed)


# ----------------------------------------------------------------------------- fp4 (compatible tier)


@conformance("fp4.write.compatible", CL_COMPAT, REQUIRED, "fp4", "write", feature="fp4")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("io", IO)
@pytest.mark.parametrize("fmt", FMTS)
def test_write_compatible(kvx_provider, kvx_call_options, fmt, io, layout):
    seed = 10 + int(fmt) * 7 + int(io)
    cache, k, v, slots, res = _write(kvx_provider, kvx_call_options(), fmt, io, layout, seed)
    case = _case(fmt, io, layout, seed)
    _status(res.status, Status.OK, "FP4 write", CL_COMPAT, seed, case)
    _check_guards(res, CL_COMPAT, seed, case)
    want = fx.expected_write(cache, k, v, slots)
    _fail_if(fx.compatible_write_problems(cache, res.cache, want, k, v, slots),
             "FP4 write outside the compatible tier", "scales within one step, codes within one grid step of the "
             "oracle's, error within 5 %, zero blocks exactly 0, other rows untouched", CL_COMPAT, seed, case)


@conformance("fp4.write.zero_blocks", CL_COMPAT + " (an all-zero block stores scale byte 0 and codes 0)", REQUIRED,
             "fp4", "write", feature="fp4")
@pytest.mark.parametrize("fmt", FMTS)
def test_write_zero_blocks(kvx_provider, kvx_call_options, fmt):
    layout = _core(kvx_provider, kvx_call_options)
    seed = 40 + int(fmt)
    key = np.zeros((6, H, D), np.float32)
    key[1] = -0.0
    key[2, :, :8] = 1.0  # one live block beside zero blocks
    value = np.zeros((6, H, D), np.float32)
    cache, k, v, slots, res = _write(kvx_provider, kvx_call_options(), fmt, DType.F32, layout, seed,
                                     key=key, value=value)
    case = _case(fmt, DType.F32, layout, seed, ", zero and -0 blocks")
    _status(res.status, Status.OK, "FP4 write of zero blocks", CL_COMPAT, seed, case)
    want = fx.expected_write(cache, k, v, slots)
    _fail_if(fx.compatible_write_problems(cache, res.cache, want, k, v, slots),
             "all-zero FP4 blocks", "scale byte 0 and codes 0 (decodes to +0, never NaN)", CL_COMPAT, seed, case)


@conformance("fp4.write.scale_pool_lockstep", CL_COMPAT + " (scale pool indexed by the data pool's block ids)",
             REQUIRED, "fp4", "write", feature="fp4")
@pytest.mark.parametrize("fmt", FMTS)
def test_write_scale_pool_lockstep(kvx_provider, kvx_call_options, fmt):
    """Every token to its own block, in reverse block order: scales must land beside their codes."""
    seed = 50 + int(fmt)
    n = NB
    key, value = _data(seed, n, fx.block_values(fmt), edges=False)
    slots = np.array([(NB - 1 - i) * BS + (i % BS) for i in range(n)], np.int64)
    cache, k, v, slots, res = _write(kvx_provider, kvx_call_options(), fmt, DType.F32, Layout.BLOCK_HND, seed,
                                     key=key, value=value, slots=slots)
    case = _case(fmt, DType.F32, Layout.BLOCK_HND, seed, ", token i -> block NB-1-i")
    _status(res.status, Status.OK, "FP4 write", CL_COMPAT, seed, case)
    want = fx.expected_write(cache, k, v, slots)
    _fail_if(fx.compatible_write_problems(cache, res.cache, want, k, v, slots),
             "scale pool out of step with the data pool", "scales at the physical block of their codes", CL_COMPAT,
             seed, case)


def _filled_cache(fmt, layout, seed, **cache_kw):
    gk, gv = _g(fmt, seed)
    cache = fx.new_cache(fmt, NB, BS, H, D, layout, k_global=gk, v_global=gv, **cache_kw)
    blocks = list(np.random.default_rng(seed).permutation(NB)[:8])
    k, v = _data(seed, 8 * BS, cache.B)
    fx.fill_cache(cache, blocks, k, v)
    return cache, blocks


def _gather(provider, opts, fmt, out, layout, seed, tier):
    _need_fp4(provider)
    cache, blocks = _filled_cache(fmt, layout, seed)
    table = np.array([blocks[:3], blocks[3:6]], np.int32)  # non-identity, shuffled physical blocks
    lens, msl = [11, 7], 10
    res = fx.run_gather(provider, cache, table, lens, msl, out, memory=opts.memory)
    case = _case(fmt, out, layout, seed, f", gather table {table.tolist()} seq_lens {lens} max_seq_len {msl}")
    clause = CL_EXACT if tier == "exact" else CL_COMPAT
    _status(res.status, Status.OK, "FP4 gather", clause, seed, case)
    _check_guards(res, clause, seed, case)
    with np.errstate(over="ignore", invalid="ignore"):
        want = fx.expected_gather(cache, table, lens, msl, out, fx.out_init(cache, len(lens) * msl, out))
    what = "raw FP4 gather (codes and scales)" if out == DType.F4_E2M1 else "dequantizing FP4 gather"
    _fail_if(fx.gather_problems(res.out, want, out, tier), what,
             "bit-identical to the oracle" if tier == "exact" or out == DType.F4_E2M1 else
             "within one ulp of the oracle's decode; rows past the length untouched", clause, seed, case)


@conformance("fp4.gather.dequantize", CL_COMPAT + " (decode E2M1 x scale (x g), one rounding)", REQUIRED, "fp4",
             "gather", feature="fp4")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("out", IO)
@pytest.mark.parametrize("fmt", FMTS)
def test_gather_dequantize(kvx_provider, kvx_call_options, fmt, out, layout):
    _gather(kvx_provider, kvx_call_options(), fmt, out, layout, 60 + int(fmt) + 3 * int(out), "compatible")


CL_REPEAT = CL + "; spec 7.2 (the API is stateless aside from user-provided buffers); R-STATE"
REPEAT_CALLS = 3


def _judge_repeats(results, what: str, reset: str, differs, seed: int, case: str) -> None:
    """Calls 2.. of a repeated call (:func:`fx.run_write_repeated` / ``run_gather_repeated``) must
    leave what call 1 left: ``differs(first, later)`` names the first difference, or ''."""
    first = results[0]
    _status(first.status, Status.OK, f"{what}, call 1 of {len(results)}", CL_REPEAT, seed, case)
    _check_guards(first, CL_REPEAT, seed, case)
    for i, res in enumerate(results[1:], start=2):
        if res.status != Status.OK:
            raise ConformanceFailure(f"{what}, call {i} of {len(results)}: unexpected status", expected="OK",
                                     got=status_name(res.status), clause=CL_REPEAT, case=case, seed=seed)
        _check_guards(res, CL_REPEAT, seed, case)
        diff = differs(first, res)
        if diff:
            raise ConformanceFailure(
                f"{what}: call {i} of {len(results)}, the same call through the same buffers, left other "
                "results than call 1",
                expected=f"what call 1 left, the caller having {reset} before call {i}",
                got=diff, clause=CL_REPEAT, case=case, seed=seed)


@conformance("fp4.state.repeated_write", CL_REPEAT, REQUIRED, "fp4", "write", feature="fp4")
@pytest.mark.parametrize("fmt", FMTS)
def test_repeated_write(kvx_provider, kvx_call_options, fmt):
    """``state.repeated_write`` for the FP4 calls, which a provider serves with kernels (and maybe
    a cache of plans) of their own: the same quantizing write three times through the same buffers
    and descriptors, the caller putting the codes and scale pools back to what they held before the
    first call between them. Every call must store the rows again; a provider that answers OK
    without work for a call it has seen leaves the restored contents. The calls are held to call 1,
    the FP4 suite's other checks hold call 1 to the oracle."""
    _need_fp4(kvx_provider)
    opts, seed = kvx_call_options(), 150 + int(fmt)
    layout = _core(kvx_provider, kvx_call_options)
    gk, gv = _g(fmt, seed)
    cache = fx.new_cache(fmt, NB, BS, H, D, layout, k_global=gk, v_global=gv)
    key, value = _data(seed, 20, cache.B, edges=False)
    slots = np.random.default_rng(seed + 1).permutation(NB * BS)[:20].astype(np.int64)
    k_io, v_io = key.astype(np.float16), value.astype(np.float16)
    results = fx.run_write_repeated(kvx_provider, cache, k_io, v_io, slots, memory=opts.memory, times=REPEAT_CALLS)

    def differs(a, b) -> str:
        for side in ("k", "v"):
            for part, x, y in (("codes", a.cache.code_storage(side), b.cache.code_storage(side)),
                               ("scale pool", a.cache.scale_storage(side), b.cache.scale_storage(side))):
                bad = int(np.count_nonzero(x != y))
                if bad:
                    return f"{side.upper()} {part}: {bad} of {x.size} bytes differ from call 1's"
        return ""

    _judge_repeats(results, "FP4 write", "put the codes and scale pools back as they were before call 1,",
                   differs, seed, _case(fmt, DType.F16, layout, seed, f", 20 tokens to slots {slots[:6].tolist()}..., "
                                                                      f"{REPEAT_CALLS} calls"))


@conformance("fp4.state.repeated_gather", CL_REPEAT, REQUIRED, "fp4", "gather", feature="fp4")
@pytest.mark.parametrize("fmt", FMTS)
def test_repeated_gather(kvx_provider, kvx_call_options, fmt):
    """``state.repeated_gather`` for the FP4 calls: the same dequantizing gather three times through
    the same buffers and descriptors, the caller overwriting the outputs between them. Every call
    must gather the rows again; a provider that skips a call it has seen leaves the overwritten
    outputs."""
    _need_fp4(kvx_provider)
    opts, seed = kvx_call_options(), 160 + int(fmt)
    layout = _core(kvx_provider, kvx_call_options)
    cache, blocks = _filled_cache(fmt, layout, seed)
    table = np.array([blocks[:3], blocks[3:6]], np.int32)
    lens, msl = [11, 7], 12
    results = fx.run_gather_repeated(kvx_provider, cache, table, lens, msl, DType.F16, memory=opts.memory,
                                     times=REPEAT_CALLS)

    def differs(a, b) -> str:
        for side in ("k", "v"):
            x, y = a.out[side].view(np.uint16), b.out[side].view(np.uint16)
            bad = int(np.count_nonzero((x != y).reshape(x.shape[0], -1).any(axis=1)))
            if bad:
                return f"{side.upper()} outputs: {bad} of {x.shape[0]} rows differ from call 1's"
        return ""

    _judge_repeats(results, "FP4 gather", "overwritten the outputs", differs, seed,
                   _case(fmt, DType.F16, layout, seed, f", gather table {table.tolist()} seq_lens {lens} "
                                                       f"max_seq_len {msl}, {REPEAT_CALLS} calls"))


@conformance("fp4.gather.raw", CL + " (F4_E2M1 IO copies codes and scales)", REQUIRED, "fp4", "gather", feature="fp4")
@pytest.mark.parametrize("fmt", FMTS)
def test_gather_raw(kvx_provider, kvx_call_options, fmt):
    layout = _core(kvx_provider, kvx_call_options)
    _gather(kvx_provider, kvx_call_options(), fmt, DType.F4_E2M1, layout, 70 + int(fmt), "exact")


CL_RAW_BATCH = (CL + " (F4_E2M1 IO copies codes and scales); R-DATA (rows t >= min(L, max_seq_len) untouched, "
                "required: the codes and both scale outputs)")
#: ``fp4.gather.raw_batch``: 16 sequences of max_seq_len 10 (160 output rows): full, short, one empty,
#: two longer than max_seq_len
RAW_BATCH_LENS, RAW_BATCH_MSL = [10, 3, 0, 14, 7, 1, 10, 5, 9, 2, 13, 6, 4, 8, 10, 1], 10


def _padding_changes(out: dict, init: dict, lens, msl: int) -> list[str]:
    """Rows t >= min(L, max_seq_len) of each sequence that a gather changed, per output (codes
    and scales), against their contents before the call."""
    probs = []
    for k in ("k", "v", "k_scales", "v_scales"):
        g, e = out.get(k), init.get(k)
        if g is None or e is None or g.shape != e.shape:
            continue  # a missing output or one of another shape: gather_problems says so
        hit = []
        for s, L in enumerate(lens):
            n = max(0, min(int(L), msl))
            if n == msl:
                continue  # no padding rows
            rows = slice(s * msl + n, (s + 1) * msl)
            changed = (g[rows] != e[rows]).reshape(msl - n, -1).any(axis=1)
            hit += [(s, n + int(t)) for t in np.flatnonzero(changed)]
        if hit:
            s, t = hit[0]
            row = g[s * msl + t].reshape(-1)
            probs.append(f"{k}: {len(hit)} padding rows changed (sequence, t) {hit[:4]}; row {s * msl + t} "
                         f"now begins {bytes(row[:6]).hex()}, was {bytes(e[s * msl + t].reshape(-1)[:6]).hex()}")
    return probs


@conformance("fp4.gather.raw_batch", CL_RAW_BATCH, REQUIRED, "fp4", "gather", feature="fp4")
@pytest.mark.parametrize("fmt", FMTS)
def test_gather_raw_batch(kvx_provider, kvx_call_options, fmt):
    """A raw FP4 gather (F4_E2M1 outputs: codes, K and V scales) of 16 sequences into 160 rows whose
    every byte holds 0xA5 before the call: full sequences, short ones, one of length 0 and two longer
    than ``max_seq_len``. The padding rows of each sequence (``t >= min(L, max_seq_len)``) of the codes
    and of both scale outputs stay 0xA5 (R-DATA), the gathered rows are the cache's bytes. A provider
    that clears the padding rows of a batch (a zero-fill past the length in a batched raw kernel) fails;
    ``fp4.gather.raw`` gathers 20 rows."""
    _need_fp4(kvx_provider)
    opts = kvx_call_options()
    layout = _core(kvx_provider, kvx_call_options)
    seed = 540 + int(fmt)
    cache, blocks = _filled_cache(fmt, layout, seed)
    lens, msl = RAW_BATCH_LENS, RAW_BATCH_MSL
    rng = np.random.default_rng(seed + 1)
    table = np.array([rng.permutation(blocks)[:-(-msl // BS)] for _ in lens], np.int32)  # filled blocks, shuffled
    out = DType.F4_E2M1
    res = fx.run_gather(kvx_provider, cache, table, lens, msl, out, memory=opts.memory)
    case = _case(fmt, out, layout, seed, f", gather of {len(lens)} sequences ({len(lens) * msl} output rows, "
                                         f"pre-filled {fx.POISON:#04x}) table {table.tolist()} seq_lens {lens} "
                                         f"max_seq_len {msl}")
    init = fx.out_init(cache, len(lens) * msl, out)
    _check_guards(res, CL_RAW_BATCH, seed, case)
    _refusal_wrote_nothing(res, init, None, CL_RAW_BATCH, seed, case)
    _status(res.status, Status.OK, "raw FP4 gather", CL_RAW_BATCH, seed, case)
    _fail_if(_padding_changes(res.out, init, lens, msl), "raw FP4 gather wrote padding rows",
             f"rows t >= min(L, max_seq_len) of each sequence untouched in the codes and in the K and V scale "
             f"outputs (every byte still {fx.POISON:#04x})", CL_RAW_BATCH, seed, case)
    want = fx.expected_gather(cache, table, lens, msl, out, init)
    _fail_if(fx.gather_problems(res.out, want, out, "exact"), "raw FP4 gather (codes and scales)",
             "bit-identical to the oracle: the cache's codes and scale bytes at rows t < min(L, max_seq_len), "
             "the other rows untouched", CL_RAW_BATCH, seed, case)


INVALID_CASES = {
    "head_dim_not_multiple": {"cache.head_dim": 40, "cache.k.shape[3]": 40, "cache.v.shape[3]": 40},
    "bad_format": {"cache.fp4.format": 9},
    "scale_dtype_mismatch": {"cache.fp4.k_scales.dtype": int(DType.F16)},
    "scale_shape_mismatch": {"cache.fp4.v_scales.shape[3]": 3},
    "scale_pool_null": {"cache.fp4.k_scales.data": None},
    "ext_size_too_small": {"cache.fp4.size": 8},
    "global_scale_bad_granularity": {"cache.fp4.k_global.granularity": 2},
    # R-SIZE: the structs inside the extension are size-guarded too
    "k_scales_size_zero": {"cache.fp4.k_scales.size": 0},
    "v_scales_size_too_small": {"cache.fp4.v_scales.size": 8},
    "k_global_size_zero": {"cache.fp4.k_global.size": 0},
}


@conformance("fp4.validate.invalid", CL + " (head_dim % 16 / % 32, scale pool descriptors, the size of each struct "
             "inside the extension: R-SIZE)", REQUIRED, "fp4",
             "write", feature="fp4")
@pytest.mark.parametrize("name", list(INVALID_CASES))
def test_invalid_descriptors(kvx_provider, kvx_call_options, name):
    _need_fp4(kvx_provider)
    seed = 80
    fmt = Fp4Format.NVFP4
    # the core layout: a refusal of a layout the provider does not serve would answer INVALID_ARGUMENT
    # without reaching the descriptor under test
    cache = fx.new_cache(fmt, NB, BS, H, D, _core(kvx_provider, kvx_call_options), k_global=np.float32(0.5))
    key, value = _data(seed, 3, 16, edges=False)
    res = fx.run_write(kvx_provider, cache, key, value, [1, 2, 3], memory=kvx_call_options().memory,
                       overrides=INVALID_CASES[name])
    case = f"NVFP4 cache with {INVALID_CASES[name]}"
    if res.status == Status.UNSUPPORTED:
        raise ConformanceFailure("malformed FP4 descriptor", expected="INVALID_ARGUMENT", got="UNSUPPORTED",
                                 clause=CL, case=case, seed=seed)
    _status(res.status, Status.INVALID_ARGUMENT, "malformed FP4 descriptor", CL, seed, case)
    _check_guards(res, CL, seed, case)
    if not np.array_equal(res.cache.k_codes, cache.k_codes) or not np.array_equal(res.cache.k_scales, cache.k_scales):
        raise ConformanceFailure("a refused call wrote the cache", expected="no change", got="cache modified",
                                 clause=CL, case=case, seed=seed)


CL_VALID = CL + "; spec 7 (kvx_validate_cache_desc answers OK for a valid descriptor)"


@conformance("fp4.validate.valid", CL_VALID, REQUIRED, "fp4", "validate", feature="fp4")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt", FMTS)
def test_validate_valid(kvx_provider, kvx_call_options, fmt, layout):
    """A valid FP4 cache (NVFP4 with global scales, MXFP4, MXFP4_OCP; NHD and HND) validates OK,
    changing nothing. A refusal (UNSUPPORTED, or INVALID_ARGUMENT: spec 8 "unsupported field") is
    the feature's only while the provider's write refuses the same cache too: a provider that
    writes a cache its validation refuses (validation with v1.1 dtype rules) fails."""
    _need_fp4(kvx_provider)
    seed = 84 + int(fmt)
    memory = kvx_call_options().memory
    gk, gv = _g(fmt, seed)
    cache = fx.new_cache(fmt, NB, BS, H, D, layout, k_global=gk, v_global=gv)
    case = f"{fx.FORMAT_NAMES[fmt]} cache ({layout.name}), H={H} D={D} block_size={BS}"
    res = fx.run_validate(kvx_provider, cache, memory=memory)
    _check_guards(res, CL_VALID, seed, case)
    if not (np.array_equal(res.cache.k_codes, cache.k_codes) and np.array_equal(res.cache.v_codes, cache.v_codes)
            and np.array_equal(res.cache.k_scales, cache.k_scales)
            and np.array_equal(res.cache.v_scales, cache.v_scales)):
        raise ConformanceFailure("kvx_validate_cache_desc wrote the cache", expected="no change",
                                 got="cache codes or scale pool modified", clause=CL_VALID, case=case, seed=seed)
    if res.status == Status.OK:
        return
    if res.status not in (Status.UNSUPPORTED, Status.INVALID_ARGUMENT):
        raise ConformanceFailure("kvx_validate_cache_desc on a valid FP4 cache", expected="OK",
                                 got=status_name(res.status), clause=CL_VALID, case=case, seed=seed)
    key, value = _data(seed, 4, cache.B, edges=False)
    w = fx.run_write(kvx_provider, cache, key, value, [1, 6, 13, 30], memory=memory)
    if w.status == Status.OK:
        raise ConformanceFailure("kvx_validate_cache_desc refused an FP4 cache the provider writes",
                                 expected="OK (kvx_write_kv answers OK on the same cache)",
                                 got=f"{status_name(res.status)} from kvx_validate_cache_desc",
                                 clause=CL_VALID, case=case, seed=seed)
    _status(w.status, Status.OK, f"FP4 cache refused by validation ({status_name(res.status)}) and by write", CL_VALID,
            seed, case)


@conformance("fp4.validate.f4_without_extension", CL + " (F4_E2M1 needs the 1.2 cache struct)", REQUIRED, "fp4",
             "validate", feature="fp4")
def test_f4_dtype_without_extension(kvx_provider, kvx_call_options):
    """F4_E2M1 in a v1.1-sized cache (no scale pool) is INVALID_ARGUMENT for every provider."""
    from kvx_conformance.abi import header as abi

    cache = fx.new_cache(Fp4Format.MXFP4, NB, BS, H, D, _core(kvx_provider, kvx_call_options))
    key, value = _data(81, 2, 16, edges=False)
    res = fx.run_write(kvx_provider, cache, key, value, [0, 5], memory=kvx_call_options().memory,
                       cache_size=abi.V1_1_SIZES["kvx_cache_desc_t"])
    if res.status != Status.INVALID_ARGUMENT:
        raise ConformanceFailure("F4_E2M1 cache without the FP4 extension", expected="INVALID_ARGUMENT",
                                 got=status_name(res.status), clause=CL, case="v1.1-sized kvx_cache_desc_t, k.dtype 11",
                                 seed=81)
    _check_guards(res, CL, 81, "v1.1-sized kvx_cache_desc_t, k.dtype 11")


@conformance("fp4.write.specials_isolated", CL + " (NaN/Inf: no crash, other blocks undisturbed)", INFORMATIONAL,
             "fp4", "write", feature="fp4")
@pytest.mark.parametrize("fmt", FMTS)
def test_specials_do_not_disturb_other_blocks(kvx_provider, kvx_call_options, fmt):
    layout = _core(kvx_provider, kvx_call_options)
    seed = 90 + int(fmt)
    key, value = _data(seed, 8, fx.block_values(fmt), edges=False)
    key[0, 0, 3], key[1, 1, 0], value[2, 0, 5] = np.nan, np.inf, -np.inf
    cache, k, v, slots, res = _write(kvx_provider, kvx_call_options(), fmt, DType.F32, layout, seed,
                                     key=key, value=value)
    case = _case(fmt, DType.F32, layout, seed, ", NaN and Inf in three blocks")
    _status(res.status, Status.OK, "FP4 write with NaN/Inf", CL, seed, case)
    want = fx.expected_write(cache, k, v, slots)
    _fail_if(fx.compatible_write_problems(cache, res.cache, want, k, v, slots), "NaN/Inf disturbed other blocks",
             "blocks without NaN/Inf as without them", CL, seed, case)


# ----------------------------------------------------------------------------- fp4_exact (exact tier)


def _exact_write(provider, opts, fmt, io, layout, seed, **kw):
    cache, k, v, slots, res = _write(provider, opts, fmt, io, layout, seed, **kw)
    case = _case(fmt, io, layout, seed, kw.get("note", ""))
    _status(res.status, Status.OK, "FP4 write", CL_EXACT, seed, case)
    _check_guards(res, CL_EXACT, seed, case)
    want = fx.expected_write(cache, k, v, slots)
    # blocks filled from NaN / Inf inputs (F16 inputs of the 2^40 block overflow to Inf) are informational
    # (readings: "NaN/Inf inputs must not crash and must not disturb other blocks (informational beyond that)")
    _fail_if(fx.exact_write_problems(res.cache, want, special=fx.special_blocks(cache, k, v, slots)),
             "FP4 write not bit-identical to the reference codec",
             "codes and scale bytes of reference_impl.fp4 (blocks with NaN / Inf inputs aside)", CL_EXACT, seed, case)


@conformance("fp4_exact.write", CL_EXACT, REQUIRED, "fp4_exact", "write", feature="fp4")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("io", IO)
@pytest.mark.parametrize("fmt", FMTS)
def test_exact_write(kvx_provider, kvx_call_options, fmt, io, layout):
    _exact_write(kvx_provider, kvx_call_options(), fmt, io, layout, 110 + int(fmt) * 5 + int(io))


def _tie_rows(fmt: Fp4Format, seed: int) -> np.ndarray:
    """Rows whose blocks put x / scale exactly on every E2M1 tie point from +-0.25 to +-5."""
    rng = np.random.default_rng(seed)
    B = fx.block_values(fmt)
    n = 8
    x = np.empty((n, H, D // B, B), np.float32)
    for idx in np.ndindex(x.shape[:3]):
        unit = np.float32(2.0) ** int(rng.integers(-6, 6))
        vals = rng.choice(np.concatenate([TIES, -TIES]), B).astype(np.float32)
        vals[0] = np.float32(6.0) * (1 if rng.integers(2) else -1)  # amax / 6 = unit exactly
        if fmt == Fp4Format.MXFP4_OCP:  # floor(log2 amax) - 2: make amax 4 * unit so the scale is `unit`
            vals[0] = np.float32(4.0) * np.sign(vals[0])
            vals = np.clip(vals, -4, 4)
            vals[1:] = np.where(np.abs(vals[1:]) > 3.5, np.float32(3.5) * np.sign(vals[1:]), vals[1:])
        x[idx] = vals * unit
    return x.reshape(n, H, D)


@conformance("fp4_exact.write.ties", CL_EXACT + " (E2M1 ties to the even code, every tie from 0.25 to 5)", REQUIRED,
             "fp4_exact", "write", feature="fp4")
@pytest.mark.parametrize("fmt", FMTS)
def test_exact_ties(kvx_provider, kvx_call_options, fmt):
    layout = _core(kvx_provider, kvx_call_options)
    seed = 130 + int(fmt)
    key = _tie_rows(fmt, seed)
    value = -key[::-1].copy()
    glob = (None, None)
    if fmt == Fp4Format.NVFP4:  # power-of-two global scales keep every quotient exact
        glob = (np.float32(2.0 ** -7), [np.float32(2.0 ** -3), np.float32(4.0)])
        key = key * glob[0]
        value = value * np.asarray(glob[1], np.float32)[None, :, None]
    _exact_write(kvx_provider, kvx_call_options(), fmt, DType.F32, layout, seed, key=key, value=value,
                 globals_=glob, note=", every block on E2M1 tie points")


@conformance("fp4_exact.write.edges", CL_EXACT + " (E4M3-subnormal scales, saturation, exponent boundaries, -0)",
             REQUIRED, "fp4_exact", "write", feature="fp4")
@pytest.mark.parametrize("fmt", FMTS)
def test_exact_edges(kvx_provider, kvx_call_options, fmt):
    layout = _core(kvx_provider, kvx_call_options)
    seed = 140 + int(fmt)
    rng = np.random.default_rng(seed)
    B = fx.block_values(fmt)
    key, value = _data(seed, 12, B)
    kb = key.reshape(12, H, D // B, B)
    for i in range(12):  # amax / 6 at and one ulp above powers of two; E4M3-subnormal NVFP4 scales
        amax = np.float32(6.0) * np.float32(2.0) ** int(rng.integers(-12, 12))
        if i % 2:
            amax = np.nextafter(amax, np.float32(np.inf))
        kb[i, 0, 0] = np.clip(kb[i, 0, 0], -1, 1) * amax
        kb[i, 0, 0, 0] = amax
        kb[i, 1, 0] *= np.float32(2.0) ** int(rng.integers(-24, -14))
    _exact_write(kvx_provider, kvx_call_options(), fmt, DType.F32, layout, seed,
                 key=kb.reshape(12, H, D), value=value, note=", scale edge cases")


# ----------------------------------------------------------------------------- tiny blocks (subnormals)

CL_TINY = (" (tiny blocks: inputs below 2^-126 read as their value, no DAZ; MXFP4 exponents clamped at -127, "
           "scale byte 0 = 2^-127; results below 2^-126 kept, no FTZ)")
#: block amax exponents of the tiny rows: F32 subnormals (2^-149 .. 2^-127), the smallest normals, and
#: the range where MXFP4's exponent meets its clamp at -127 (amax / 6 <= 2^-127: scale byte 0)
TINY_EXPONENTS = np.array([-140, -135, -130, -128, -127, -127, -126, -126, -125, -124, -123, -118], np.int32)
#: NVFP4 global scales for tiny inputs: the smallest normal FP32 values (with g = 1 every tiny block's
#: scale underflows to 0, codes 0, whatever the inputs)
TINY_GLOBALS = (np.float32(2.0 ** -126), [np.float32(2.0 ** -126), np.float32(2.0 ** -125)])


def _tiny_rows(seed: int, n: int, B: int) -> tuple[np.ndarray, np.ndarray]:
    """K and V rows [n, H, D] of F32 whose every block has its largest magnitude at 2^e x [1, 2), e drawn
    from TINY_EXPONENTS (one element is that amax, the others uniform below it, signs mixed): blocks of
    subnormals and of values next to the smallest normal."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(2):
        blocks = n * H * (D // B)
        amax = np.ldexp(rng.uniform(1.0, 2.0, blocks), rng.choice(TINY_EXPONENTS, blocks))
        x = rng.uniform(-1.0, 1.0, (blocks, B)) * amax[:, None]
        x[np.arange(blocks), rng.integers(0, B, blocks)] = amax * rng.choice([-1.0, 1.0], blocks)
        out.append(x.astype(np.float32).reshape(n, H, D))
    return out[0], out[1]


def _tiny_globals(fmt):
    return TINY_GLOBALS if fmt == Fp4Format.NVFP4 else (None, None)


@conformance("fp4.write.tiny_blocks", CL_COMPAT + CL_TINY, REQUIRED, "fp4", "write", feature="fp4")
@pytest.mark.parametrize("io", [pytest.param(DType.F32, id="f32"), pytest.param(DType.BF16, id="bf16")])
@pytest.mark.parametrize("fmt", FMTS)
def test_write_tiny_blocks(kvx_provider, kvx_call_options, fmt, io):
    """Blocks of F32 / BF16 subnormals and of values next to 2^-126 (NVFP4 with global scales of
    2^-126 and 2^-125, so the block scales stay in range): every block is encoded from its values.
    A quantizer built with flush-to-zero / denormals-are-zero arithmetic (fast math) reads such a
    block as all zero and stores scale 0, codes 0."""
    layout = _core(kvx_provider, kvx_call_options)
    seed = 190 + int(fmt) * 3 + int(io)
    key, value = _tiny_rows(seed, 12, fx.block_values(fmt))
    cache, k, v, slots, res = _write(kvx_provider, kvx_call_options(), fmt, io, layout, seed, key=key,
                                     value=value, globals_=_tiny_globals(fmt))
    case = _case(fmt, io, layout, seed, ", tiny blocks: amax 2^-140 to 2^-117" +
                 (", global scales K 2^-126, V [2^-126, 2^-125]" if fmt == Fp4Format.NVFP4 else ""))
    _status(res.status, Status.OK, "FP4 write of tiny blocks", CL_COMPAT + CL_TINY, seed, case)
    _check_guards(res, CL_COMPAT + CL_TINY, seed, case)
    want = fx.expected_write(cache, k, v, slots)
    _fail_if(fx.compatible_write_problems(cache, res.cache, want, k, v, slots),
             "FP4 write of tiny blocks outside the compatible tier", "scales within one step, codes within one "
             "grid step of the oracle's, subnormal inputs read as their values (no DAZ), other rows untouched",
             CL_COMPAT + CL_TINY, seed, case)


@conformance("fp4_exact.write.tiny_blocks", CL_EXACT + CL_TINY, REQUIRED, "fp4_exact", "write", feature="fp4")
@pytest.mark.parametrize("fmt", FMTS)
def test_exact_tiny_blocks(kvx_provider, kvx_call_options, fmt):
    """``fp4.write.tiny_blocks`` (F32) in the exact tier: where the exponent rule gives -127 or less
    (MXFP4: amax / 6 <= 2^-127; OCP: amax < 2^-124) it clamps at -127, scale byte 0 (docs/fp4.md),
    never byte 1."""
    layout = _core(kvx_provider, kvx_call_options)
    seed = 200 + int(fmt)
    key, value = _tiny_rows(seed, 12, fx.block_values(fmt))
    _exact_write(kvx_provider, kvx_call_options(), fmt, DType.F32, layout, seed, key=key, value=value,
                 globals_=_tiny_globals(fmt), note=", tiny blocks: amax 2^-140 to 2^-117")


@conformance("fp4.gather.tiny_values", CL_COMPAT + CL_TINY, REQUIRED, "fp4", "gather", feature="fp4")
@pytest.mark.parametrize("out", [pytest.param(DType.F32, id="f32"), pytest.param(DType.BF16, id="bf16")])
@pytest.mark.parametrize("fmt", FMTS)
def test_gather_tiny_values(kvx_provider, kvx_call_options, fmt, out):
    """A cache holding the oracle's encoding of tiny blocks (MXFP4 scale bytes 0 to 8; NVFP4 with global
    scales of 2^-126, 2^-125) gathered into F32 / BF16: the decoded values lie below 2^-126, subnormals
    of the output dtype, within one ulp of the oracle's (a dequantizer with flush-to-zero returns 0)."""
    layout = _core(kvx_provider, kvx_call_options)
    _need_fp4(kvx_provider)
    opts = kvx_call_options()
    seed = 210 + int(fmt) * 3 + int(out)
    gk, gv = _tiny_globals(fmt)
    cache = fx.new_cache(fmt, NB, BS, H, D, layout, k_global=gk, v_global=gv)
    blocks = list(np.random.default_rng(seed).permutation(NB)[:6])
    k, v = _tiny_rows(seed, 6 * BS, cache.B)
    fx.fill_cache(cache, blocks, k, v)
    table = np.array([blocks[:3], blocks[3:6]], np.int32)
    lens, msl = [11, 7], 10
    res = fx.run_gather(kvx_provider, cache, table, lens, msl, out, memory=opts.memory)
    case = _case(fmt, out, layout, seed, f", tiny blocks, gather table {table.tolist()} seq_lens {lens} "
                                                   f"max_seq_len {msl}")
    clause = CL_COMPAT + CL_TINY
    _status(res.status, Status.OK, "FP4 gather of tiny blocks", clause, seed, case)
    _check_guards(res, clause, seed, case)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        want = fx.expected_gather(cache, table, lens, msl, out, fx.out_init(cache, len(lens) * msl, out))
    _fail_if(fx.gather_problems(res.out, want, out, "compatible"), "dequantizing FP4 gather of tiny blocks",
             "within one ulp of the oracle's decode, subnormal results kept (no FTZ); rows past the length "
             "untouched", clause, seed, case)


@conformance("fp4_exact.gather", CL_EXACT + " ((E2M1 x s) x g in FP32, one RNE rounding)", REQUIRED, "fp4_exact",
             "gather", feature="fp4")
@pytest.mark.parametrize("out", IO)
@pytest.mark.parametrize("fmt", FMTS)
def test_exact_gather(kvx_provider, kvx_call_options, fmt, out):
    layout = _core(kvx_provider, kvx_call_options)
    _gather(kvx_provider, kvx_call_options(), fmt, out, layout, 150 + int(fmt) + 3 * int(out), "exact")


# ----------------------------------------------------------------------------- slots, raw writes, bad ids, threads

CL_SLOTS = CL_COMPAT + "; spec 5.2 (S32 / S64 slots, invalid_slot: a token whose slot equals it is a no-op); R-WRITE"
SLOT_CASES = [pytest.param(dt, inv, id=f"{dt.name.lower()}-{name}")
              for dt in (DType.S32, DType.S64) for inv, name in ((-1, "invalid_minus1"), (7, "invalid_sentinel7"))]


@conformance("fp4.write.slots", CL_SLOTS, REQUIRED, "fp4", "write", feature="fp4")
@pytest.mark.parametrize("slot_dtype,invalid_slot", SLOT_CASES)
def test_write_slots(kvx_provider, kvx_call_options, slot_dtype, invalid_slot):
    """S32 and S64 slots, with invalid_slot -1 or a non-negative sentinel that several tokens carry
    (the FP4 path shares the v1.1 pre-scan of slots, docs/fp4.md): those tokens write nothing."""
    _need_fp4(kvx_provider)
    seed = 160 + int(slot_dtype) + (invalid_slot > 0)
    fmt, layout = Fp4Format.NVFP4, _core(kvx_provider, kvx_call_options)
    n = 16
    key, value = _data(seed, n, fx.block_values(fmt), edges=False)
    slots = np.random.default_rng(seed + 99).permutation(NB * BS)[:n].astype(np.int64)
    slots = slots[slots != 7][:n - 3] if invalid_slot == 7 else slots[:n - 3]
    slots = np.concatenate([slots, [invalid_slot] * 3])[np.random.default_rng(seed).permutation(n)]  # 3 no-ops
    gk, gv = _g(fmt, seed)
    cache = fx.new_cache(fmt, NB, BS, H, D, layout, k_global=gk, v_global=gv)
    res = fx.run_write(kvx_provider, cache, key, value, slots, memory=kvx_call_options().memory,
                       invalid_slot=invalid_slot, slot_dtype=slot_dtype)
    case = _case(fmt, DType.F32, layout, seed, f", {slot_dtype.name} slots {slots.tolist()}, "
                                               f"invalid_slot {invalid_slot}")
    _status(res.status, Status.OK, "FP4 write", CL_SLOTS, seed, case)
    _check_guards(res, CL_SLOTS, seed, case)
    want = fx.expected_write(cache, key, value, slots, invalid_slot=invalid_slot)
    _fail_if(fx.compatible_write_problems(cache, res.cache, want, key, value, slots, invalid_slot=invalid_slot),
             f"FP4 write with {slot_dtype.name} slots and invalid_slot {invalid_slot}",
             "every valid slot written (compatible tier), tokens whose slot is invalid_slot no-ops, other rows "
             "untouched", CL_SLOTS, seed, case)


CL_RAW_WRITE = CL + " (IO F4_E2M1 with desc.fp4 scales copies codes and scale bytes into the cache); R-WRITE"


@conformance("fp4.write.raw", CL_RAW_WRITE, REQUIRED, "fp4", "write", feature="fp4")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt", FMTS)
def test_write_raw(kvx_provider, kvx_call_options, fmt, layout):
    _need_fp4(kvx_provider)
    seed = 170 + int(fmt)
    gk, gv = _g(fmt, seed)
    cache = fx.new_cache(fmt, NB, BS, H, D, layout, k_global=gk, v_global=gv)
    n = 14
    key, value = _data(seed, n, cache.B)
    value = value * np.float32(37.0)  # V's scales unlike K's
    kc, ks = fx.encode_rows(fmt, key, cache.g_per_head("k"))
    vc, vs = fx.encode_rows(fmt, value, cache.g_per_head("v"))
    slots = np.random.default_rng(seed + 99).permutation(NB * BS)[:n].astype(np.int64)
    slots[3] = -1
    res = fx.run_write(kvx_provider, cache, np.ascontiguousarray(kc), np.ascontiguousarray(vc), slots,
                       memory=kvx_call_options().memory,
                       raw_scales=(np.ascontiguousarray(ks), np.ascontiguousarray(vs)))
    case = _case(fmt, DType.F4_E2M1, layout, seed, ", raw codes and scales (K's unlike V's)")
    _status(res.status, Status.OK, "raw FP4 write", CL_RAW_WRITE, seed, case)
    _check_guards(res, CL_RAW_WRITE, seed, case)
    want = fx.expected_write(cache, key, value, slots)
    _fail_if(fx.exact_write_problems(res.cache, want), "raw FP4 write did not store the given bytes",
             "the cache holds exactly the codes and scale bytes written (K's scales to K, V's to V), other rows "
             "untouched", CL_RAW_WRITE, seed, case)


CL_RAW_SLOTS = (CL + " (IO F4_E2M1 with desc.fp4 scales copies codes and scale bytes into the cache); spec 5.2, 7 "
                "(a token whose slot is < 0 or equals invalid_slot, any int64 value, also a valid slot's, is a no-op, "
                "whatever the IO dtype); R-WRITE")
#: (slot dtype, tokens) of ``fp4.write.raw_slots``: 14 tokens (3 carry the sentinel, 1 carries -1) into the suite's
#: cache of 12 blocks; 300 tokens (a prefill batch: whole blocks in order, 21 sentinel tokens, 16 of them a padding
#: tail, 4 carry -1) into a cache of RAW_BATCH_BLOCKS blocks
RAW_SLOT_CASES = [pytest.param(dt, n, id=f"{dt.name.lower()}-{n}tok") for dt in (DType.S32, DType.S64)
                  for n in (14, 300)]
RAW_BATCH_BLOCKS = 80


def _raw_slot_plan(n: int, nb: int, seed: int) -> tuple[np.ndarray, int]:
    """Slots of ``n`` raw tokens into ``nb`` blocks of BS and the non-negative ``invalid_slot``: a valid
    slot's value that no token writes, carried by 3 (n < 50) or 21 tokens, one or four tokens -1.
    Few tokens: scattered slots. Many: whole shuffled blocks, each in order (a prefill), the last one
    partly, the sentinel its next free offset (where an engine's padding would land); 5 sentinel tokens
    among the others and a tail of 16."""
    rng = np.random.default_rng(seed)
    small = n < 50
    n_sent, n_neg, tail = (3, 1, 0) if small else (21, 4, 16)
    real = n - n_sent - n_neg
    if small:
        perm = rng.permutation(nb * BS)
        body, sentinel = [int(s) for s in perm[:real]], int(perm[real])
    else:
        blocks = rng.permutation(nb)
        full, rem = divmod(real, BS)
        assert full < nb
        body = [int(b) * BS + t for b in blocks[:full] for t in range(BS)]
        body += [int(blocks[full]) * BS + t for t in range(rem)]
        sentinel = int(blocks[full]) * BS + rem
    for extra in [sentinel] * (n_sent - tail) + [-1] * n_neg:
        body.insert(int(rng.integers(0, len(body) + 1)), extra)
    return np.array(body + [sentinel] * tail, np.int64), sentinel


@conformance("fp4.write.raw_slots", CL_RAW_SLOTS, REQUIRED, "fp4", "write", feature="fp4")
@pytest.mark.parametrize("slot_dtype,n", RAW_SLOT_CASES)
@pytest.mark.parametrize("fmt", FMTS)
def test_write_raw_slots(kvx_provider, kvx_call_options, fmt, slot_dtype, n):
    """``fp4.write.raw`` (codes and scale bytes copied, nothing quantized) with S32 and S64 slots and a
    non-negative ``invalid_slot`` that is a valid slot's value, carried by several tokens beside -1, in
    a call of 14 tokens and in a prefill batch of 300: the sentinel's row stays untouched. A raw path that
    skips negative slots only (``slot < 0``), where the quantizing path honours ``invalid_slot``, stores
    the sentinel tokens there."""
    _need_fp4(kvx_provider)
    opts = kvx_call_options()
    layout = _core(kvx_provider, kvx_call_options)
    seed = 500 + 10 * int(fmt) + 2 * (slot_dtype == DType.S64) + (n > 50)
    nb = NB if n < 50 else RAW_BATCH_BLOCKS
    gk, gv = _g(fmt, seed)
    cache = fx.new_cache(fmt, nb, BS, H, D, layout, k_global=gk, v_global=gv)
    key, value = _data(seed, n, cache.B)
    value = value * np.float32(37.0)  # V's scales unlike K's
    kc, ks = fx.encode_rows(fmt, key, cache.g_per_head("k"))
    vc, vs = fx.encode_rows(fmt, value, cache.g_per_head("v"))
    slots, sentinel = _raw_slot_plan(n, nb, seed + 99)
    res = fx.run_write(kvx_provider, cache, np.ascontiguousarray(kc), np.ascontiguousarray(vc), slots,
                       memory=opts.memory, invalid_slot=sentinel, slot_dtype=slot_dtype,
                       raw_scales=(np.ascontiguousarray(ks), np.ascontiguousarray(vs)))
    carriers = np.flatnonzero(slots == sentinel).tolist()
    shown = slots.tolist() if n < 50 else f"{slots[:8].tolist()}... ({n} tokens)"
    case = (f"{fx.FORMAT_NAMES[fmt]} cache ({layout.name}) of {nb} blocks, F4_E2M1 IO (raw codes and scales, K's "
            f"unlike V's), H={H} D={D} block_size={BS}, {slot_dtype.name} slots {shown}, invalid_slot {sentinel} "
            f"(a valid slot's value) on tokens {carriers}, -1 on tokens {np.flatnonzero(slots == -1).tolist()}")
    _check_guards(res, CL_RAW_SLOTS, seed, case)
    _refusal_wrote_nothing(res, None, cache, CL_RAW_SLOTS, seed, case)
    _status(res.status, Status.OK, "raw FP4 write", CL_RAW_SLOTS, seed, case)
    b, t = divmod(sentinel, BS)
    stored = [f"{side}_{part}[block {b}, offset {t}]" for side in ("k", "v") for part in ("codes", "scales")
              if not np.array_equal(cache.row(getattr(res.cache, f"{side}_{part}"), b, t),
                                    cache.row(getattr(cache, f"{side}_{part}"), b, t))]
    _fail_if(["changed: " + ", ".join(stored)] if stored else [],
             f"raw FP4 write stored the tokens whose slot is invalid_slot {sentinel}",
             f"a no-op for each of tokens {carriers} (slot {sentinel} == invalid_slot): the row of slot {sentinel} "
             f"untouched", CL_RAW_SLOTS, seed, case)
    want = fx.expected_write(cache, key, value, slots, invalid_slot=sentinel)
    _fail_if(fx.exact_write_problems(res.cache, want), "raw FP4 write did not store the given bytes",
             "the cache holds exactly the codes and scale bytes written (K's scales to K, V's to V) at every valid "
             "slot; tokens whose slot is invalid_slot or -1 no-ops, other rows untouched", CL_RAW_SLOTS, seed, case)


CL_BAD_ID = CL + "; spec 5.1, 8 (block id >= num_blocks: OUT_OF_RANGE); R-DATA (never out of bounds), R-DEVICE-STATUS"
BAD_FP4_IDS = {"num_blocks_plus_used": None, "int32_max": 2 ** 31 - 1}


@conformance("fp4.gather.bad_block_id", CL_BAD_ID, REQUIRED, "fp4", "gather", feature="fp4")
@pytest.mark.parametrize("out", [pytest.param(DType.F32, id="f32"), pytest.param(DType.F4_E2M1, id="raw")])
@pytest.mark.parametrize("bad_name", list(BAD_FP4_IDS))
def test_gather_bad_block_id(kvx_provider, kvx_call_options, bad_name, out):
    """A PACKED table whose used entry is >= num_blocks (num_blocks + a filled block: a provider
    taking it modulo num_blocks reads real data). On host memory the status is OUT_OF_RANGE
    (INVALID_ARGUMENT accepted); on DEVICE memory OK is allowed when only the valid part was
    written. Each output element is either untouched or as the valid part of the gather leaves it
    (the bad block's rows untouched)."""
    _need_fp4(kvx_provider)
    opts = kvx_call_options()
    fmt, layout = Fp4Format.NVFP4, _core(kvx_provider, kvx_call_options)
    seed = 180 + (bad_name == "int32_max")
    cache, blocks = _filled_cache(fmt, layout, seed)
    table = np.array([blocks[:3], blocks[3:6]], np.int64)
    bad = BAD_FP4_IDS[bad_name] if BAD_FP4_IDS[bad_name] is not None else NB + int(blocks[6])
    table[1, 1] = bad  # used: sequence 1 has 7 tokens, block_size 4
    lens, msl = [11, 7], 10
    res = fx.run_gather(kvx_provider, cache, table.astype(np.int32), lens, msl, out, memory=opts.memory)
    case = _case(fmt, out, layout, seed, f", gather table {table.tolist()} (num_blocks {NB}) seq_lens {lens} "
                                         f"max_seq_len {msl}")
    _judge_bad_id(res, opts.memory, cache, table, (1, 1), int(blocks[0]), lens, msl, out, CL_BAD_ID, seed, case,
                  "FP4 gather with a block id >= num_blocks", "FP4 gather with a bad block id read or wrote what it "
                  "may not")


def _judge_bad_id(res, memory, cache, table, bad_at, stand_in, lens, msl, out, clause, seed, case, what,
                  what_values=None):
    """The answer to a PACKED gather whose used entry ``table[bad_at]`` names no block of the
    cache: on host memory OUT_OF_RANGE (INVALID_ARGUMENT accepted); on DEVICE memory OK is
    allowed when only the valid part was written (R-DEVICE-STATUS). Each output element is
    untouched or as the valid part of the gather leaves it (the bad entry's rows untouched):
    the oracle gathers the table with ``stand_in`` at ``bad_at`` and resets those rows."""
    allowed = {int(Status.OUT_OF_RANGE), int(Status.INVALID_ARGUMENT)}
    from kvx_conformance.abi.header import Memory
    if memory == Memory.DEVICE:
        allowed.add(int(Status.OK))  # R-DEVICE-STATUS: the valid part only
    if res.status == Status.UNSUPPORTED:
        raise Unsupported(f"{what}: UNSUPPORTED", feature=("fp4",) + fx.layout_feature())
    if res.status not in allowed:
        raise ConformanceFailure(what, expected="OUT_OF_RANGE (recommended) "
                                 "or INVALID_ARGUMENT" + (" (or OK on DEVICE memory, valid part only)"
                                                          if memory == Memory.DEVICE else ""),
                                 got=status_name(res.status), clause=clause, case=case, seed=seed)
    _check_guards(res, clause, seed, case)
    init = fx.out_init(cache, len(lens) * msl, out)
    good = np.array(table, np.int64)
    good[bad_at] = stand_in
    with np.errstate(over="ignore", invalid="ignore"):
        part = fx.expected_gather(cache, good, lens, msl, out, init)
    for s, L in enumerate(lens):  # rows of the bad block: untouched in the valid part
        for t in range(min(L, msl)):
            if (s, t // BS) == tuple(bad_at):
                for k in part:
                    part[k][s * msl + t] = init[k][s * msl + t]
    probs = []
    for k, e in part.items():
        g = res.out.get(k)
        if g is None or g.shape != e.shape:
            probs.append(f"{k}: output missing or of shape {None if g is None else g.shape}")
            continue
        ut = {1: np.uint8, 2: np.uint16, 4: np.uint32}[e.dtype.itemsize]
        gb, eb, ib = g.view(ut), e.view(ut), init[k].view(ut)
        for idx in np.argwhere((gb != eb) & (gb != ib))[:4]:
            t_ = tuple(int(v) for v in idx)
            probs.append(f"{k}{t_}: got {g[t_]!r}, neither untouched nor the valid part's {e[t_]!r}")
    _fail_if(probs, what_values or what + ": read or wrote what it may not",
             "each output element untouched or as the valid part leaves it (nothing read out of bounds)",
             clause, seed, case)


# ----------------------------------------------------------------------------- table formats, scale pool strides

CL_RAGGED = (CL_COMPAT + "; spec 5.1 (RAGGED), 5.3, 6.10; R-GATHER, R-DATA (token t of sequence s reads block "
             "indices[indptr[s] + t])")
CL_S64 = CL_COMPAT + "; spec 5.1, 6.3 (S64 block ids are 64 bits wide); R-GATHER, R-DATA, R-WIDE-IDS"

def _strided_write_verdict(res, cache, key, value, slots, raw: bool, clause: str, seed: int, case: str, title: str,
                           where: str, feature=("fp4", "noncanonical_strides"), invalid_slot: int = -1) -> None:
    """The verdict on an FP4 write into strided (non-canonical) tensors, or from strided inputs: guards, a
    refusal that wrote nothing (naming ``feature``: ``fp4`` and ``noncanonical_strides`` by default), then OK
    with the oracle's bytes (raw: exactly; from F16/BF16/F32: the compatible tier) at ``where``, the gaps and
    other rows unchanged."""
    _check_guards(res, clause, seed, case)
    _refusal_wrote_nothing(res, None, cache, clause, seed, case)
    _status(res.status, Status.OK, "raw FP4 write" if raw else "FP4 write", clause, seed, case, feature=feature)
    want = fx.expected_write(cache, key, value, slots, invalid_slot=invalid_slot)
    if raw:
        probs = fx.exact_write_problems(res.cache, want)
    else:
        probs = fx.compatible_write_problems(cache, res.cache, want, key, value, slots, invalid_slot=invalid_slot)
    tier = "the bytes written" if raw else "compatible tier"
    _fail_if(probs, title, f"{where} ({tier}), the gaps and other rows unchanged", clause, seed, case)


CL_SCALE_STRIDES = (CL_COMPAT + " (the scale pool takes any non-negative strides, in bytes); spec 4.2 (MUST honor "
                    "provided strides); R-CACHE")
GATHER_OUTS = [pytest.param(DType.F32, id="f32"), pytest.param(DType.BF16, id="bf16"),
               pytest.param(DType.F4_E2M1, id="raw")]


def _refusal_wrote_nothing(res, init: dict | None, before, clause, seed, case):
    """A refused call (UNSUPPORTED, or INVALID_ARGUMENT for a valid call) writes nothing (R-REFUSAL):
    a gather leaves its outputs as ``init``, a write leaves the cache as ``before``."""
    if res.status not in (Status.UNSUPPORTED, Status.INVALID_ARGUMENT):
        return
    probs = []
    if init is not None:
        for k, e in init.items():
            g = res.out.get(k)
            if g is not None and g.shape == e.shape and not np.array_equal(g.view(np.uint8), e.view(np.uint8)):
                probs.append(f"output {k} changed")
    if before is not None and res.cache is not None:
        for side in ("k", "v"):
            if not np.array_equal(res.cache.code_storage(side), before.code_storage(side)):
                probs.append(f"{side}_codes changed")
            if not np.array_equal(res.cache.scale_storage(side), before.scale_storage(side)):
                probs.append(f"{side} scale pool changed")
    _fail_if(probs, f"a refused FP4 call ({status_name(res.status)}) wrote", "nothing written by a refusal", clause,
             seed, case)


def _judge_gather(res, cache, table, lens, msl, out, clause, seed, case, feature="fp4", indptr=None):
    """A valid FP4 gather: inputs and guards unchanged, OK (a refusal names ``feature`` and writes
    nothing), outputs as the oracle's: within one ulp (dequantizing) or byte-exact (raw)."""
    init = fx.out_init(cache, len(lens) * msl, out)
    _check_guards(res, clause, seed, case)
    _refusal_wrote_nothing(res, init, None, clause, seed, case)
    _status(res.status, Status.OK, "FP4 gather", clause, seed, case, feature=feature)
    with np.errstate(over="ignore", invalid="ignore"):
        want = fx.expected_gather(cache, table, lens, msl, out, init, indptr=indptr)
    what = "raw FP4 gather (codes and scales)" if out == DType.F4_E2M1 else "dequantizing FP4 gather"
    _fail_if(fx.gather_problems(res.out, want, out, "compatible"), what,
             "bit-identical to the oracle" if out == DType.F4_E2M1 else
             "within one ulp of the oracle's decode; rows past the length untouched", clause, seed, case)


RAGGED_DTYPES = [
    pytest.param(DType.S32, DType.S32, id="idx_s32-indptr_s32"),
    pytest.param(DType.S64, DType.S64, id="idx_s64-indptr_s64"),
    pytest.param(DType.S32, DType.S64, id="idx_s32-indptr_s64"),
]


def _ragged_table(blocks, lens, msl: int, seed: int, lead: int = 3, spare: int = 2):
    """Flat RAGGED indices and indptr: every token its own block id drawn from ``blocks`` (R-DATA:
    token t of sequence s reads ``indices[indptr[s] + t]``), ``lead`` unused ids before the first
    range and ``spare`` unused ids after each range, so that ``indptr[s]`` is neither ``s`` nor a
    running count of the tokens read, and each range is longer than what is read."""
    rng = np.random.default_rng(seed)
    parts, indptr = [rng.choice(blocks, lead)], [lead]
    for L in lens:
        n = max(0, min(int(L), msl)) + spare
        parts.append(rng.choice(blocks, n))
        indptr.append(indptr[-1] + n)
    return np.concatenate(parts).astype(np.int64), np.array(indptr, np.int64)


@conformance("fp4.gather.ragged", CL_RAGGED, REQUIRED, "fp4", "gather", feature="fp4")
@pytest.mark.parametrize("out", GATHER_OUTS)
@pytest.mark.parametrize("index_dtype,indptr_dtype", RAGGED_DTYPES)
@pytest.mark.parametrize("fmt", FMTS)
def test_gather_ragged(kvx_provider, kvx_call_options, fmt, index_dtype, indptr_dtype, out):
    """An FP4 gather through a RAGGED table (S32 / S64 indices and indptr): per-token block ids,
    ``indptr[0] > 0``, spare ids after each range, an empty sequence and one longer than
    ``max_seq_len``. Refusing RAGGED tables is acceptable while ``ragged`` is not claimed
    (R-REFUSAL); a wrong block is a failure."""
    _need_fp4(kvx_provider)
    opts = kvx_call_options()
    layout = _core(kvx_provider, kvx_call_options)
    seed = 200 + 10 * int(fmt) + 3 * (index_dtype == DType.S64) + (indptr_dtype == DType.S64)
    cache, blocks = _filled_cache(fmt, layout, seed)
    lens, msl = [11, 0, 6, 13], 10
    indices, indptr = _ragged_table(blocks, lens, msl, seed + 1)
    mbps = -(-msl // BS)
    res = fx.run_gather(kvx_provider, cache, indices, lens, msl, out, memory=opts.memory, index_dtype=index_dtype,
                        indptr=indptr, indptr_dtype=indptr_dtype, max_blocks_per_seq=mbps)
    case = _case(fmt, out, layout, seed, f", RAGGED table ({index_dtype.name} indices, {indptr_dtype.name} indptr) "
                                         f"indptr {indptr.tolist()} indices {indices.tolist()} max_blocks_per_seq "
                                         f"{mbps} seq_lens {lens} max_seq_len {msl}")
    _judge_gather(res, cache, indices, lens, msl, out, CL_RAGGED, seed, case, feature=("fp4", "ragged"),
                  indptr=indptr)


S64_CASES = [pytest.param("ids", DType.F32, id="f32"), pytest.param("ids", DType.F16, id="f16"),
             pytest.param("ids", DType.BF16, id="bf16"), pytest.param("ids", DType.F4_E2M1, id="raw"),
             pytest.param("wide_id", DType.F32, id="wide_id-f32"),
             pytest.param("wide_id", DType.F4_E2M1, id="wide_id-raw"),
             pytest.param("wide_negative_id", DType.F32, id="wide_negative_id-f32")]


@conformance("fp4.gather.s64_table", CL_S64, REQUIRED, "fp4", "gather", feature="fp4")
@pytest.mark.parametrize("kind,out", S64_CASES)
@pytest.mark.parametrize("fmt", FMTS)
def test_gather_s64_table(kvx_provider, kvx_call_options, fmt, kind, out):
    """An FP4 gather through a PACKED table of S64 ids. ``ids``: shuffled blocks, with ids whose
    high bits are set (``2^32 + 1``, ``-1``, ``2^40``) in the entries no token uses (never read,
    R-DATA); a provider that reads the table as 32-bit words gathers other blocks.
    ``wide_id`` / ``wide_negative_id``: a used entry ``2^32 + b`` / ``-(2^32) + b`` whose low
    32 bits name a filled block ``b``: out of range like any other id (R-WIDE-IDS), never read
    as ``b``, so a provider that truncates the ids to 32 bits fails (on host memory the status
    is not OK; on DEVICE memory OK only for the valid part, R-DEVICE-STATUS)."""
    _need_fp4(kvx_provider)
    opts = kvx_call_options()
    layout = _core(kvx_provider, kvx_call_options)
    seed = 230 + 10 * int(fmt) + [c.values for c in S64_CASES].index((kind, out))
    cache, blocks = _filled_cache(fmt, layout, seed)
    lens, msl = [11, 7, 14], 12  # 3, 2 and 3 blocks used of 4
    table = np.array([blocks[:3] + [2 ** 32 + 1], blocks[3:5] + [-1, 2 ** 40], blocks[5:8] + [2 ** 32 + 3]],
                     np.int64)
    if kind != "ids":
        table[1, 1] = (2 ** 32 if kind == "wide_id" else -(2 ** 32)) + int(blocks[6])  # used: 7 tokens
    res = fx.run_gather(kvx_provider, cache, table, lens, msl, out, memory=opts.memory, index_dtype=DType.S64)
    case = _case(fmt, out, layout, seed, f", PACKED S64 table {table.tolist()} (num_blocks {NB}) seq_lens {lens} "
                                         f"max_seq_len {msl}")
    if kind == "ids":
        _judge_gather(res, cache, table, lens, msl, out, CL_S64, seed, case)
    else:
        _judge_bad_id(res, opts.memory, cache, table, (1, 1), int(blocks[0]), lens, msl, out, CL_S64, seed, case,
                      f"FP4 gather with the S64 block id {int(table[1, 1])} (low 32 bits {int(blocks[6])})")


#: gaps in the scale pool: (K's, V's) arguments of ``fp4.padded_strides``
SCALE_PATTERNS = {
    # every other byte of a row, then 3 / 5 / 7 bytes after each row / item / block (V: unlike K)
    "gaps": (dict(pads=(7, 5, 3), step=2), dict(pads=(16, 1, 2), step=3)),
    # blocks of a wider pool: dense inside a block, 16 (K) / 40 (V) bytes between blocks
    "block_gaps": (dict(pads=(16, 0, 0)), dict(pads=(40, 0, 0))),
}


def _scale_pool_kw(fmt, layout, pattern) -> dict:
    J = D // fx.block_values(fmt)
    shape = (NB, BS, H, J) if layout == Layout.BLOCK_NHD else (NB, H, BS, J)
    kp, vp = SCALE_PATTERNS[pattern]
    return {"k_scale_strides": fx.padded_strides(shape, **kp), "v_scale_strides": fx.padded_strides(shape, **vp),
            "scale_tail": 5}


def _strides_note(cache) -> str:
    return f", scale pool strides K {cache.scale_strides('k')} V {cache.scale_strides('v')} (gaps hold " \
           f"{fx.GAP_FILL:#04x})"


@conformance("fp4.gather.scale_pool_strides", CL_SCALE_STRIDES, REQUIRED, "fp4", "gather", feature="fp4")
@pytest.mark.parametrize("out", [pytest.param(DType.F32, id="f32"), pytest.param(DType.F4_E2M1, id="raw")])
@pytest.mark.parametrize("pattern", list(SCALE_PATTERNS))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt", FMTS)
def test_gather_scale_pool_strides(kvx_provider, kvx_call_options, fmt, layout, pattern, out):
    """An FP4 gather from a scale pool whose strides leave gaps (K's unlike V's): each scale byte
    is read where its strides put it (spec 4.2), never at its dense offset. Refusing the strides
    is acceptable while ``noncanonical_strides`` is not claimed (R-REFUSAL)."""
    _need_fp4(kvx_provider)
    opts = kvx_call_options()
    seed = 260 + 10 * int(fmt) + 4 * (layout == Layout.BLOCK_HND) + 2 * (pattern == "block_gaps") + (
        out == DType.F4_E2M1)
    cache, blocks = _filled_cache(fmt, layout, seed, **_scale_pool_kw(fmt, layout, pattern))
    table = np.array([blocks[:3], blocks[3:6], blocks[6:8] + [blocks[0]]], np.int32)
    lens, msl = [11, 7, 12], 10
    res = fx.run_gather(kvx_provider, cache, table, lens, msl, out, memory=opts.memory)
    case = _case(fmt, out, layout, seed, f", gather table {table.tolist()} seq_lens {lens} max_seq_len {msl}"
                                         + _strides_note(cache))
    _judge_gather(res, cache, table, lens, msl, out, CL_SCALE_STRIDES, seed, case,
                  feature=("fp4", "noncanonical_strides"))


@conformance("fp4.write.scale_pool_strides", CL_SCALE_STRIDES, REQUIRED, "fp4", "write", feature="fp4")
@pytest.mark.parametrize("io", [pytest.param(DType.F32, id="f32"), pytest.param(DType.F4_E2M1, id="raw")])
@pytest.mark.parametrize("pattern", list(SCALE_PATTERNS))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt", FMTS)
def test_write_scale_pool_strides(kvx_provider, kvx_call_options, fmt, layout, pattern, io):
    """An FP4 write (quantizing from F32, or raw codes and scale bytes) into a scale pool whose
    strides leave gaps: each scale byte lands where its strides put it, beside its codes; the
    gaps and every other byte stay unchanged."""
    _need_fp4(kvx_provider)
    opts = kvx_call_options()
    seed = 320 + 10 * int(fmt) + 4 * (layout == Layout.BLOCK_HND) + 2 * (pattern == "block_gaps") + (
        io == DType.F4_E2M1)
    gk, gv = _g(fmt, seed)
    cache = fx.new_cache(fmt, NB, BS, H, D, layout, k_global=gk, v_global=gv, **_scale_pool_kw(fmt, layout, pattern))
    n = 20
    key, value = _data(seed, n, cache.B)
    slots = np.random.default_rng(seed + 99).permutation(NB * BS)[:n].astype(np.int64)  # scattered blocks
    slots[5] = -1
    raw = io == DType.F4_E2M1
    if raw:
        kc, ks = fx.encode_rows(fmt, key, cache.g_per_head("k"))
        vc, vs = fx.encode_rows(fmt, value, cache.g_per_head("v"))
        res = fx.run_write(kvx_provider, cache, np.ascontiguousarray(kc), np.ascontiguousarray(vc), slots,
                           memory=opts.memory, raw_scales=(np.ascontiguousarray(ks), np.ascontiguousarray(vs)))
    else:
        res = fx.run_write(kvx_provider, cache, key, value, slots, memory=opts.memory)
    case = _case(fmt, io, layout, seed, f", slots {slots.tolist()}" + _strides_note(cache))
    _strided_write_verdict(res, cache, key, value, slots, raw, CL_SCALE_STRIDES, seed, case,
                           "FP4 write into a scale pool with gaps", "scale bytes where the pool's strides put them")


# ----------------------------------------------------------------------------- data tensor strides

CL_DATA_STRIDES = (CL_COMPAT + "; spec 4.2 (\"Implementations MUST honor provided strides\"; a non-contiguous "
                   "stride pattern may be refused, UNSUPPORTED); R-CACHE, R-REFUSAL, R-FP4 (F4_E2M1 data strides "
                   "count elements, i.e. nibbles: byte offset = element offset / 2)")
_NHD, _HND = Layout.BLOCK_NHD, Layout.BLOCK_HND
#: padded FP4 data tensors: (layout, K's pads, V's pads), in elements (nibbles, always even), the
#: ``pads`` of ``fp4.padded_strides`` on the data shape: after each row of D codes, after each item of
#: axis 1 (a token row in NHD, a head in HND), after each block. K's unlike V's.
DATA_PATTERNS = {
    "nhd_token_rows": (_NHD, (0, 32, 0), (0, 12, 0)),  # 16 / 6 bytes after each token's H x D codes
    "nhd_heads": (_NHD, (0, 0, 2), (0, 0, 6)),  # head rows 33 / 35 bytes apart (odd byte strides)
    "nhd_blocks": (_NHD, (48, 0, 0), (200, 0, 0)),  # dense blocks, 24 / 100 bytes between them
    "hnd_padded": (_HND, (16, 8, 4), (2, 24, 10)),  # HND: token rows, heads and blocks all padded
}
#: (pattern, format, IO): every pattern in every format with F16 IO, one F32, raw codes and scales
DATA_CASES = ([(p, f.values[0], DType.F16) for p in DATA_PATTERNS for f in FMTS]
              + [("hnd_padded", Fp4Format.NVFP4, DType.F32)]
              + [("nhd_token_rows", f.values[0], DType.F4_E2M1) for f in FMTS])
DATA_PARAMS = [pytest.param(p, f, io, id=f"{fx.FORMAT_NAMES[f]}-{p}-" + ("raw" if io == DType.F4_E2M1 else
                                                                           io.name.lower()))
               for p, f, io in DATA_CASES]


def _data_strides_kw(pattern) -> dict:
    layout, kp, vp = DATA_PATTERNS[pattern]
    shape = (NB, BS, H, D) if layout == _NHD else (NB, H, BS, D)
    return {"k_data_strides": fx.padded_strides(shape, pads=kp), "v_data_strides": fx.padded_strides(shape, pads=vp),
            "data_tail": 6}


def _data_strides_note(cache) -> str:
    return f", data strides (elements) K {cache.data_strides('k')} V {cache.data_strides('v')} (gaps hold " \
           f"{fx.GAP_FILL:#04x})"


@conformance("fp4.write.data_strides", CL_DATA_STRIDES, REQUIRED, "fp4", "write", feature="fp4")
@pytest.mark.parametrize("pattern,fmt,io", DATA_PARAMS)
def test_write_data_strides(kvx_provider, kvx_call_options, pattern, fmt, io):
    """An FP4 write (quantizing from F16 / F32, or raw codes and scale bytes) into data tensors
    whose token, head or block strides are padded (K's unlike V's): each code byte lands at
    element offset / 2 of its strides, the gap bytes and every other byte stay unchanged. A
    provider that takes the token stride as canonical, or reads the element strides as bytes,
    writes into the gaps. Refusing the strides is acceptable while ``noncanonical_strides`` is
    not claimed (R-REFUSAL)."""
    _need_fp4(kvx_provider)
    opts = kvx_call_options()
    layout = DATA_PATTERNS[pattern][0]
    seed = 400 + DATA_CASES.index((pattern, fmt, io))
    gk, gv = _g(fmt, seed)
    cache = fx.new_cache(fmt, NB, BS, H, D, layout, k_global=gk, v_global=gv, **_data_strides_kw(pattern))
    n = 20
    key, value = _data(seed, n, cache.B)
    slots = np.random.default_rng(seed + 99).permutation(NB * BS)[:n].astype(np.int64)  # scattered blocks
    slots[5] = -1
    raw = io == DType.F4_E2M1
    if raw:
        kc, ks = fx.encode_rows(fmt, key, cache.g_per_head("k"))
        vc, vs = fx.encode_rows(fmt, value, cache.g_per_head("v"))
        res = fx.run_write(kvx_provider, cache, np.ascontiguousarray(kc), np.ascontiguousarray(vc), slots,
                           memory=opts.memory, raw_scales=(np.ascontiguousarray(ks), np.ascontiguousarray(vs)))
    else:
        with np.errstate(over="ignore"):
            key, value = key.astype(fx.IO_NP[io]), value.astype(fx.IO_NP[io])
        res = fx.run_write(kvx_provider, cache, key, value, slots, memory=opts.memory)
        key, value = key.astype(np.float32), value.astype(np.float32)
    case = _case(fmt, io, layout, seed, f", slots {slots.tolist()}" + _data_strides_note(cache))
    _strided_write_verdict(res, cache, key, value, slots, raw, CL_DATA_STRIDES, seed, case,
                           "FP4 write into padded data tensors",
                           "codes at their strides' byte offsets, element offset / 2")


@conformance("fp4.gather.data_strides", CL_DATA_STRIDES, REQUIRED, "fp4", "gather", feature="fp4")
@pytest.mark.parametrize("pattern,fmt,out", DATA_PARAMS)
def test_gather_data_strides(kvx_provider, kvx_call_options, pattern, fmt, out):
    """An FP4 gather (dequantizing into F16 / F32, or raw) from data tensors whose token, head or
    block strides are padded (K's unlike V's), the gaps poisoned (0x5A): each code byte is read
    at element offset / 2 of its strides (spec 4.2), never at its dense offset; the cache, gaps
    included, is an input and stays unchanged. Refusing the strides is acceptable while
    ``noncanonical_strides`` is not claimed (R-REFUSAL)."""
    _need_fp4(kvx_provider)
    opts = kvx_call_options()
    layout = DATA_PATTERNS[pattern][0]
    seed = 440 + DATA_CASES.index((pattern, fmt, out))
    cache, blocks = _filled_cache(fmt, layout, seed, **_data_strides_kw(pattern))
    table = np.array([blocks[:3], blocks[3:6], blocks[6:8] + [blocks[0]]], np.int32)
    lens, msl = [11, 7, 12], 10
    res = fx.run_gather(kvx_provider, cache, table, lens, msl, out, memory=opts.memory)
    case = _case(fmt, out, layout, seed, f", gather table {table.tolist()} seq_lens {lens} max_seq_len {msl}"
                                         + _data_strides_note(cache))
    _judge_gather(res, cache, table, lens, msl, out, CL_DATA_STRIDES, seed, case,
                  feature=("fp4", "noncanonical_strides"))


CL_STRIDED_IO = (CL + "; spec 4.2 (\"Implementations MUST honor provided strides\"), 6.8 (IO tensors: shape and "
                 "strides); R-IO (any non-negative strides, in a write of any size), R-FP4 (the raw transfer's block "
                 "scales, desc.fp4, are IO tensors [num_tokens, H, D/B] of their own strides; F4_E2M1 code strides "
                 "count nibbles); R-REFUSAL")
#: query heads per KV head of the fused QKV rows whose K and V parts ``qkv_view`` inputs are
STRIDED_QKV_GROUP = 4
#: id -> (raw, K's and V's (lead, head_pad, token_pad) of the codes or rows, K's and V's of the scales): the inputs of
#: ``fp4.write.strided_io``, views into larger arrays whose other elements hold random bytes (:func:`_io_view`).
#: ``qkv_view``: F16 rows, the K (V) part of a row of a fused QKV projection ``[tokens][q | k | v]``, as vLLM passes
#: them; ``raw-scale_rows``: dense codes, block scales at a token stride of H * D/B + 12 bytes (a quantizer's
#: padded scale rows); ``raw-padded``: codes and scales with padded heads and token rows, K's unlike V's.
_QKV = STRIDED_QKV_GROUP * H * D
STRIDED_IO = {
    "qkv_view": (False, ((_QKV, 0, H * D), (_QKV + H * D, 0, 0)), None),
    "raw-scale_rows": (True, ((0, 0, 0), (0, 0, 0)), ((0, 0, 12), (0, 0, 12))),
    "raw-padded": (True, ((0, 8, 16), (0, 2, 6)), ((0, 2, 4), (0, 0, 7))),
}
STRIDED_IO_TOKENS = (20, 300)


def _io_view(rng, arr: np.ndarray, lead: int, head_pad: int, token_pad: int) -> np.ndarray:
    """``arr`` ([n, H, W]) as a view into a larger array of random bytes: token rows ``lead + H * (W + head_pad) +
    token_pad`` elements apart, heads ``W + head_pad`` apart, the first at element ``lead`` of its row; the same
    values as ``arr``, read through those strides (or ``arr`` itself where nothing is padded)."""
    if not (lead or head_pad or token_pad):
        return np.ascontiguousarray(arr)
    n, h, w = arr.shape
    hs = w + head_pad
    row = lead + h * hs + token_pad
    buf = rng.integers(0, 256, n * row * arr.itemsize, dtype=np.uint8).view(arr.dtype).reshape(n, row)
    view = buf[:, lead:lead + h * hs].reshape(n, h, hs)[:, :, :w]
    view[...] = arr
    return view


def _io_strides_note(name: str, arr: np.ndarray, nibbles: bool = False) -> str:
    return f"{name} dense" if arr.flags.c_contiguous else f"{name} strides {fx.view_strides(arr, nibbles)}"


@conformance("fp4.write.strided_io", CL_STRIDED_IO, REQUIRED, "fp4", "write", feature="fp4")
@pytest.mark.parametrize("n", [pytest.param(n, id=f"{n}tok") for n in STRIDED_IO_TOKENS])
@pytest.mark.parametrize("kind", list(STRIDED_IO))
@pytest.mark.parametrize("fmt", FMTS)
def test_write_strided_io(kvx_provider, kvx_call_options, fmt, kind, n):
    """An FP4 write whose inputs are strided views: F16 rows that are the K and V parts of a fused QKV projection's
    rows (quantized), or raw codes and block scales (F4_E2M1 IO, ``desc.fp4``) whose token rows and heads are
    padded, the scales alone or both, in a call of 20 tokens and in a prefill of 300 (whole blocks in order, a
    non-negative ``invalid_slot`` on 21 tokens, -1 on 4). Each element is read through its own tensor's strides;
    the elements between them hold random bytes, which a provider that reads an input as dense rows (a batch
    copy of each token's ``H * D/B`` scale bytes from ``token * H * D/B``) stores. The other FP4 writes read dense
    inputs only. Refusing strided inputs is acceptable while ``io_strides`` is not claimed (R-REFUSAL)."""
    _need_fp4(kvx_provider)
    opts = kvx_call_options()
    layout = _core(kvx_provider, kvx_call_options)
    raw, code_pads, scale_pads = STRIDED_IO[kind]
    seed = 560 + 10 * int(fmt) + 2 * list(STRIDED_IO).index(kind) + (n > 50)
    nb = NB if n < 50 else RAW_BATCH_BLOCKS
    gk, gv = _g(fmt, seed)
    cache = fx.new_cache(fmt, nb, BS, H, D, layout, k_global=gk, v_global=gv)
    key, value = _data(seed, n, cache.B)
    value = value * np.float32(37.0)  # V's scales unlike K's
    slots, sentinel = _raw_slot_plan(n, nb, seed + 99)
    rng = np.random.default_rng(seed + 7)
    if raw:
        kc, ks = fx.encode_rows(fmt, key, cache.g_per_head("k"))
        vc, vs = fx.encode_rows(fmt, value, cache.g_per_head("v"))
        kin, vin = (_io_view(rng, c, *p) for c, p in zip((kc, vc), code_pads))
        ksin, vsin = (_io_view(rng, c, *p) for c, p in zip((ks, vs), scale_pads))
        res = fx.run_write(kvx_provider, cache, kin, vin, slots, memory=opts.memory, invalid_slot=sentinel,
                           raw_scales=(ksin, vsin))
        note = ", ".join([_io_strides_note("key codes", kin, True), _io_strides_note("value codes", vin, True),
                          _io_strides_note("key scales", ksin), _io_strides_note("value scales", vsin)])
        io = DType.F4_E2M1
    else:
        with np.errstate(over="ignore"):
            key, value = key.astype(np.float16), value.astype(np.float16)
        kin, vin = (_io_view(rng, x, *p) for x, p in zip((key, value), code_pads))
        res = fx.run_write(kvx_provider, cache, kin, vin, slots, memory=opts.memory, invalid_slot=sentinel)
        key, value = key.astype(np.float32), value.astype(np.float32)
        note = ", ".join([_io_strides_note("key", kin), _io_strides_note("value", vin)]) + \
            f" (views of fused QKV rows, {STRIDED_QKV_GROUP} query heads per KV head)"
        io = DType.F16
    shown = slots.tolist() if n < 50 else f"{slots[:8].tolist()}... ({n} tokens)"
    case = (f"{fx.FORMAT_NAMES[fmt]} cache ({layout.name}) of {nb} blocks, {io.name} IO, H={H} D={D} "
            f"block_size={BS}, {n} tokens, slots {shown}, invalid_slot {sentinel} on tokens "
            f"{np.flatnonzero(slots == sentinel).tolist()}; inputs (elements): {note}; the elements between them hold "
            f"random bytes")
    _strided_write_verdict(res, cache, key, value, slots, raw, CL_STRIDED_IO, seed, case,
                           "FP4 write from strided inputs", "every element read through its input's strides",
                           feature=("fp4", "io_strides"), invalid_slot=sentinel)


CL_GLOBAL_STRIDE = (CL_COMPAT + "; spec 6.6 (scale descriptor: stride[] \"Scale strides\"), 4.2 (\"MUST honor "
                    "provided strides\"); R-FP8, R-FP4 (a PER_HEAD global scale of head h at data[h * stride[0]]: "
                    "a correct result or UNSUPPORTED)")


@conformance("fp4.global_scale_strides", CL_GLOBAL_STRIDE, REQUIRED, "fp4", ("write", "gather"),
             feature="scale_strides")
@pytest.mark.parametrize("op", ["write", "gather"])
def test_global_scale_strides(kvx_provider, kvx_call_options, op):
    """NVFP4 PER_HEAD global scales (K and V) whose values lie 3 elements apart, a negative scale
    between them: a provider that reads them as adjacent encodes or decodes a head with it. The
    reference refuses such descriptors (UNSUPPORTED), which the spec allows."""
    _need_fp4(kvx_provider)
    opts = kvx_call_options()
    fmt, layout, stride = Fp4Format.NVFP4, _core(kvx_provider, kvx_call_options), 3
    seed = 360 + (op == "gather")
    glob = ([np.float32(0.0123), np.float32(0.71)], [np.float32(0.002), np.float32(0.31)])
    feature = ("fp4", "scale_strides")
    note = f", PER_HEAD global scales K {[float(x) for x in glob[0]]} V {[float(x) for x in glob[1]]} " \
           f"with stride[0] {stride}"
    if op == "write":
        cache = replace(fx.new_cache(fmt, NB, BS, H, D, layout, k_global=glob[0], v_global=glob[1]),
                        global_stride=stride)
        key, value = _data(seed, 20, cache.B)
        slots = np.random.default_rng(seed + 99).permutation(NB * BS)[:20].astype(np.int64)
        res = fx.run_write(kvx_provider, cache, key, value, slots, memory=opts.memory)
        case = _case(fmt, DType.F32, layout, seed, note)
        _check_guards(res, CL_GLOBAL_STRIDE, seed, case)
        _refusal_wrote_nothing(res, None, cache, CL_GLOBAL_STRIDE, seed, case)
        _status(res.status, Status.OK, "FP4 write", CL_GLOBAL_STRIDE, seed, case, feature=feature)
        want = fx.expected_write(cache, key, value, slots)
        _fail_if(fx.compatible_write_problems(cache, res.cache, want, key, value, slots),
                 "FP4 write with strided PER_HEAD global scales", "codes and scales for head h's global scale "
                 "data[h * stride[0]] (compatible tier), other rows untouched", CL_GLOBAL_STRIDE, seed, case)
        return
    cache, blocks = _filled_cache(fmt, layout, seed)
    cache = replace(cache, k_global=glob[0], v_global=glob[1], global_stride=stride)
    fx.fill_cache(cache, blocks, *_data(seed, 8 * BS, cache.B))  # encoded with these globals
    table = np.array([blocks[:3], blocks[3:6]], np.int32)
    lens, msl = [11, 7], 10
    res = fx.run_gather(kvx_provider, cache, table, lens, msl, DType.F32, memory=opts.memory)
    case = _case(fmt, DType.F32, layout, seed, note + f", gather table {table.tolist()} seq_lens {lens}")
    _judge_gather(res, cache, table, lens, msl, DType.F32, CL_GLOBAL_STRIDE, seed, case, feature=feature)


CL_THREADS = CL_COMPAT + "; spec 7.2 (thread-safe on disjoint cache regions); R-THREADS"
THREADS = 4


@conformance("concurrency.threads.fp4_write", CL_THREADS, REQUIRED, "fp4", "write", feature="fp4")
@pytest.mark.parametrize("fmt", FMTS)
def test_concurrent_fp4_writes(kvx_provider, kvx_call_options, fmt):
    """4 threads write disjoint slots of ONE shared FP4 cache at once (a barrier right before each
    provider call); the cache must equal the serial result."""
    layout = _core(kvx_provider, kvx_call_options)
    _need_fp4(kvx_provider)
    opts = kvx_call_options()
    for rnd in range(4):
        seed = 190 + 10 * int(fmt) + rnd
        gk, gv = _g(fmt, seed)
        cache = fx.new_cache(fmt, NB, BS, H, D, layout, k_global=gk, v_global=gv)
        n = NB * BS
        key, value = _data(seed, n, cache.B)
        slots = np.random.default_rng(seed + 99).permutation(n).astype(np.int64)  # disjoint by construction
        parts = [(np.ascontiguousarray(key[i]), np.ascontiguousarray(value[i]), slots[i])
                 for i in np.array_split(np.arange(n), THREADS)]
        statuses, res = fx.run_concurrent_writes(kvx_provider, cache, parts, memory=opts.memory)
        case = _case(fmt, DType.F32, layout, seed, f", round {rnd}: {THREADS} threads, disjoint slots")
        for st in statuses:
            if st is None:
                raise ConformanceFailure("a concurrent FP4 write did not return", expected="every call returns",
                                         got="a thread still in the provider", clause=CL_THREADS, case=case,
                                         seed=seed)
            _status(st, Status.OK, "concurrent FP4 write", CL_THREADS, seed, case)
        _check_guards(res, CL_THREADS, seed, case)
        want = fx.expected_write(cache, key, value, slots)
        _fail_if(fx.compatible_write_problems(cache, res.cache, want, key, value, slots),
                 "concurrent FP4 writes of disjoint slots differ from the serial result",
                 "the serial result (compatible tier)", CL_THREADS, seed, case)


#: (num_blocks, block_size, heads, head_dim) of ``fp4.geometries``: every other FP4 test uses 12 blocks of 4
#: tokens, 2 heads of 64 dims (head_dim a multiple of 32, every format's block)
FP4_GEOMS = {"bs16_h4_d128": (24, 16, 4, 128), "bs8_h1_d256": (8, 8, 1, 256), "bs4_h3_d96": (12, 4, 3, 96),
             "bs32_h8_d64": (6, 32, 8, 64), "bs16_h1_d576": (4, 16, 1, 576)}
CL_GEOMS = (CL_COMPAT + "; spec 4.1 (each block holds block_size tokens for all KV heads and head dimensions), 5.2 "
            "(invalid_slot a no-op); R-CACHE, R-WRITE")


@conformance("fp4.geometries", CL_GEOMS, REQUIRED, "fp4", ("write", "gather"), feature="fp4")
@pytest.mark.parametrize("geom", list(FP4_GEOMS))
@pytest.mark.parametrize("op", ["write", "gather"])
@pytest.mark.parametrize("fmt", FMTS)
def test_geometries(kvx_provider, kvx_call_options, fmt, op, geom):
    """A quantizing write of nearly every slot from F16 rows (3 tokens carry a non-negative ``invalid_slot``, one
    -1: no-ops in a write of any size), or a dequantizing gather of every block
    into F16 through two sequences, in caches of other block sizes, head counts and head dims than the
    other FP4 tests' (128, 256, 96 and 576 dims; 1 to 8 heads; blocks of 4 to 32 tokens). A provider
    whose FP4 kernels move a fixed number of dims or heads (a tile of 64) is exact at 2 x 64 and
    leaves the rest of every row unwritten here."""
    _need_fp4(kvx_provider)
    opts = kvx_call_options()
    nb, bs, h, d = FP4_GEOMS[geom]
    layout = _core(kvx_provider, kvx_call_options)
    seed = 240 + 11 * int(fmt) + list(FP4_GEOMS).index(geom)
    gk, gv = _g(fmt, seed, h)
    cache = fx.new_cache(fmt, nb, bs, h, d, layout, k_global=gk, v_global=gv)
    rng = np.random.default_rng(seed)
    n = nb * bs
    key = (rng.standard_normal((n, h, d)) * rng.lognormal(0, 1.5, (1, h, d))).astype(np.float16)
    value = (rng.standard_normal((n, h, d)) * rng.lognormal(0, 1, (n, 1, 1))).astype(np.float16)
    case = f"{fx.FORMAT_NAMES[fmt]} cache ({layout.name}) of {nb} blocks of {bs} tokens, {h} heads x {d} dims, F16 IO"
    if op == "write":  # every slot but two; one of those two the non-negative invalid_slot of 3 tokens
        perm = rng.permutation(n).astype(np.int64)
        slots, sentinel = perm[:n - 2].copy(), int(perm[n - 2])
        slots[3] = -1
        slots[[5, n // 2, n - 3]] = sentinel
        case += f", invalid_slot {sentinel} on 3 tokens, -1 on 1"
        res = fx.run_write(kvx_provider, cache, key[:n - 2], value[:n - 2], slots, memory=opts.memory,
                           invalid_slot=sentinel)
        _status(res.status, Status.OK, "FP4 write", CL_GEOMS, seed, case)
        _check_guards(res, CL_GEOMS, seed, case)
        k32, v32 = key[:n - 2].astype(np.float32), value[:n - 2].astype(np.float32)
        want = fx.expected_write(cache, k32, v32, slots, invalid_slot=sentinel)
        _fail_if(fx.compatible_write_problems(cache, res.cache, want, k32, v32, slots, invalid_slot=sentinel),
                 "FP4 write of this geometry", "every head and dim of every written row within the compatible "
                 "tier; the invalid_slot and -1 tokens no-ops, other rows untouched", CL_GEOMS, seed, case)
        return
    blocks = list(rng.permutation(nb))
    fx.fill_cache(cache, blocks, key.astype(np.float32), value.astype(np.float32))
    half = nb // 2
    table = np.array([blocks[:half], blocks[half:2 * half]], np.int32)
    lens, msl = [half * bs, half * bs - 3], half * bs
    res = fx.run_gather(kvx_provider, cache, table, lens, msl, DType.F16, memory=opts.memory)
    case += f", gather of 2 sequences ({lens} tokens)"
    _status(res.status, Status.OK, "FP4 gather", CL_GEOMS, seed, case)
    _check_guards(res, CL_GEOMS, seed, case)
    with np.errstate(over="ignore", invalid="ignore"):
        want = fx.expected_gather(cache, table, lens, msl, DType.F16, fx.out_init(cache, len(lens) * msl, DType.F16))
    _fail_if(fx.gather_problems(res.out, want, DType.F16, "compatible"), "dequantizing FP4 gather of this geometry",
             "every head and dim within one ulp of the oracle's decode; rows past the length untouched", CL_GEOMS,
             seed, case)


@conformance("concurrency.threads.fp4_gather", CL_THREADS, REQUIRED, "fp4", "gather", feature="fp4")
@pytest.mark.parametrize("fmt", FMTS)
def test_concurrent_fp4_gathers(kvx_provider, kvx_call_options, fmt):
    """4 threads gather at once (a barrier right before each provider call), each from a cache of its
    own (two layers of a model: NVFP4 global scales of their own) into its own F16 outputs, 4 rounds:
    each must equal what the same gather gives alone. A provider that stages a call's global scales or
    tables in memory its calls share decodes one layer with another's scale."""
    import threading

    _need_fp4(kvx_provider)
    opts = kvx_call_options()
    layout = _core(kvx_provider, kvx_call_options)
    calls = []
    for i in range(THREADS):
        seed = 280 + 10 * int(fmt) + i
        gk, gv = _g(fmt, seed)
        if gk is not None:
            gk, gv = np.float32(gk * (1 + 7 * i)), [np.float32(x * (1 + 5 * i)) for x in gv]
        cache = fx.new_cache(fmt, NB, BS, H, D, layout, k_global=gk, v_global=gv)
        blocks = list(np.random.default_rng(seed).permutation(NB)[:8])
        k, v = _data(seed, 8 * BS, cache.B)
        fx.fill_cache(cache, blocks, k, v)
        calls.append((cache, np.array([blocks[:4], blocks[4:8]], np.int32), [16, 13], seed))
    alone = fx.run_gather(kvx_provider, calls[0][0], calls[0][1], calls[0][2], 16, DType.F16, memory=opts.memory)
    case0 = _case(fmt, DType.F16, layout, calls[0][3], ", a gather alone")
    _status(alone.status, Status.OK, "FP4 gather", CL_THREADS, calls[0][3], case0)  # a refusal is the feature's
    for rnd in range(4):
        proxy = BarrierProvider(kvx_provider, threading.Barrier(THREADS))
        results = run_threads([lambda c=c, t=t, n=n: fx.run_gather(proxy, c, t, n, 16, DType.F16, memory=opts.memory)
                               for c, t, n, _ in calls], timeout_s=120)
        for i, (c, table, lens, seed) in enumerate(calls):
            case = _case(fmt, DType.F16, layout, seed, f", round {rnd}: thread {i} of {THREADS}, a cache of its own")
            res = results[i]
            if res is None:
                raise ConformanceFailure("a concurrent FP4 gather did not return", expected="every call returns",
                                         got="a thread still in the provider", clause=CL_THREADS, case=case, seed=seed)
            _status(res.status, Status.OK, "concurrent FP4 gather", CL_THREADS, seed, case)
            _check_guards(res, CL_THREADS, seed, case)
            with np.errstate(over="ignore", invalid="ignore"):
                want = fx.expected_gather(c, table, lens, 16, DType.F16, fx.out_init(c, len(lens) * 16, DType.F16))
            _fail_if(fx.gather_problems(res.out, want, DType.F16, "compatible"),
                     "concurrent FP4 gathers from caches of their own differ from the serial result",
                     "the serial result (compatible tier)", CL_THREADS, seed, case)


# ----------------------------------------------------------------------------- generated FP4 calls

CL_GENERATED = (CL_COMPAT + "; spec 4.1, 5.1, 5.2; R-CACHE, R-WRITE, R-GATHER, R-DATA (hypothesis-generated FP4 "
                "calls of any geometry)")
#: the generated FP4 tests draw a quarter of the run's examples each (25 in a certification run, 3 with --quick)
FP4_SHARE = 4


def _generated(kvx_provider, kvx_run_config, op: str, run) -> None:
    """Draw FP4 calls (``strategies.fp4_plans``) and ``run`` each; a refused draw is not retried by
    hypothesis (a refusal is no counterexample): once every draw is made, the first refusal stands as
    the test's outcome (``unsupported``: acceptable while the features it names are unclaimed, as for
    the explicit tests)."""
    _need_fp4(kvx_provider)
    refused: list[Unsupported] = []

    @strat.hypothesis_settings(kvx_run_config, FP4_SHARE)
    @given(drawn=strat.fp4_plans(op))
    def inner(drawn):
        try:
            run(drawn)
        except Unsupported as e:
            refused.append(e)

    inner()
    if refused:
        raise refused[0]


@conformance("fp4.generated.write", CL_GENERATED, REQUIRED, "fp4", "write", feature="fp4", seeded=True)
def test_generated_write(kvx_provider, kvx_call_options, kvx_run_config):
    """Quantizing writes of 1 to 4096 tokens from F32 / F16 / BF16 rows into caches of any geometry the
    format allows (NHD or HND; blocks of 1 to 128 tokens; 1 to 40 heads of 16 to 576 dims; NVFP4 global
    scales absent, per tensor or per head; S32 / S64 slots, some -1 or a non-negative ``invalid_slot``),
    each held to the compatible tier. The explicit FP4 tests fix most of these; a path taken past one
    of their sizes or in one combination alone is met here."""
    opts = kvx_call_options()

    def run(drawn):
        plan = drawn.case
        cache, k, v, slots, invalid = gfp4.write_case(plan)
        res = fx.run_write(kvx_provider, cache, k, v, slots, memory=opts.memory, invalid_slot=invalid,
                           slot_dtype=plan.slot_dtype)
        case = repr(drawn)
        _status(res.status, Status.OK, "FP4 write", CL_GENERATED, plan.seed, case)
        _check_guards(res, CL_GENERATED, plan.seed, case)
        k32, v32 = k.astype(np.float32), v.astype(np.float32)
        want = fx.expected_write(cache, k32, v32, slots, invalid_slot=invalid)
        _fail_if(fx.compatible_write_problems(cache, res.cache, want, k32, v32, slots, invalid_slot=invalid),
                 "generated FP4 write outside the compatible tier", "scales within one step, codes within one grid "
                 "step of the oracle's, error within 5 %, zero blocks exactly 0; tokens whose slot is -1 or "
                 "invalid_slot and every other row untouched", CL_GENERATED, plan.seed, case)

    _generated(kvx_provider, kvx_run_config, "write", run)


@conformance("fp4.generated.gather", CL_GENERATED, REQUIRED, "fp4", "gather", feature="fp4", seeded=True)
def test_generated_gather(kvx_provider, kvx_call_options, kvx_run_config):
    """Gathers of 1 to 128 sequences (lengths 0 to past ``max_seq_len``) through PACKED or RAGGED tables of
    S32 / S64 ids, from caches of any geometry the format allows, dequantized into F32 / F16 / BF16 (one
    ulp) or copied raw (F4_E2M1: codes and scales, bit for bit)."""
    opts = kvx_call_options()

    def run(drawn):
        plan = drawn.case
        cache, table, lens, msl, indptr, mbps = gfp4.gather_case(plan)
        res = fx.run_gather(kvx_provider, cache, table, lens, msl, plan.io, memory=opts.memory,
                            index_dtype=plan.index_dtype, indptr=indptr, indptr_dtype=plan.index_dtype,
                            max_blocks_per_seq=mbps)
        _judge_gather(res, cache, table, lens, msl, plan.io, CL_GENERATED, plan.seed, repr(drawn),
                      feature=("fp4", "ragged") if indptr is not None else "fp4", indptr=indptr)

    _generated(kvx_provider, kvx_run_config, "gather", run)
