"""Differential checks (profile "generated"): the provider against the bundled reference
provider and the numpy oracle on the same randomized valid calls, on the run's memory type.

The bundled reference serves HOST memory with its host backend and DEVICE / UNIFIED
memory with its CUDA backend (where it was built with CUDA). Each case runs three
ways: through the provider under test, through the bundled reference in the same
worker and on the same memory type, and through the oracle. The reference must agree
with the oracle (a harness fault otherwise, reported as an error, never blamed on the
provider), and the provider must match both bit for bit, status included, without
touching a guard byte. Cases come from ``kvx_conformance.cases.generators`` with fixed seeds
(``SEEDS``), over the layouts, dtypes and table formats the provider may be asked for:
required features, plus each optional feature the vendor claims or the provider served in
its probe call (``kvx_conformance.cases.served``, fixture ``kvx_generator_features``). A refusal
(UNSUPPORTED, or INVALID_ARGUMENT for these valid calls: spec 8) must write nothing and is
excused when the case uses an optional feature the vendor does not claim
(``checks.refusable_features``).

Repro of one case: the failure message names the generator call and its seed.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvx_conformance.abi.header import Status
from kvx_conformance.abi.loader import status_name
from kvx_conformance.cases import build as cb, generators
from kvx_conformance.cases.checks import array_mismatches, check_guards, refusable_features, untouched
from kvx_conformance.cases.execute import run_gather, run_write
from kvx_conformance.reference_impl import expected
from kvx_conformance.results.outcomes import REQUIRED, ConformanceFailure, Unsupported, conformance, note_served_call

CL_DIFF = "spec 4-7 (valid calls); R-WRITE, R-GATHER, R-CONVERT, R-FP8, R-DATA"
#: cases per operation; seeds are fixed so two runs draw the same cases
SEEDS = range(7000, 7048)
GEN = {"write": generators.random_write_case, "gather": generators.random_gather_case}
RUN = {"write": run_write, "gather": run_gather}


@pytest.fixture(scope="module")
def bundled_reference():
    """The bundled reference provider when it serves the run's memory type here, else None
    (the provider is then held against the oracle alone, as everywhere else)."""
    from kvx_conformance.abi.loader import load_provider
    from kvx_conformance.abi.native import NativeBuildMissing, reference_provider

    try:
        path = reference_provider()
    except NativeBuildMissing:
        return None
    return load_provider(path) if path.exists() else None


def _differential(op: str, provider, reference, opts, claims, features) -> None:
    ran, excused, reference_used = 0, [], False
    profile = generators.profile_for(features)
    core = cb.core_layout(provider, opts.memory)
    for seed in SEEDS:
        with generators.using_profile(profile):
            case = GEN[op](np.random.default_rng(seed), seed=seed)
        where = f"generators.random_{op}_case(np.random.default_rng({seed}), seed={seed}): {case.describe()}"
        exp = expected(case)
        if exp.status != Status.OK:
            raise RuntimeError(f"harness fault: the generator drew an invalid case ({exp.rule}) at {where}")
        want = exp
        if reference is not None:
            ref = RUN[op](reference, case, opts)
            if ref.status == Status.OK:
                bad = array_mismatches(ref, exp, case)
                if bad or ref.guard_violations:
                    raise RuntimeError(f"harness fault: the bundled reference disagrees with the oracle at {where}: "
                                       + "; ".join(bad + ref.guard_violations))
                reference_used = True
        got = RUN[op](provider, case, opts)
        feats = refusable_features(case, core=core)
        if got.status in (Status.UNSUPPORTED, Status.INVALID_ARGUMENT) and feats:
            # a refusal (spec 8): nothing written, excused by an unclaimed optional feature
            check_guards(got, clause=CL_DIFF, case=case)
            wrote = array_mismatches(got, untouched(case), case)
            if wrote:
                raise ConformanceFailure(f"{op}: the provider answered {status_name(got.status)} but modified memory",
                                         expected="nothing written", got="\n            ".join(wrote),
                                         clause=CL_DIFF, case=where, seed=seed)
            unclaimed = [f for f in feats if f not in claims]
            if unclaimed:
                excused.append(unclaimed[0])
                continue
            raise ConformanceFailure(
                f"{op}: {status_name(got.status)} for a valid case whose every optional feature is claimed",
                expected="OK and the reference's memory", got=status_name(got.status), clause=CL_DIFF, case=where,
                seed=seed)
        if got.status == Status.INVALID_ARGUMENT and case.num_tokens == 0:
            # a zero-token call is a no-op only at the recommended level (R-WRITE, R-GATHER)
            check_guards(got, clause=CL_DIFF, case=case)
            wrote = array_mismatches(got, untouched(case), case)
            if wrote:
                raise ConformanceFailure(f"{op}: INVALID_ARGUMENT for a zero-token call but memory changed",
                                         expected="nothing written", got="\n            ".join(wrote),
                                         clause=CL_DIFF, case=where, seed=seed)
            continue
        if got.status != Status.OK:
            raise ConformanceFailure(f"{op}: a valid call failed", expected="OK",
                                     got=status_name(got.status), clause=CL_DIFF, case=where, seed=seed)
        check_guards(got, clause=CL_DIFF, case=case)
        bad = array_mismatches(got, want, case)
        if bad:
            against = "the bundled reference provider and the oracle" if reference_used else "the oracle"
            raise ConformanceFailure(
                f"{op}: memory after the call differs from {against}",
                expected="bit-exact equality", got="\n            ".join(bad), clause=CL_DIFF, case=where, seed=seed)
        note_served_call()
        ran += 1
    if ran == 0:
        raise Unsupported(f"{op}: every one of {len(SEEDS)} differential cases was refused "
                          f"(unclaimed: {', '.join(sorted(set(excused)))})", tuple(sorted(set(excused))))


@conformance("differential.reference.write", CL_DIFF, REQUIRED, "generated", "write")
def test_differential_write(kvx_provider, bundled_reference, kvx_call_options, kvx_claims, kvx_generator_features):
    """48 random valid writes: provider == bundled reference == oracle, bit for bit."""
    _differential("write", kvx_provider, bundled_reference, kvx_call_options(), kvx_claims, kvx_generator_features)


@conformance("differential.reference.gather", CL_DIFF, REQUIRED, "generated", "gather")
def test_differential_gather(kvx_provider, bundled_reference, kvx_call_options, kvx_claims,
                             kvx_generator_features):
    """48 random valid gathers over PACKED, RAGGED and KV_OFFSETS tables: provider == bundled
    reference == oracle, bit for bit."""
    _differential("gather", kvx_provider, bundled_reference, kvx_call_options(), kvx_claims,
                  kvx_generator_features)
