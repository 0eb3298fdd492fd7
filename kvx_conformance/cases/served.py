"""Which optional features a provider serves: one cheap probe call per feature, cached.

The generated and differential tests (profile "generated") are required tests, and a
required test uses required features only. They draw an optional feature
(``outcomes.OPTIONAL_FEATURES``) only where the vendor claims it or the provider has
shown here that it serves it: a tiny valid call that uses that one feature on top of the
provider's core layout (``casebuild.core_layout``) answers OK. The probe judges no
values (the explicit suites do that); it only decides what the generators may draw, so a
provider is never failed by a generated example for a feature it refuses.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from ..abi import header as abi
from ..abi.header import DType, Status
from . import build as cb

#: Features the generators can draw, each with the probe case that shows it served.
PROBED = ("nhd", "hnd", "hnd_packed", "custom_layout", "noncanonical_strides", "mixed_layouts",
          "mixed_io_dtype", "fp8", "io_strides", "gather_4d", "ragged", "kv_offsets", "secondary_pool", "misaligned")

_G = cb.TINY
_CACHE: dict[tuple[str, int], frozenset[str]] = {}


def _write(provider, opts, cache, **kw) -> int:
    from .execute import run_write

    case = cb.write_case(cache, cb.spread_slots(_G, 5, 91), seed=92, label="served-feature probe", **kw)
    return run_write(provider, case, opts).status


def _gather(provider, opts, build: Callable) -> int:
    from .execute import run_gather

    return run_gather(provider, build(), opts).status


def _probes(core: str) -> dict[str, Callable]:
    """feature -> f(provider, opts) -> status of a valid call using that feature alone."""
    table = np.array([[2, 0], [1, 3]], np.int64)

    def cache(kind=core, dtype=DType.F16, **kw):
        return cb.simple_cache(_G, kind, dtype, seed=90, **kw)

    def mixed_kv(p, o):
        t = cb.layout(_G, core, DType.F16)
        return _write_mixed(p, o, cb.make_cache(_G, t, t.with_(dtype=DType.F32), seed=90))

    def kv_offsets(secondary: bool):
        def run(p, o):
            c = cb.kv_offsets_cache(_G, DType.F16, primary_blocks=4, secondary_blocks=2 if secondary else 0, seed=93)
            off = np.zeros((1, 1, 2, 2), np.int64)
            off[0, 0, :, 0] = [1, 2]
            off[0, 0, :, 1] = [cb.SECONDARY | 1, cb.SECONDARY | 0] if secondary else [3, 0]
            return _gather(p, o, lambda: cb.kv_offsets_gather(c, off, [6], 6, seed=94, label="served-feature probe"))
        return run

    return {
        "nhd": lambda p, o: _write(p, o, cache("nhd")),
        "hnd": lambda p, o: _write(p, o, cache("hnd")),
        "hnd_packed": lambda p, o: _write(p, o, cache("hnd_packed")),
        "custom_layout": lambda p, o: _write(p, o, cache("custom")),
        "noncanonical_strides": lambda p, o: _write(p, o, cache(core, pad=2)),
        "mixed_layouts": mixed_kv,
        "mixed_io_dtype": lambda p, o: _write(p, o, cache(), io_dtype=DType.F32),
        "fp8": lambda p, o: _write(p, o, cache(core, DType.F8_E4M3), io_dtype=DType.F8_E4M3),
        "io_strides": lambda p, o: _write(p, o, cache(), io_kind="padded"),
        "gather_4d": lambda p, o: _gather(p, o, lambda: cb.packed_gather(cache(), table, [5, 7], 8, seed=95,
                                                                         out4d=True, label="served-feature probe")),
        "ragged": lambda p, o: _gather(p, o, lambda: cb.ragged_gather(cache(), table, [5, 7], 8, seed=96,
                                                                       label="served-feature probe")),
        "kv_offsets": kv_offsets(False),
        "secondary_pool": kv_offsets(True),
        # every data pointer 2 bytes past a 256-byte boundary (4.4)
        "misaligned": lambda p, o: _write(p, dataclasses.replace(o, misalign=2), cache()),
    }


def _write_mixed(provider, opts, cache) -> int:
    """K F16 and V F32 in the same layout; IO of each side's own dtype."""
    from ..abi.descriptors import IOLayout
    from .execute import run_write

    n = 5
    case = cb.write_case(cache, cb.spread_slots(_G, n, 91), seed=92, label="served-feature probe")
    value_layout = IOLayout.dense(DType.F32, n, _G.num_kv_heads, _G.head_dim)
    rng = cb.rng_for(97)
    case = cb.replace(case, value_layout=value_layout,
                      value=cb.finite_values(rng, DType.F32, value_layout.span_elements()))
    return run_write(provider, case, opts).status


_ONE: dict[tuple[str, int, str, str], bool] = {}
#: the layout features a rule's case may use (``rule_profile``)
LAYOUT_FEATURES = ("nhd", "hnd", "mixed_layouts")


#: the layout features whose probe any entry point makes itself, a cache of that layout
ENTRY_PROBED = ("nhd", "hnd", "hnd_packed", "custom_layout", "mixed_layouts")
_KIND = {"custom_layout": "custom"}
#: the entry point of each other probe of ``_probes`` (the rest: a write)
_PROBE_ENTRY = {"gather_4d": "gather", "ragged": "gather", "kv_offsets": "gather", "secondary_pool": "gather"}


def _probe(core: str, feature: str, entry: str) -> Callable:
    """f(provider, opts) -> status of a valid call of ``entry`` using ``feature``: a write, the
    probes of ``_probes`` (every feature of ``PROBED``); a validate or a gather, a cache of layout
    ``feature`` (``ENTRY_PROBED``: "nhd", "hnd", "hnd_packed", "custom_layout") or of K and V of
    two dtypes ("mixed_layouts")."""
    from .execute import run_validate

    def cache():
        if feature != "mixed_layouts":
            return cb.simple_cache(_G, _KIND.get(feature, feature), DType.F16, seed=90)
        t = cb.layout(_G, core, DType.F16)
        return cb.make_cache(_G, t, t.with_(dtype=DType.F32), seed=90)

    if feature not in ENTRY_PROBED:  # its own probe, whatever the entry point (refused_outright picks)
        return _probes(core)[feature]
    if entry == "validate":
        return lambda p, o: run_validate(p, cb.validate_case(cache(), label="served-feature probe"), o).status
    if entry == "gather":
        table = np.array([[2, 0], [1, 3]], np.int64)
        return lambda p, o: _gather(p, o, lambda: cb.packed_gather(cache(), table, [5, 7], 8, seed=95,
                                                                   label="served-feature probe"))
    return _probes(core)[feature]


def serves(provider, memory: abi.Memory, features, entry: str = "write") -> frozenset[str]:
    """Which of ``features`` (names in ``PROBED``) the provider serves: their probes alone, each run
    once per provider path, memory type and entry point. The provider's core layout is served.
    ``entry`` ("validate", "write", "gather"; layout features only for the first and last) is the
    entry point the probes call: a test that asks calls only its own entry point, so a provider
    that crashes in another one does not crash that test."""
    from .execute import CallOptions

    path, core = str(getattr(provider, "path", id(provider))), cb.core_layout(provider, memory)
    opts, out = CallOptions(memory=memory), set()
    for feature in features:
        key = (path, int(memory), feature, entry)
        if key not in _ONE:
            try:  # a probe that cannot run shows nothing served
                _ONE[key] = feature == core or int(_probe(core, feature, entry)(provider, opts)) == Status.OK
            except Exception:  # noqa: BLE001
                _ONE[key] = False
        if _ONE[key]:
            out.add(feature)
    return frozenset(out)


def memory_answer(provider, memory: abi.Memory) -> str:
    """Whether the provider serves ``memory``: "OK" where a tiny valid validate and write of that memory
    type are both answered OK, in NHD or else in HND (its core layout, either); else the answer that was
    not, the write's named (``"UNSUPPORTED (write; validate OK)"``). Validation alone does not say:
    spec 7 has ``kvx_validate_cache_desc`` "validate layout, dtype, shape, stride, and required fields",
    and a memory type the build cannot serve is refused by the call (readings R-ORDER, step 4). Buffer
    failures raise (facts about the machine, for the caller to word)."""
    from ..abi.loader import status_name
    from .execute import CallOptions, run_validate, run_write

    opts, answers = CallOptions(memory=memory), []
    for kind in ("nhd", "hnd"):
        # F16: the dtype every KV cache serves
        validate, write, _ = cb.tiny_calls(kind, DType.F16, seed=98, label="memory probe")
        sv = int(run_validate(provider, validate, opts).status)
        if sv != Status.OK:
            answers.append(status_name(sv))
            continue
        sw = int(run_write(provider, write, opts).status)
        if sw == Status.OK:
            return "OK"
        answers.append(f"{status_name(sw)} (write; validate OK)")
    # a layout whose validation passed says more than one refused outright
    return next((a for a in answers if "(write" in a), answers[0])


def choose_memory(requested: str, answer_of: Callable[[str], str], verb: str) -> tuple[str | None, str | None, list[str]]:
    """(memory, error, notes) for ``--memory requested`` of ``kvx-conform run`` (``verb`` "certify") or
    ``bench`` ("bench"). ``answer_of(memory)`` is ``memory_answer``'s answer for that memory type, or
    "unavailable here: ..." (not on this machine) or "not probed". ``auto`` takes device memory only
    where it is "OK"; an explicit request answered with a status is an error (the provider does not
    serve that memory type), as one unavailable here is."""
    if requested == "host":
        return "host", None, []
    if requested == "auto":
        why = answer_of("device")
        if why == "OK":
            return "device", None, ["memory auto: device (the provider serves KVX_MEMORY_DEVICE)"]
        return "host", None, [f"memory auto: host (device: {why})"]
    answer = answer_of(requested)
    if answer.startswith("unavailable"):
        return None, f"memory type {requested} is {answer}", []
    if answer != "OK" and not answer.startswith("not probed"):
        # a status: the provider refused a tiny valid call on that memory type, so it does not serve it
        return None, (f"memory type {requested} is not served by the provider: a tiny valid call on it answered "
                      f"{answer} ({verb} it on the memory it serves: --memory host, or auto)"), []
    return requested, None, [] if answer == "OK" else [f"the provider's memory probe: {answer}"]


def refused_outright(provider, memory: abi.Memory, features, entry: str) -> tuple[str, ...]:
    """Of ``features``, those the provider refuses outright at ``entry``: the tiny valid call of that
    entry point using the feature alone (a layout's cache, ``ENTRY_PROBED``; the other features of
    ``PROBED`` where their own probe calls that entry point) was not answered OK. The provider's core
    layout is never among them. An erroneous case using one of them that is answered INVALID_ARGUMENT
    shows that refusal, not the rule the case breaks (R-REFUSAL)."""
    out = []
    for f in features:
        own = entry if f in ENTRY_PROBED else _PROBE_ENTRY.get(f, "write") if f in PROBED else None
        if own == entry and f not in serves(provider, memory, [f], entry):
            out.append(f)
    return tuple(out)


def rule_profile(provider, memory: abi.Memory, claims=(), entry: str = "write"):
    """The profile single-rule cases are drawn from (``generators.values.CORE``: NHD and HND, K and V
    apart), narrowed to the layouts and the K / V mix the provider serves (``entry``'s probes) or
    claims, or None where it serves or claims them all. A rule's case in a layout the provider
    refuses would meet that refusal, often the INVALID_ARGUMENT the rule expects, and not the rule
    (R-REFUSAL)."""
    from .generators.values import CORE

    wanted = LAYOUT_FEATURES
    have = set(claims or ()) & set(wanted)
    if not set(wanted) <= have:
        have |= serves(provider, memory, [f for f in wanted if f not in have], entry)
    if set(wanted) <= have:
        return None
    return dataclasses.replace(CORE, layout_kinds=tuple(k for k in ("nhd", "hnd") if k in have),
                               mixed_kv="mixed_layouts" in have)


def served_features(provider, memory: abi.Memory = abi.Memory.HOST) -> frozenset[str]:
    """The optional features of ``PROBED`` whose probe call the provider answers OK (cached
    per provider path and memory type). The provider's core layout is always included."""
    key = (str(getattr(provider, "path", id(provider))), int(memory))
    if key not in _CACHE:
        _CACHE[key] = serves(provider, memory, PROBED) | {cb.core_layout(provider, memory)}
    return _CACHE[key]


def generator_features(provider, memory: abi.Memory, claims) -> frozenset[str]:
    """What the generated and differential tests may draw: the provider's core layout, the
    optional features it served in its probe, and every feature the vendor claims."""
    return served_features(provider, memory) | frozenset(claims or ())


def required_only(provider, memory: abi.Memory = abi.Memory.HOST) -> frozenset[str]:
    """The provider's core layout alone: what a draw of required features only may use."""
    return frozenset({cb.core_layout(provider, memory)})


