"""Comparison helpers of the conformance suites: every one raises ConformanceFailure.

A check never decides what is right: the numpy oracle
(``kvx_conformance.reference_impl``) does. The helpers here compare what a provider
did (a :class:`~kvx_conformance.cases.case.Result` from :mod:`kvx_conformance.cases.execute`)
with what the oracle says, and say precisely where they differ:

- :func:`check_status`: the status against the set of acceptable statuses;
- :func:`check_guards`: no byte outside the buffers changed, and no input the call may
  only read (:func:`check_inputs`: IO of a write, slots, scales, tables, lengths, the cache
  of a gather) changed;
- :func:`check_arrays`: bit-exact memory after the call; the first differing elements
  are named as (block, token, head, dim) for a cache and (row, head, dim) for a gather
  output, with expected and got values. One exception (docs/numerics.md): an element
  a conversion produced (IO dtype other than the cache dtype) that the oracle holds as
  a NaN may hold any NaN, either sign, any payload (the spec pins no NaN encoding);
  plain copies stay bit-exact, NaN payloads included;
- :func:`verify_validate` / :func:`verify_write` / :func:`verify_gather`: run one case
  on the provider and on the oracle and apply all of the above, turning an
  UNSUPPORTED answer for an optional feature into :class:`Unsupported`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ..abi.descriptors import IOLayout, TensorLayout
from ..abi.dtypes import bits_view
from ..abi.header import Layout, Memory, Status
from ..abi.loader import status_name
from . import execute
from .build import case_features
from .case import GatherCase, Result, ValidateCase, WriteCase
from .failures import ConformanceFailure, Unsupported, note_served_call

#: Statuses a data-dependent error may come back as on DEVICE memory (R-DEVICE-STATUS).
DATA_DEPENDENT = (Status.OUT_OF_RANGE, Status.INVALID_ARGUMENT)

MAX_REPORTED = 6


def statuses_text(statuses: Iterable[int]) -> str:
    return " or ".join(status_name(int(s)) for s in statuses)


def _case_text(case) -> str:
    return case.describe() if hasattr(case, "describe") else str(case)


def _seed(case) -> int | None:
    return getattr(case, "seed", None)


# ---------------------------------------------------------------------------- status


def check_status(got: int, acceptable: int | Iterable[int], *, clause: str, case=None, what: str = "status") -> None:
    """``got`` must be one of ``acceptable``."""
    allowed = {int(acceptable)} if isinstance(acceptable, (int, Status)) else {int(s) for s in acceptable}
    if int(got) not in allowed:
        raise ConformanceFailure(
            f"unexpected {what}",
            expected=statuses_text(sorted(allowed)),
            got=status_name(int(got)),
            clause=clause,
            case=_case_text(case) if case is not None else "",
            seed=_seed(case),
        )


# ---------------------------------------------------------------------------- guards


#: the clause of a changed input, whatever the test's own clause
CL_INPUTS = "spec 7.2 (callers own the buffers; kvx_abi.h declares the inputs const); R-INPUTS"


def check_inputs(result: Result, *, case=None) -> None:
    """Every buffer the call may only read holds what it held before the call (R-INPUTS)."""
    changes = getattr(result, "input_changes", None)
    if changes:
        raise ConformanceFailure(
            "the provider modified an input it may only read",
            expected="every input buffer unchanged by the call",
            got="; ".join(changes),
            clause=CL_INPUTS,
            case=_case_text(case) if case is not None else "",
            seed=_seed(case),
        )


def check_guards(result: Result, *, clause: str, case=None) -> None:
    """No guard byte around any buffer changed, and no read-only input changed (check_inputs)."""
    check_inputs(result, case=case)
    if result.guard_violations:
        raise ConformanceFailure(
            "memory outside the described tensors was modified",
            expected="no byte outside the described elements changes",
            got="; ".join(result.guard_violations),
            clause=clause,
            case=_case_text(case) if case is not None else "",
            seed=_seed(case),
        )


# ---------------------------------------------------------------------------- arrays


def _cache_offsets(t: TensorLayout, geom) -> np.ndarray:
    """Storage offset of every logical element [block, token, head, dim] (R-CACHE addressing)."""
    from ..reference_impl.addressing import cache_offsets

    pack = int(t.shape[4]) if t.layout == Layout.BLOCK_HND_PACKED and len(t.shape) > 4 else 1
    b, tok, h, d = np.indices((geom.num_blocks, geom.block_size, geom.num_kv_heads, geom.head_dim), dtype=np.int64)
    return cache_offsets(t.layout, tuple(t.stride), pack, b, tok, h, d) + t.origin


def _io_offsets(io: IOLayout) -> np.ndarray:
    """Storage offset of every (row, head, dim) of an IO tensor (a 4-D output folds to rows)."""
    from ..reference_impl.addressing import io_offsets

    rows = int(np.prod(io.shape[:-2]))
    r, h, d = np.indices((rows, io.shape[-2], io.shape[-1]), dtype=np.int64)
    return io_offsets(tuple(io.shape), tuple(io.stride), r, h, d) + io.origin


def _locate(offsets: np.ndarray, flat_index: int) -> tuple[int, ...] | None:
    hit = np.argwhere(offsets == flat_index)
    return tuple(int(x) for x in hit[0]) if hit.size else None


def _fmt_value(array: np.ndarray, i: int) -> str:
    v = float(array[i])
    bits = int(bits_view(array[i : i + 1])[0])
    return f"{v:.9g} (0x{bits:0{array.dtype.itemsize * 2}x})"


def nan_mask(array: np.ndarray) -> np.ndarray:
    """Which storage elements hold a NaN (any encoding, either sign)."""
    if array.dtype.kind in "iub":
        return np.zeros(array.shape, dtype=bool)
    with np.errstate(invalid="ignore"):
        return np.isnan(array.astype(np.float64))


def differences(
    got: np.ndarray, expected: np.ndarray, offsets: np.ndarray, names: Sequence[str], limit: int = MAX_REPORTED,
    nan_class: np.ndarray | None = None, converted: bool = False,
) -> tuple[int, list[str]]:
    """Number of differing storage elements and a description of the first ``limit``.

    ``nan_class`` (boolean, per storage element): elements where any NaN stands for the
    expected NaN (values a conversion produced, docs/numerics.md); elsewhere bits count.
    ``converted``: the array holds converted values (a line about an expected NaN says
    that any NaN would have done).
    """
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return got.size or 1, [f"storage of {got.dtype}[{got.size}] where {expected.dtype}[{expected.size}] was expected"]
    differ = bits_view(got) != bits_view(expected)
    if nan_class is not None and differ.any():
        differ &= ~(nan_class & nan_mask(got) & nan_mask(expected))
    bad = np.nonzero(differ)[0]
    lines = []
    for i in bad[:limit]:
        where = _locate(offsets, int(i))
        pos = (
            "(" + ", ".join(f"{n}={w}" for n, w in zip(names, where)) + ")"
            if where is not None
            else f"padding element at storage offset {int(i)} (not part of the tensor)"
        )
        note = " (a NaN from a conversion: any NaN is accepted here)" if converted and nan_mask(
            expected[int(i):int(i) + 1])[0] else ""
        lines.append(f"{pos}: expected {_fmt_value(expected, int(i))}{note}, got {_fmt_value(got, int(i))}")
    return int(bad.size), lines


def converted_sides(case) -> dict[str, bool]:
    """Which arrays of the call hold values a conversion produced (R-CONVERT, R-FP8):
    a write whose IO dtype differs from the cache dtype, a gather whose output dtype
    differs from the cache dtype. Same-dtype moves are plain copies (bit-exact)."""
    if isinstance(case, WriteCase):
        return {"k": case.key_layout.dtype != case.cache.k.dtype, "v": case.value_layout.dtype != case.cache.v.dtype}
    if isinstance(case, GatherCase):
        return {"k": case.out_layout.dtype != case.cache.k.dtype, "v": case.value_out.dtype != case.cache.v.dtype}
    return {}


def _complement(a: np.ndarray) -> np.ndarray:
    return (~bits_view(a)).view(a.dtype)


def _initial(case) -> dict[str, np.ndarray]:
    if isinstance(case, WriteCase):
        return {"k": case.cache.k_init, "v": case.cache.v_init}
    return {"k": case.out_k_init, "v": case.out_v_init}


def _written_by_oracle(case) -> dict[str, np.ndarray] | None:
    """Storage elements the oracle's call writes: the oracle run again on the case
    with every initial bit inverted; an element it writes holds the same value both
    times, an element it leaves holds the two different initial values."""
    import dataclasses

    if isinstance(case, WriteCase):
        cache = dataclasses.replace(case.cache, k_init=_complement(case.cache.k_init),
                                    v_init=_complement(case.cache.v_init))
        flipped = _oracle().expected_write(dataclasses.replace(case, cache=cache))
        first = _oracle().expected_write(case)
    else:
        flipped = _oracle().expected_gather(dataclasses.replace(
            case, out_k_init=_complement(case.out_k_init), out_v_init=_complement(case.out_v_init)))
        first = _oracle().expected_gather(case)
    if int(first.status) != int(Status.OK) or int(flipped.status) != int(Status.OK):
        return None
    return {k: bits_view(first.arrays[k]) == bits_view(flipped.arrays[k]) for k in ("k", "v")}


def nan_class_masks(case, expected: Result, got: Result) -> dict[str, np.ndarray | None]:
    """Per array: where a NaN is compared as a class (converted elements the call
    writes), or None where every bit counts. Worked out only when some converted
    element differs between two NaNs (the oracle runs once more then)."""
    sides = converted_sides(case)
    out: dict[str, np.ndarray | None] = {k: None for k in ("k", "v")}
    need = []
    for key, conv in sides.items():
        g, e = got.arrays.get(key), expected.arrays.get(key)
        if not conv or g is None or e is None or g.shape != e.shape or g.dtype != e.dtype:
            continue
        if np.any((bits_view(g) != bits_view(e)) & nan_mask(g) & nan_mask(e)):
            need.append(key)
    if need:
        written = _written_by_oracle(case)
        if written is not None:
            for key in need:
                out[key] = written[key]
    return out


def _array_views(case) -> dict[str, tuple[np.ndarray, Sequence[str], str]]:
    if isinstance(case, WriteCase):
        return {
            "k": (_cache_offsets(case.cache.k, case.cache.geom), ("block", "token", "head", "dim"), "K cache"),
            "v": (_cache_offsets(case.cache.v, case.cache.geom), ("block", "token", "head", "dim"), "V cache"),
        }
    if isinstance(case, GatherCase):
        names = ("row", "head", "dim")
        return {"k": (_io_offsets(case.out_layout), names, "gathered keys"),
                "v": (_io_offsets(case.value_out), names, "gathered values")}
    raise TypeError(f"no arrays to compare for {type(case).__name__}")


def array_mismatches(got: Result, expected: Result, case) -> list[str]:
    """Human-readable differences between the memory after the call and the oracle's; [] if equal.

    Bit-exact, except that a converted element the oracle writes as a NaN may hold
    any NaN (:func:`nan_class_masks`, docs/numerics.md)."""
    views = _array_views(case)
    masks = nan_class_masks(case, expected, got)
    out = []
    for key, (offsets, names, label) in views.items():
        n, lines = differences(got.arrays[key], expected.arrays[key], offsets, names, nan_class=masks.get(key),
                               converted=bool(converted_sides(case).get(key)))
        if n:
            out.append(f"{label}: {n} element(s) differ; " + "; ".join(lines))
    return out


#: What check_arrays expects, for a call with and without converted values.
BIT_EXACT = "bit-exact equality with the reference (kvx_conformance.reference_impl)"
NAN_AS_CLASS = (
    "equality with the reference (kvx_conformance.reference_impl), bit-exact except that a NaN a "
    "conversion produces is compared as a class: any NaN encoding, either sign (the spec pins no NaN "
    "byte; docs/numerics.md)"
)


def check_arrays(got: Result, expected: Result, case, *, clause: str, what: str | None = None) -> None:
    """Comparison of the memory after the call with the oracle's: bit-exact, NaNs of
    conversions compared as a class (docs/numerics.md)."""
    bad = array_mismatches(got, expected, case)
    if bad:
        conv = any(converted_sides(case).values()) if isinstance(case, (WriteCase, GatherCase)) else False
        raise ConformanceFailure(
            what or "memory after the call differs from the reference",
            expected=NAN_AS_CLASS if conv else BIT_EXACT,
            got="\n            ".join(bad),
            clause=clause,
            case=_case_text(case),
            seed=_seed(case),
        )


def check_arrays_any(got: Result, candidates: Sequence[tuple[str, Result]], case, *, clause: str, what: str) -> None:
    """Every element after the call must hold its value in one of the acceptable outcomes.

    Used where the spec allows an erroneous call to apply part of its work (a
    data-dependent error found late, R-DEVICE-STATUS): each element is either as it
    was or as the valid part of the call leaves it, never anything else.
    """
    views = _array_views(case)
    sides = converted_sides(case)
    init = untouched(case).arrays
    bad_lines = []
    for key, (offsets, names, label) in views.items():
        g = got.arrays[key]
        ok = np.zeros(g.shape, dtype=bool)
        for _, cand in candidates:
            c = cand.arrays[key]
            if c.shape == g.shape and c.dtype == g.dtype:
                ok |= bits_view(g) == bits_view(c)
                if sides.get(key) and init[key].shape == c.shape:
                    # a NaN the candidate writes by conversion (its bits differ from the
                    # initial ones) may be any NaN (docs/numerics.md)
                    ok |= (bits_view(c) != bits_view(init[key])) & nan_mask(g) & nan_mask(c)
        if not ok.all():
            n, lines = differences(g, np.where(ok, g, candidates[0][1].arrays[key]), offsets, names)
            bad_lines.append(f"{label}: {n} element(s) hold a value of no acceptable outcome; " + "; ".join(lines))
    if bad_lines:
        raise ConformanceFailure(
            what,
            expected="each element as in one of: " + ", ".join(name for name, _ in candidates),
            got="\n            ".join(bad_lines),
            clause=clause,
            case=_case_text(case),
            seed=_seed(case),
        )


def untouched(case) -> Result:
    """The memory a call that writes nothing leaves (the case's initial contents)."""
    if isinstance(case, WriteCase):
        return Result(int(Status.OK), {"k": case.cache.k_init, "v": case.cache.v_init})
    return Result(int(Status.OK), {"k": case.out_k_init, "v": case.out_v_init})


# ---------------------------------------------------------------------------- whole calls


def _oracle():
    from .. import reference_impl

    return reference_impl


#: Layout features of which the core profile needs one (readings: core).
CORE_LAYOUT_FEATURES = ("nhd", "hnd")


def refusable_features(case, feature: str | tuple[str, ...] | None = None,
                       core: str | None = None) -> tuple[str, ...]:
    """The optional features a refusal of ``case`` may be excused by: the test's own
    ``feature`` plus every optional feature the case exercises (``casebuild.case_features``),
    except the provider's ``core`` layout ("nhd" or "hnd": required of it), or both core
    layouts when it is not known, unless the test names it."""
    given = (feature,) if isinstance(feature, str) else tuple(feature or ())
    required = (core,) if core in CORE_LAYOUT_FEATURES else CORE_LAYOUT_FEATURES
    used = tuple(f for f in case_features(case) if f not in required)
    return tuple(dict.fromkeys(given + used))


def provider_core_layout(provider, memory: Memory) -> str | None:
    """The provider's core layout (``casebuild.core_layout``), or None where it cannot be
    learnt (a proxy provider without ``kvx_validate_cache_desc`` and nothing cached)."""
    from .build import core_layout

    try:
        return core_layout(provider, memory)
    except Exception:  # noqa: BLE001 - a proxy that cannot validate: both core layouts count as required
        return None


def _unsupported(got: Result, case, feature: str | tuple[str, ...] | None, clause: str,
                 core: str | None = None) -> None:
    """A refusal (UNSUPPORTED, or INVALID_ARGUMENT for a call the oracle answers OK: spec 8
    "unsupported field") must have written nothing; then it is the feature's to excuse."""
    name = status_name(got.status)
    check_guards(got, clause=clause, case=case)
    if not isinstance(case, ValidateCase):
        check_arrays(got, untouched(case), case, clause=clause,
                     what=f"the provider answered {name} but modified memory")
    label = getattr(case, "label", "") or type(case).__name__
    # the test's feature plus every optional feature the case exercises: the answer is
    # excused when any of them is unclaimed (plugin), so a claimed feature is not blamed
    # for a refusal of something else the case combines it with
    raise Unsupported(f"provider answered {name} for {label}", refusable_features(case, feature, core),
                      refused_with=name)


def is_refusal(got_status: int, expected_status: int, allowed, refused_feature: bool = False) -> bool:
    """UNSUPPORTED where the test does not expect it, or INVALID_ARGUMENT for a call the
    oracle answers OK (spec 8: INVALID_ARGUMENT also means "unsupported field") -- or for an
    erroneous call of a feature the provider refuses outright (``refused_feature``: its valid
    probe call was not served, :func:`_uses_unserved`), where INVALID_ARGUMENT is that refusal."""
    allowed = {int(s) for s in allowed}
    if int(got_status) == Status.UNSUPPORTED:
        return int(Status.UNSUPPORTED) not in allowed
    return (int(got_status) == Status.INVALID_ARGUMENT and (int(expected_status) == Status.OK or refused_feature)
            and int(Status.INVALID_ARGUMENT) not in allowed)


def _uses_unserved(provider, memory: Memory, case, feature, core: str | None) -> bool:
    """Whether ``case`` uses an optional feature whose tiny valid probe call the provider did not
    serve (``served.served_features``). A provider that refuses, say, RAGGED tables with
    INVALID_ARGUMENT (spec 8: "unsupported field") answers INVALID_ARGUMENT to a RAGGED call
    with a data error too: that is its refusal of RAGGED, not a status it chose for the error."""
    from .served import PROBED, served_features

    used = set(refusable_features(case, feature, core)) & set(PROBED)
    if not used:
        return False
    try:
        return bool(used - served_features(provider, memory))
    except Exception:  # noqa: BLE001 - no probe, no excuse
        return False


def _judge(
    got: Result,
    expected: Result,
    case,
    opts: execute.CallOptions,
    *,
    clause: str,
    feature: str | tuple[str, ...] | None,
    statuses: Iterable[int] | None,
    partial: Callable[[], Result] | None,
    core: str | None = None,
    provider=None,
) -> Result:
    exp_status = int(expected.status)
    allowed = {exp_status} if statuses is None else {int(s) for s in statuses}
    device_ok = (
        opts.memory == Memory.DEVICE and exp_status in {int(s) for s in DATA_DEPENDENT} and partial is not None
    )
    if device_ok:
        allowed.add(int(Status.OK))  # R-DEVICE-STATUS
    check_inputs(got, case=case)  # whatever the answer, the inputs are the caller's (R-INPUTS)
    refused_feature = (
        feature is not None and provider is not None and int(got.status) == Status.INVALID_ARGUMENT
        and exp_status not in (int(Status.OK), int(Status.INVALID_ARGUMENT))
        and int(Status.INVALID_ARGUMENT) not in allowed
        and _uses_unserved(provider, opts.memory, case, feature, core)
    )
    if feature is not None and is_refusal(got.status, exp_status, allowed, refused_feature):
        _unsupported(got, case, feature, clause, core)
    if int(got.status) not in allowed and got.guard_violations:
        # both wrong: the status is the finding, the stray stores are said with it (not lost)
        raise ConformanceFailure(
            "unexpected status, and memory outside the described tensors was modified",
            expected=statuses_text(sorted(allowed)) + ", no byte outside the described elements changed",
            got=f"{status_name(int(got.status))}; " + "; ".join(got.guard_violations),
            clause=clause, case=_case_text(case), seed=_seed(case))
    check_status(got.status, allowed, clause=clause, case=case)
    check_guards(got, clause=clause, case=case)
    if isinstance(case, ValidateCase):
        _refusal_not_rule(got, exp_status, case, opts.memory, feature, provider)
        return got
    if got.status == Status.OK and exp_status == Status.OK:
        check_arrays(got, expected, case, clause=clause)
        note_served_call()
        return got
    # An error answer, or OK for an erroneous call where that is allowed: the call
    # wrote nothing, or (data-dependent errors) only what its valid part writes.
    cands = [("untouched memory", untouched(case))]
    if exp_status != Status.OK and partial is not None:
        cands.append(("the valid part of the call applied", partial()))
    check_arrays_any(got, cands, case, clause=clause,
                     what=f"memory after a {status_name(got.status)} answer is not an acceptable outcome")
    _refusal_not_rule(got, exp_status, case, opts.memory, feature, provider)
    return got


def _refusal_not_rule(got: Result, exp_status: int, case, memory: Memory, feature, provider) -> None:
    """The INVALID_ARGUMENT a case expects, from a provider that answers INVALID_ARGUMENT to a valid
    call of the same entry point using one of the case's features (an HND-only provider and an NHD
    cache, say: spec 8 "unsupported field"), may be that refusal and does not show the rule the case
    breaks: no pass, but a refusal of those features (``served.refused_outright``; readings R-REFUSAL),
    excused where one of them is unclaimed. A crash or stray store has been judged already."""
    if provider is None or int(got.status) != Status.INVALID_ARGUMENT or exp_status != Status.INVALID_ARGUMENT:
        return
    from .served import refused_outright

    feats = refusable_features(case, feature, provider_core_layout(provider, memory))
    if not feats:
        return
    try:
        refused = refused_outright(provider, memory, feats, ENTRY_OF[type(case).__name__])
    except Exception:  # noqa: BLE001 - no probe, no excuse: the answer stands
        return
    if refused:
        label = getattr(case, "label", "") or type(case).__name__
        raise Unsupported(f"provider answered INVALID_ARGUMENT for {label}, as it answers a valid call using "
                          f"{', '.join(refused)}: the answer does not show the rule this case breaks", refused,
                          refused_with="INVALID_ARGUMENT")


#: the entry point a case calls, by case type
ENTRY_OF = {"ValidateCase": "validate", "WriteCase": "write", "GatherCase": "gather"}


class OracleDisagrees(RuntimeError):
    """The test's stated expectation and the oracle's answer differ: a harness fault."""


def _agree(exp: Result, expect: int | None, case) -> None:
    if expect is not None and int(exp.status) != int(expect):
        raise OracleDisagrees(
            f"the test expects {status_name(int(expect))} but the oracle answers {status_name(int(exp.status))}"
            f" (rule {exp.rule or '-'}) for {_case_text(case)}"
        )


def away_from_run_memory(case, memory: Memory):
    """The case with every memory-type override that names the run's own memory type
    turned into HOST. The generators break memory rules by naming DEVICE or UNIFIED
    (a mismatch on a HOST run); on a DEVICE or UNIFIED run that value would match the
    run's memory and the case would not break its rule any more."""
    if memory == Memory.HOST or not getattr(case, "c_overrides", None):
        return case
    ov = case.c_overrides
    bad = [k for k, v in ov.items() if k.endswith(".memory") and v is not None and int(v) == int(memory)]
    if not bad:
        return case
    import dataclasses

    return dataclasses.replace(case, c_overrides={**ov, **{k: int(Memory.HOST) for k in bad}})


def verify_validate(
    provider, case: ValidateCase, opts: execute.CallOptions | None = None, *, clause: str,
    feature: str | tuple[str, ...] | None = None, statuses: Iterable[int] | None = None, expect: int | None = None,
) -> Result:
    """Run ``kvx_validate_cache_desc`` and hold its status to the oracle's.

    ``expect`` (every verify_*): the status the test means to provoke; the oracle must
    agree (else :class:`OracleDisagrees`, a harness fault, not the provider's).
    """
    opts = opts or execute.CallOptions()
    case = away_from_run_memory(case, opts.memory)
    exp = _oracle().expected_validate(case, opts.memory)
    _agree(exp, expect, case)
    got = execute.run_validate(provider, case, opts)
    core = provider_core_layout(provider, opts.memory) if feature is not None and got.status != exp.status else None
    # provider: a validation the reference refuses (UNSUPPORTED) of a case that also uses a
    # feature the provider does not serve (an NHD cache where HND is its core layout) may be
    # answered INVALID_ARGUMENT: that is its refusal of the unserved feature (spec 8:
    # INVALID_ARGUMENT "Malformed descriptor or unsupported field"; R-REFUSAL), as for writes
    # and gathers (_uses_unserved), not a status it chose for what the test asks about.
    return _judge(got, exp, case, opts, clause=clause, feature=feature, statuses=statuses, core=core, partial=None,
                  provider=provider)


def verify_write(
    provider, case: WriteCase, opts: execute.CallOptions | None = None, *, clause: str,
    feature: str | tuple[str, ...] | None = None, statuses: Iterable[int] | None = None,
    partial: Callable[[], Result] | None = None, expect: int | None = None, served: tuple[str, ...] = (),
) -> Result:
    """Run ``kvx_write_kv``; status, guards and the whole cache bit-exact against the oracle.

    ``statuses`` widens the acceptable statuses (default: exactly the oracle's);
    ``partial`` gives the memory of the call's valid part, acceptable with a
    data-dependent error status (and with OK on DEVICE memory, R-DEVICE-STATUS);
    ``served``: rules the reference refuses that the oracle serves here (``rules.SERVABLE``):
    the call is held to the served result (``expect`` still names the refused answer).
    """
    opts = opts or execute.CallOptions()
    case = away_from_run_memory(case, opts.memory)
    exp = _oracle().expected_write(case, opts.memory)
    _agree(exp, expect, case)
    if served:
        exp = _oracle().expected_write(case, opts.memory, served=served)
    got = execute.run_write(provider, case, opts)
    core = provider_core_layout(provider, opts.memory) if feature is not None and got.status != exp.status else None
    return _judge(got, exp, case, opts, clause=clause, feature=feature, statuses=statuses, core=core, partial=partial,
                  provider=provider)


def verify_gather(
    provider, case: GatherCase, opts: execute.CallOptions | None = None, *, clause: str,
    feature: str | tuple[str, ...] | None = None, statuses: Iterable[int] | None = None,
    partial: Callable[[], Result] | None = None, expect: int | None = None, served: tuple[str, ...] = (),
) -> Result:
    """Run ``kvx_gather_kv``; status, guards, untouched cache and outputs bit-exact (``served``: as
    :func:`verify_write`)."""
    opts = opts or execute.CallOptions()
    case = away_from_run_memory(case, opts.memory)
    exp = _oracle().expected_gather(case, opts.memory)
    _agree(exp, expect, case)
    if served:
        exp = _oracle().expected_gather(case, opts.memory, served=served)
    got = execute.run_gather(provider, case, opts)
    core = provider_core_layout(provider, opts.memory) if feature is not None and got.status != exp.status else None
    return _judge(got, exp, case, opts, clause=clause, feature=feature, statuses=statuses, core=core, partial=partial,
                  provider=provider)


# ---------------------------------------------------------------------------- valid parts


def valid_part_of_write(case: WriteCase) -> WriteCase:
    """The write with every out-of-range slot turned into a no-op (-1)."""
    import dataclasses

    n = case.cache.geom.num_slots
    s = np.asarray(case.slots.slots, dtype=np.int64).copy()
    s[s >= n] = -1
    return dataclasses.replace(case, slots=dataclasses.replace(case.slots, slots=s))


def partial_write(case: WriteCase) -> Callable[[], Result]:
    """``partial=`` for :func:`verify_write`: what the call's in-range tokens alone write."""
    return lambda: _oracle().expected_write(valid_part_of_write(case))


def repaired_gather(case: GatherCase) -> GatherCase:
    """The gather with every data-dependent error repaired the way a skipping provider
    sees it: lengths clipped to what the table holds (negative ones to 0), bad block
    ids and unusable KV_OFFSETS entries pointed at block 0 (R-DEVICE-STATUS)."""
    import dataclasses

    from ..abi.header import TableFormat

    t = case.table
    bs = case.cache.geom.block_size
    nb = case.cache.geom.num_blocks
    lens = np.maximum(np.asarray(case.seq_lens.lengths, np.int64), 0)
    lens = np.minimum(lens, t.max_blocks_per_seq * bs)
    idx = np.asarray(t.indices, np.int64).copy()
    indptr = None if t.indptr is None else np.asarray(t.indptr, np.int64).copy()
    if t.format == TableFormat.RAGGED and indptr is not None and len(indptr) == t.seq_count + 1:
        ranges = np.maximum(np.diff(indptr), 0)
        ok = (indptr[:-1] >= 0) & (indptr[1:] <= min(len(idx), t.n_indices))
        lens = np.where(ok, np.minimum(lens, ranges), 0)
        idx[(idx < 0) | (idx >= nb)] = 0
        # A skipping provider reads each sequence's own range [indptr[s], indptr[s+1]),
        # also where the indptr as a whole is malformed (not non-decreasing, or not
        # ending at indices_count): rebuild a well-formed table of those ranges, so
        # that the oracle answers the valid part instead of the malformed-indptr error.
        take = np.minimum(lens, max(int(case.max_seq_len), 0))
        parts = [idx[int(indptr[s]): int(indptr[s]) + int(take[s])] for s in range(t.seq_count)]
        idx = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        indptr = np.concatenate([[0], np.cumsum(take)]).astype(np.int64)
        lens = np.where(lens > take, take, lens)
        table = dataclasses.replace(t, indices=idx, indptr=indptr, indices_count=None, indptr_count=None)
        return dataclasses.replace(case, table=table, seq_lens=dataclasses.replace(case.seq_lens, lengths=lens))
    elif t.format == TableFormat.KV_OFFSETS:
        u = idx & 0xFFFFFFFF
        bad = u == 0xFFFFFFFF
        if case.cache.pool is None or case.cache.pool.secondary is None or case.cache.pool.secondary_null:
            bad |= (u & 0x80000000) != 0
        idx[bad] = 0
    else:
        idx[(idx < 0) | (idx >= nb)] = 0
    table = dataclasses.replace(t, indices=idx, indptr=indptr)
    return dataclasses.replace(case, table=table, seq_lens=dataclasses.replace(case.seq_lens, lengths=lens))


def partial_gather(case: GatherCase) -> Callable[[], Result]:
    """``partial=`` for :func:`verify_gather`: what the valid part of the gather writes."""
    return lambda: _oracle().expected_gather(repaired_gather(case))
