"""Generated cases (profile "generated"): hypothesis draws valid descriptor sets and
single-rule violations (``kvx_conformance.cases.strategies``), each checked against the oracle
like the explicit tests (status, guards, bit-exact memory).

Budget: ``max_examples`` per test is the run's ``kvx_run_config.hypothesis_max_examples``:
100 in a certification run and 10 with ``--quick`` (the plugin's defaults), or what
``--kvx-hypothesis-examples`` says. Examples are derandomized (fixed seed, no example
database) unless the run was given ``--kvx-seed``, so two runs of one provider draw the
same cases. A failure prints the falsifying example: the builder, its knobs and the
seed that rebuild the case (``kvx_conformance.cases.generators``).

These are required tests, and a required test uses required features only: the valid
cases draw an optional feature (``outcomes.OPTIONAL_FEATURES``) only where the vendor
claims it or the provider served it in a probe call (``kvx_conformance.cases.served``, fixture
``kvx_generator_features``); ``generated.core.*`` draw required features alone. A refusal
(UNSUPPORTED, or INVALID_ARGUMENT for a valid call: spec 8) of a case that uses an optional
feature the vendor does not claim is never a failure (``checks.refusable_features``).
Single-rule violations may combine features: the descriptor rules come before any refusal
(R-ORDER), so their status does not depend on what the provider serves.
"""
from __future__ import annotations

from hypothesis import given

from kvx_conformance.abi.header import Status
from kvx_conformance.cases import build as cb, generators as gen, served, strategies as strat
from kvx_conformance.cases.checks import (
    partial_gather,
    partial_write,
    refusable_features,
    verify_gather,
    verify_validate,
    verify_write,
)
from kvx_conformance.results.outcomes import RECOMMENDED, REQUIRED, ConformanceFailure, Unsupported, conformance

CL_VALID = "spec 4-7 (hypothesis-generated valid calls); R-CACHE, R-IO, R-WRITE, R-GATHER, R-CONVERT, R-FP8"
CL_INVALID = "spec 6, 7.1 (hypothesis-generated single-rule violations)"


def _check(drawn: strat.Drawn, claims, run, core: str | None = None) -> None:
    """Run one drawn case; a refusal is excused by an unclaimed optional feature of the case
    (the provider's ``core`` layout is required of it, not optional)."""
    feats = refusable_features(drawn.case, core=core)
    try:
        run(feats or None)
    except Unsupported as e:
        if not any(f not in claims for f in feats):
            raise ConformanceFailure(
                "a generated case refused although every optional feature it uses is claimed",
                expected="a correct result", got=f"{e.refused_with} ({e})", clause=CL_VALID, case=repr(drawn),
                seed=drawn.seed) from None
    except ConformanceFailure as e:
        raise ConformanceFailure(e.what, expected=e.expected, got=e.got, clause=e.clause, case=repr(drawn),
                                 seed=drawn.seed) from None


def _zero_tokens(case) -> bool:
    return getattr(case, "num_tokens", None) == 0


def _call(provider, drawn: strat.Drawn, opts, *, clause, feature, **kw):
    case = drawn.case
    if hasattr(case, "slots"):
        if drawn.status is not None and drawn.status != Status.OK:
            kw.setdefault("partial", partial_write(case))
        return verify_write(provider, case, opts, clause=clause, feature=feature, **kw)
    if hasattr(case, "table"):
        if drawn.status is not None and drawn.status != Status.OK:
            kw.setdefault("partial", partial_gather(case))
        return verify_gather(provider, case, opts, clause=clause, feature=feature, **kw)
    return verify_validate(provider, case, opts, clause=clause, feature=feature, **kw)


def _valid_test(strategy, provider, opts, rc, claims, share: int = 1):
    core = cb.core_layout(provider, opts.memory)

    @strat.hypothesis_settings(rc, share)
    @given(drawn=strategy)
    def inner(drawn):
        # a zero-token call is a no-op only at the recommended level (R-WRITE, R-GATHER):
        # these required tests accept INVALID_ARGUMENT for it, with nothing written
        kw = {"statuses": (Status.OK, Status.INVALID_ARGUMENT)} if _zero_tokens(drawn.case) else {}
        _check(drawn, claims, lambda f: _call(provider, drawn, opts, clause=CL_VALID, feature=f, expect=Status.OK,
                                              **kw), core)

    inner()


@conformance("generated.valid.validate", CL_VALID, REQUIRED, "generated", "validate", seeded=True)
def test_generated_validate(kvx_provider, kvx_call_options, kvx_run_config, kvx_claims, kvx_generator_features):
    prof = gen.profile_for(kvx_generator_features)
    _valid_test(strat.validate_cases(profile=prof), kvx_provider, kvx_call_options(), kvx_run_config, kvx_claims)


@conformance("generated.valid.write", CL_VALID, REQUIRED, "generated", "write", seeded=True)
def test_generated_write(kvx_provider, kvx_call_options, kvx_run_config, kvx_claims, kvx_generator_features):
    prof = gen.profile_for(kvx_generator_features)
    _valid_test(strat.write_cases(profile=prof), kvx_provider, kvx_call_options(), kvx_run_config, kvx_claims)


@conformance("generated.valid.gather", CL_VALID, REQUIRED, "generated", "gather", seeded=True)
def test_generated_gather(kvx_provider, kvx_call_options, kvx_run_config, kvx_claims, kvx_generator_features):
    prof = gen.profile_for(kvx_generator_features)
    _valid_test(strat.gather_cases(profile=prof), kvx_provider, kvx_call_options(), kvx_run_config, kvx_claims)


CL_BATCH = CL_VALID + " - engine-sized: writes of 25 to 4096 tokens, gathers of 5 to 320 sequences"
#: the engine-sized tests draw half the run's examples (50 in a certification run, 5 with --quick)
BATCH_SHARE = 2


@conformance("generated.batch.write", CL_BATCH, REQUIRED, "generated", "write", seeded=True)
def test_generated_batch_write(kvx_provider, kvx_call_options, kvx_run_config, kvx_claims, kvx_generator_features):
    """``generated.valid.write`` at engine size: 25 to 4096 tokens into caches of 64 slots or more, blocks of
    1 to 256 tokens, 1 to 128 heads of 1 to 576 dims, in every layout, dtype and scale kind the provider
    serves. Every explicit test of an optional feature writes a few tokens, and the other generated
    writes at most 24: a path taken past some size in one layout or dtype alone is met here."""
    prof = gen.profile_for(kvx_generator_features)
    _valid_test(strat.write_cases(profile=prof, batch=True), kvx_provider, kvx_call_options(), kvx_run_config,
                kvx_claims, BATCH_SHARE)


@conformance("generated.batch.gather", CL_BATCH, REQUIRED, "generated", "gather", seeded=True)
def test_generated_batch_gather(kvx_provider, kvx_call_options, kvx_run_config, kvx_claims, kvx_generator_features):
    """``generated.valid.gather`` at engine size: 5 to 320 sequences of up to 256 tokens through PACKED,
    RAGGED and KV_OFFSETS tables (beams, secondary pools) of every layout and dtype the provider serves."""
    prof = gen.profile_for(kvx_generator_features)
    _valid_test(strat.gather_cases(profile=prof, batch=True), kvx_provider, kvx_call_options(), kvx_run_config,
                kvx_claims, BATCH_SHARE)


def _required_profile(provider, opts):
    return gen.profile_for(served.required_only(provider, opts.memory))


@conformance("generated.core.write", CL_VALID + " (core features only)", REQUIRED, "generated", "write", seeded=True)
def test_generated_core_write(kvx_provider, kvx_call_options, kvx_run_config, kvx_claims):
    opts = kvx_call_options()
    _valid_test(strat.write_cases(profile=_required_profile(kvx_provider, opts)), kvx_provider, opts,
                kvx_run_config, kvx_claims)


@conformance("generated.core.gather", CL_VALID + " (core features only)", REQUIRED, "generated", "gather", seeded=True)
def test_generated_core_gather(kvx_provider, kvx_call_options, kvx_run_config, kvx_claims):
    opts = kvx_call_options()
    _valid_test(strat.gather_cases(profile=_required_profile(kvx_provider, opts)), kvx_provider, opts,
                kvx_run_config, kvx_claims)


@conformance("generated.invalid.descriptor", CL_INVALID + "; R-SIZE, R-CACHE, R-IO, R-WRITE, R-GATHER", REQUIRED,
             "generated", ("validate", "write", "gather"), seeded=True)
def test_generated_invalid(kvx_provider, kvx_call_options, kvx_run_config, kvx_claims):
    opts = kvx_call_options()
    core = cb.core_layout(kvx_provider, opts.memory)
    # drawn in the layouts the provider serves or claims: a refusal of another layout, often the
    # INVALID_ARGUMENT the rule expects, would pass without reaching the rule (R-REFUSAL)
    profile = served.rule_profile(kvx_provider, opts.memory, kvx_claims)

    @strat.hypothesis_settings(kvx_run_config)
    @given(drawn=strat.violations(strat.REQUIRED_RULES, profile))
    def inner(drawn):
        clause = f"{drawn.clause} (rule {drawn.rule})"
        _check(drawn, kvx_claims, lambda f: _call(kvx_provider, drawn, opts, clause=clause, feature=f,
                                                   expect=drawn.status), core)

    inner()


@conformance("generated.invalid.data", CL_INVALID + "; R-DATA, R-WRITE (data-dependent: OUT_OF_RANGE or "
             "INVALID_ARGUMENT, never out of bounds)", RECOMMENDED, "generated", ("write", "gather"), seeded=True)
def test_generated_data_errors(kvx_provider, kvx_call_options, kvx_run_config, kvx_claims):
    opts = kvx_call_options()
    # drawn in the layouts the provider serves or claims (as above); a refusal of one that is not its
    # core layout is still excused
    core = cb.core_layout(kvx_provider, opts.memory)
    profile = served.rule_profile(kvx_provider, opts.memory, kvx_claims)

    @strat.hypothesis_settings(kvx_run_config)
    @given(drawn=strat.violations(strat.DATA_RULES, profile))
    def inner(drawn):
        clause = f"{drawn.clause} (rule {drawn.rule})"
        _check(drawn, kvx_claims, lambda f: _call(
            kvx_provider, drawn, opts, clause=clause, feature=f, expect=drawn.status,
            statuses=(Status.OUT_OF_RANGE, Status.INVALID_ARGUMENT)), core)

    inner()
