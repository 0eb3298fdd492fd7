"""Hypothesis strategies for KVX cases: valid descriptor sets and single-rule violations.

The structure of a case (geometry, layouts, dtypes, table format, token counts, which
rule to break) is drawn by hypothesis, so a failing example shrinks towards a small,
simple one; the contents (values, slots, table entries) come from the oracle
engineer's seeded generators (``kvx_conformance.cases.generators``) with a drawn seed. Every
strategy yields a :class:`Drawn`, whose ``repr`` is the case's one-line description
and its seed: that is what hypothesis prints as the falsifying example.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, seed as hyp_seed, settings, strategies as st

from ..abi.descriptors import Geometry
from ..abi.header import (
    BASELINE_DTYPES,
    CACHE_DTYPES,
    FP8_DTYPES,
    INDEX_DTYPES,
    DType,
    Fp4Format,
    Layout,
    Memory,
    Status,
    TableFormat,
)
from . import generators as gen
from .generators import fp4 as gfp4


@dataclass(frozen=True)
class Drawn:
    """A drawn case plus how to rebuild it: ``what`` (builder and its knobs) and ``seed``."""

    case: object
    what: str
    seed: int
    rule: str = ""
    status: Status | None = None
    clause: str = ""

    def __repr__(self) -> str:
        head = f"[{self.rule} -> {self.status.name}] " if self.rule else ""
        return f"<{head}{self.what} seed={self.seed}: {self.case.describe()}>"


seeds = st.integers(min_value=0, max_value=2 ** 31 - 1)


def hypothesis_settings(rc, share: int = 1):
    """A decorator giving a generated test the run's hypothesis settings (``rc``: the plugin's
    ``kvx_run_config``): its ``hypothesis_max_examples`` examples (``share`` > 1: that fraction of
    them, at least 3, for the costlier cases), derandomized (fixed seed, no example database) unless
    the run was given ``--kvx-seed``, so two runs of one provider draw the same cases."""
    n = getattr(rc, "hypothesis_max_examples", None) or getattr(rc, "hypothesis_examples", None) or 100
    n = int(n) if share == 1 else max(3, int(n) // share)
    run_seed = getattr(rc, "seed", None)
    s = settings(max_examples=int(n), derandomize=run_seed is None, database=None, deadline=None, print_blob=False,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])

    def apply(fn):
        fn = s(fn)
        return hyp_seed(run_seed)(fn) if run_seed is not None else fn
    return apply


@st.composite
def geometries(draw, pow2_block: bool = False) -> Geometry:
    blocks = (1, 2, 4, 8, 16) if pow2_block else (1, 2, 3, 4, 5, 8, 16)
    return Geometry(
        num_blocks=draw(st.integers(1, 8)),
        block_size=draw(st.sampled_from(blocks)),
        num_kv_heads=draw(st.integers(1, 3)),
        head_dim=draw(st.sampled_from((1, 2, 4, 6, 8, 16, 32))),
    )


#: engine-sized cases (``batch``): at most this many elements in a cache tensor, IO rows or outputs
BATCH_ELEMENTS = 1 << 19
#: ... and at least this many tokens a write (the other generated writes hold at most 24)
BATCH_MIN_TOKENS = 25


@st.composite
def batch_geometries(draw, pow2_block: bool = False) -> Geometry:
    """Engine-sized caches: blocks of 1 to 256 tokens, 1 to 128 heads of 1 to 576 dims (powers of two and
    the head dims of models that are not: 24, 40, 72, 80, 96, 112, 160, 576), at least 64 slots, at most
    ``BATCH_ELEMENTS`` elements a tensor."""
    bs = draw(st.sampled_from((1, 2, 4, 8, 16, 32, 64, 128, 256) if pow2_block
                              else (1, 2, 3, 4, 5, 8, 16, 32, 64, 128, 200, 256)))
    heads = draw(st.sampled_from((1, 2, 3, 4, 5, 8, 12, 16, 32, 40, 64, 96, 128)))
    dim = draw(st.sampled_from((1, 2, 4, 8, 16, 24, 32, 40, 64, 72, 80, 96, 112, 128, 160, 256, 512, 576)))
    least = -(-64 // bs)
    most = max(least, BATCH_ELEMENTS // (heads * dim) // bs)
    return Geometry(num_blocks=draw(st.integers(least, most)), block_size=bs, num_kv_heads=heads, head_dim=dim)


def _profile(core: bool, profile: gen.Profile | None = None) -> gen.Profile:
    if profile is not None:
        return profile
    return gen.CORE if core else gen.FULL


@st.composite
def write_cases(draw, core: bool = False, profile: gen.Profile | None = None, batch: bool = False) -> Drawn:
    """A valid ``kvx_write_kv`` case (``core``: the readings' minimum features only;
    ``profile``: only what it allows, e.g. ``generators.profile_for(features)``; ``batch``: an
    engine-sized one, ``BATCH_MIN_TOKENS`` to 4096 tokens into a :func:`batch_geometries` cache)."""
    prof = _profile(core, profile)
    geom = draw(batch_geometries() if batch else geometries())
    if batch:
        most = min(geom.num_slots + 4, 4096, BATCH_ELEMENTS // (geom.num_kv_heads * geom.head_dim))
        tokens = st.integers(BATCH_MIN_TOKENS, max(BATCH_MIN_TOKENS, most))
    else:
        tokens = st.integers(0, min(geom.num_slots + 4, 24))
    kw = dict(
        geom=geom,
        k_dtype=draw(st.sampled_from(prof.cache_dtypes)),
        k_kind=draw(st.sampled_from(prof.layout_kinds)),
        v_kind=draw(st.sampled_from(prof.layout_kinds)),
        io_kind=draw(st.sampled_from(prof.io_kinds)),
        num_tokens=draw(tokens),
        slot_dtype=draw(st.sampled_from(INDEX_DTYPES)),
        value_mode=draw(st.sampled_from(gen.VALUE_MODES)),
        scales=draw(st.sampled_from(prof.scales)),
    )
    if not prof.mixed_kv:
        kw["v_kind"] = kw["k_kind"]
    if core or not prof.mixed_kv:
        kw["v_dtype"] = kw["k_dtype"]
    if core and profile is None:
        kw["key_dtype"] = kw["value_dtype"] = draw(st.sampled_from(BASELINE_DTYPES))
    elif not prof.mixed_io:
        # IO of the cache's dtype; into an FP8 cache a baseline IO dtype quantizes (feature fp8)
        io = draw(st.sampled_from((kw["k_dtype"],) + (BASELINE_DTYPES if kw["k_dtype"] in FP8_DTYPES else ())))
        kw["key_dtype"] = io
        # a V cache of a dtype of its own (mixed K / V) gets IO of its dtype (gen.random_write_case): K's IO
        # dtype there would be a conversion, or FP8 rows into a 16- / 32-bit cache (not a valid call)
        if "v_dtype" in kw:
            kw["value_dtype"] = io
    seed = draw(seeds)
    with gen.using_profile(prof):
        case = gen.random_write_case(np.random.default_rng(seed), seed=seed, **kw)
    knobs = ", ".join(f"{k}={getattr(v, 'name', v)}" for k, v in kw.items() if k != "geom")
    return Drawn(case, f"random_write_case({geom}, {knobs})", seed)


@st.composite
def gather_cases(draw, core: bool = False, profile: gen.Profile | None = None, batch: bool = False) -> Drawn:
    """A valid ``kvx_gather_kv`` case over PACKED, RAGGED and KV_OFFSETS tables
    (``profile``: only what it allows; ``batch``: an engine-sized one, 5 to 320 sequences of up
    to 256 tokens from a :func:`batch_geometries` cache, at most ``BATCH_ELEMENTS`` output
    elements)."""
    prof = _profile(core, profile)
    fmt = draw(st.sampled_from(prof.formats))
    kvo = fmt == TableFormat.KV_OFFSETS
    geom = draw(batch_geometries(pow2_block=kvo) if batch else geometries(pow2_block=kvo))
    if batch:
        seqs = draw(st.integers(5, 320))
        rows = max(1, BATCH_ELEMENTS // (geom.num_kv_heads * geom.head_dim) // (seqs * 3))  # beams <= 3
        msl = draw(st.integers(1, max(1, min(256, rows))))
    else:
        seqs, msl = draw(st.integers(0, 4)), draw(st.integers(0, 20))
    kw = dict(
        fmt=fmt, geom=geom,
        k_kind=draw(st.sampled_from(prof.layout_kinds)),
        v_kind=draw(st.sampled_from(prof.layout_kinds)),
        io_kind=draw(st.sampled_from(prof.io_kinds)),
        four_d=draw(st.booleans()) if prof.four_d else False,
        seq_count=seqs,
        max_seq_len=msl,
    )
    if not prof.mixed_kv:
        kw["v_kind"] = kw["k_kind"]
    if core and profile is None:
        dt = draw(st.sampled_from(BASELINE_DTYPES))
        kw.update(k_dtype=dt, v_dtype=dt)
    elif profile is not None:
        kw["k_dtype"] = draw(st.sampled_from(prof.cache_dtypes))
        if not prof.mixed_kv:
            kw["v_dtype"] = kw["k_dtype"]
        if not prof.mixed_io:
            kw["out_dtype"] = kw["k_dtype"]
    elif draw(st.booleans()):
        kw["k_dtype"] = draw(st.sampled_from(CACHE_DTYPES))
    if kvo:
        kw["beam_width"] = draw(st.sampled_from((1, 2, 3, 4, 8)))
        kw["secondary"] = draw(st.booleans()) and prof.secondary
    seed = draw(seeds)
    with gen.using_profile(prof):
        case = gen.random_gather_case(np.random.default_rng(seed), seed=seed, **kw)
    knobs = ", ".join(f"{k}={getattr(v, 'name', v)}" for k, v in kw.items() if k != "geom")
    return Drawn(case, f"random_gather_case({geom}, {knobs})", seed)


@st.composite
def validate_cases(draw, profile: gen.Profile | None = None) -> Drawn:
    """A valid ``kvx_validate_cache_desc`` case over every layout and dtype (``profile``:
    only what it allows)."""
    prof = profile or gen.FULL
    geom = draw(geometries())
    kw = dict(
        geom=geom,
        k_dtype=draw(st.sampled_from(prof.cache_dtypes)),
        v_dtype=draw(st.sampled_from(prof.cache_dtypes)),
        k_kind=draw(st.sampled_from(prof.layout_kinds)),
        v_kind=draw(st.sampled_from(prof.layout_kinds)),
    )
    if not prof.mixed_kv:
        kw["v_dtype"], kw["v_kind"] = kw["k_dtype"], kw["k_kind"]
    seed = draw(seeds)
    with gen.using_profile(prof):
        case = gen.random_validate_case(np.random.default_rng(seed), seed=seed, **kw)
    knobs = ", ".join(f"{k}={getattr(v, 'name', v)}" for k, v in kw.items() if k != "geom")
    return Drawn(case, f"random_validate_case({geom}, {knobs})", seed)


def rules_where(pred) -> list[str]:
    return [r for r, rc in gen.RULES.items() if pred(r, rc)]


#: Rules whose status is required (INVALID_ARGUMENT of R-ORDER steps 1-3, negative lengths).
REQUIRED_RULES = rules_where(lambda r, rc: rc.status == Status.INVALID_ARGUMENT
                             and not r.startswith("R-DATA.ragged_indptr"))
#: Data-dependent rules whose status is recommended (OUT_OF_RANGE, malformed RAGGED indptr contents).
DATA_RULES = rules_where(lambda r, rc: rc.status == Status.OUT_OF_RANGE or r.startswith("R-DATA.ragged_indptr"))


def rule_case(rule: str, seed: int, profile=None, memory: Memory = Memory.HOST):
    """``generators.random_invalid_case`` of ``rule`` from ``seed``, drawn from ``profile`` (a
    ``served.rule_profile``; None: the catalog's ``CORE``). A rule that needs what the narrower profile
    lacks (K and V of two dtypes) is not broken by its draw; the oracle says so, and the ``CORE``
    draw stands."""
    from .. import reference_impl
    from .checks import away_from_run_memory

    if profile is not None:
        w = gen.random_invalid_case(np.random.default_rng(seed), rule, seed=seed, profile=profile)
        if int(reference_impl.expected(away_from_run_memory(w.case, memory), memory).status) == int(w.status):
            return w
    return gen.random_invalid_case(np.random.default_rng(seed), rule, seed=seed)


@st.composite
def violations(draw, rules: list[str] | None = None, profile=None) -> Drawn:
    """A case breaking exactly one rule of ``rules`` (default: every rule of the catalog), built
    from ``profile`` where it can break the rule (``rule_case``; default: the generators' ``CORE``)."""
    rule = draw(st.sampled_from(rules or list(gen.RULES)))
    seed = draw(seeds)
    v = rule_case(rule, seed, profile)
    return Drawn(v.case, f"random_invalid_case(rule={rule!r})", seed, rule=rule, status=v.status, clause=v.clause)


#: generated FP4 calls: at most this many values in a cache side or in a call's rows
FP4_ELEMENTS = 1 << 18


@st.composite
def fp4_plans(draw, op: str) -> Drawn:
    """A valid KVX 1.2 FP4 call (``op`` "write" or "gather", :class:`generators.fp4.Fp4Plan`) of any
    geometry: every format, NHD or HND, blocks of 1 to 128 tokens, 1 to 40 heads, head dims that are
    multiples of the format's block (16 or 32) up to 576, F32 / F16 / BF16 IO (gathers: raw F4_E2M1
    too), NVFP4 global scales absent, per tensor or per head; writes of 1 to 4096 tokens (some -1 or
    a non-negative ``invalid_slot``), gathers of 1 to 128 sequences through PACKED or RAGGED tables."""
    fmt = draw(st.sampled_from((Fp4Format.NVFP4, Fp4Format.MXFP4, Fp4Format.MXFP4_OCP)))
    B = 32 if fmt == Fp4Format.MXFP4_OCP else 16
    heads = draw(st.sampled_from((1, 2, 3, 4, 5, 8, 12, 16, 32, 40)))
    dim = draw(st.sampled_from([d for d in (16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256, 576) if d % B == 0]))
    bs = draw(st.sampled_from((1, 2, 3, 4, 5, 8, 16, 32, 64, 128)))
    row = heads * dim
    least = -(-64 // bs)
    nb = draw(st.integers(least, max(least, FP4_ELEMENTS // row // bs)))
    kw = dict(op=op, fmt=fmt, layout=draw(st.sampled_from((Layout.BLOCK_NHD, Layout.BLOCK_HND))), num_blocks=nb,
              block_size=bs, heads=heads, head_dim=dim, seed=draw(seeds))
    if fmt == Fp4Format.NVFP4:
        kw.update(k_global=draw(st.sampled_from(gfp4.GLOBAL_KINDS)), v_global=draw(st.sampled_from(gfp4.GLOBAL_KINDS)))
    if op == "write":
        kw.update(io=draw(st.sampled_from((DType.F32, DType.F16, DType.BF16))),
                  tokens=draw(st.integers(1, max(1, min(nb * bs, 4096, FP4_ELEMENTS // row)))),
                  slot_dtype=draw(st.sampled_from(INDEX_DTYPES)), sentinel=draw(st.booleans()))
    else:
        seqs = draw(st.integers(1, 128))
        kw.update(io=draw(st.sampled_from((DType.F32, DType.F16, DType.BF16, DType.F4_E2M1))),
                  table=draw(st.sampled_from(("packed", "ragged"))), index_dtype=draw(st.sampled_from(INDEX_DTYPES)),
                  seqs=seqs, max_seq_len=draw(st.integers(1, max(1, min(256, FP4_ELEMENTS // row // seqs)))))
    plan = gfp4.Fp4Plan(**kw)
    knobs = ", ".join(f"{k}={getattr(v, 'name', v)}" for k, v in kw.items())
    return Drawn(plan, f"Fp4Plan({knobs})", plan.seed)
