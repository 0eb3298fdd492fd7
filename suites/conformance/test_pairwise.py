"""All-pairs designs of engine-sized calls (profile "generated"; ``kvx_conformance.cases.pairwise``).

Every value pair of every two axes of a call (K and V layouts and dtypes, IO or output dtype, IO
strides, 4-D outputs, scale kinds, table format, index and length widths, slot width, value
patterns, misalignment), over what the provider serves or claims, meets in at least one call of
engine size: writes of 260 tokens and more, gathers of 260 sequences. A provider whose path for one
pair is broken past the sizes of the explicit tests (an HND BF16 cache converted from F32 rows, a
misaligned HND cache, a KV_OFFSETS gather from FP8 pools) certified with every one of them passing.

Each row is checked against the oracle like the explicit tests (status, guards, bit-exact memory).
A failure names the row (its knobs and seed; ``pairwise.build`` rebuilds it) and stops the test.
A refusal is excused by the row's own optional features while they are unclaimed (R-REFUSAL), and
the row is left (as a refused example of the generated tests is): the axes hold only what the provider
served in a probe call or claims, but a provider may refuse a combination of two served features (the
reference refuses 4-D outputs with non-dense strides). The test reads ``unsupported`` only when every
row is refused.
"""
from __future__ import annotations

from kvx_conformance.cases import build as cb, generators as gen, pairwise
from kvx_conformance.cases.checks import refusable_features, verify_gather, verify_write
from kvx_conformance.results.outcomes import REQUIRED, ConformanceFailure, Unsupported, conformance

CL = ("spec 4-7 (every pair of a call's parameters, at engine size); R-CACHE, R-IO, R-WRITE, R-GATHER, R-DATA, "
      "R-WIDE-IDS, R-CONVERT, R-FP8, R-REFUSAL")


def _run(provider, call_options, claims, features, op: str) -> None:
    prof = gen.profile_for(features)
    core = cb.core_layout(provider, call_options().memory)
    verify = verify_write if op == "write" else verify_gather
    refused, rows = [], pairwise.design(op, prof, features)
    for row in rows:
        case, misalign = pairwise.build(row, prof), pairwise.misalign_of(row)
        opts = call_options(misalign=misalign)
        # the case names its own optional features; misalignment is the call's, not the case's
        feats = tuple(dict.fromkeys(refusable_features(case, core=core) + (("misaligned",) if misalign else ())))
        try:
            verify(provider, case, opts, clause=CL, feature=feats or None)
        except Unsupported as e:
            if not any(f not in claims for f in feats):
                raise ConformanceFailure(f"{row.describe()}: refused although every optional feature it uses is claimed",
                                         expected="a correct result", got=f"{e.refused_with} ({e})", clause=CL,
                                         case=row.describe(), seed=row.seed) from None
            refused.append(row)
        except ConformanceFailure as e:
            raise ConformanceFailure(e.what, expected=e.expected, got=e.got, clause=e.clause,
                                     case=f"{row.describe()}; {e.case}", seed=row.seed) from None
    if refused and len(refused) == len(rows):  # nothing served: the test says which features were refused
        raise Unsupported(f"every row refused, first {refused[0].describe()}",
                          feature=refusable_features(pairwise.build(refused[0], prof), core=core) or None)


@conformance("pairwise.write", CL, REQUIRED, "generated", "write", seeded=True)
def test_pairwise_write(kvx_provider, kvx_call_options, kvx_claims, kvx_generator_features):
    """Writes of 260 tokens and more, one per row of an all-pairs design over K / V layouts and dtypes, IO
    dtypes and strides, scale kinds, slot widths, value patterns and misalignment."""
    _run(kvx_provider, kvx_call_options, kvx_claims, kvx_generator_features, "write")


@conformance("pairwise.gather", CL, REQUIRED, "generated", "gather", seeded=True)
def test_pairwise_gather(kvx_provider, kvx_call_options, kvx_claims, kvx_generator_features):
    """Gathers of 260 sequences, one per row of an all-pairs design over table formats, K / V layouts and
    dtypes, output dtypes, strides and 4-D outputs, id and length widths and misalignment."""
    _run(kvx_provider, kvx_call_options, kvx_claims, kvx_generator_features, "gather")
