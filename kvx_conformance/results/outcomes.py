"""Outcomes and test metadata: the vocabulary shared by suites, plugin, results and reports.

A conformance test is a pytest function decorated with :func:`conformance`, which
records its stable id, spec clause(s), level, profile and the entry points it calls.
Inside a test:

- raise :class:`Unsupported` when the provider answered ``KVX_STATUS_UNSUPPORTED`` for
  the feature under test (the plugin decides whether that is acceptable: only for an
  optional feature the vendor does not claim);
- raise :class:`ConformanceFailure` (via the checks in ``kvx_conformance.cases.checks``) with
  what was expected, what came back, the clause and the case, for a failure.
"""
from __future__ import annotations

import enum

from ..cases.failures import ConformanceFailure, Unsupported, _served_calls, note_served_call, take_served_calls  # noqa: F401 (re-exported)


class Outcome(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    UNSUPPORTED = "unsupported"
    SKIP = "skip"
    CRASH = "crash"
    TIMEOUT = "timeout"
    ERROR = "error"  # a harness fault, not the provider's
    FLAKY = "flaky"  # re-run after a failure, and the attempts did not agree


class Level(str, enum.Enum):
    REQUIRED = "required"  # MUST
    RECOMMENDED = "recommended"  # SHOULD
    INFORMATIONAL = "informational"  # MAY, or ambiguous


REQUIRED, RECOMMENDED, INFORMATIONAL = Level.REQUIRED, Level.RECOMMENDED, Level.INFORMATIONAL

#: Profiles a provider can be certified for. "core" is the minimum (readings: core).
PROFILES = {
    "core": "version, size guards, 7.1 validation, F16/BF16/F32, NHD or HND, PACKED tables, S32/S64, invalid slots",
    "layouts": "all standard layouts, CUSTOM, padded/transposed strides, K and V in different layouts",
    "tables": "RAGGED and KV_OFFSETS tables, beams, secondary pool",
    "fp8": "FP8 E4M3/E5M2 caches with scales",
    "robustness": "malformed descriptors, out-of-range data, misaligned buffers, zero-sized calls",
    "concurrency": "threads on disjoint regions, lifetime after return, streams, buffers on another GPU",
    "generated": "hypothesis-generated valid cases and single-rule violations",
    "engines": "engine-shaped scenarios (vLLM, TGI, TensorRT-LLM, FlashInfer, ppl.nn)",
    "fp4": "KVX 1.2 FP4 extension (NVFP4 / MXFP4), compatible tier",
    "fp4_exact": "KVX 1.2 FP4 extension, exact tier: codes, scales and decodes bit-identical to the reference codec",
}

#: Features a provider may answer UNSUPPORTED for (spec 4.2 SHOULD, 4.3 optional, 4.4 MAY, 10).
OPTIONAL_FEATURES = {
    "custom_layout": "BLOCK_CUSTOM layout",
    "noncanonical_strides": "non-contiguous stride patterns (4.2)",
    "negative_strides": "negative strides, cache or IO (4.2; the reference refuses them, R-STRIDE-NEG)",
    "mixed_layouts": "K and V in different layouts or dtypes",
    "mixed_io_dtype": "IO dtype different from the cache dtype",
    "fp8": "FP8 caches (4.3, 10)",
    "misaligned": "buffers not aligned to 16 bytes (4.4)",
    "io_strides": "IO tensors with non-dense strides (6.8)",
    "gather_4d": "4-D padded gather output",
    "hnd_packed": "HND_PACKED layout",
    "nhd": "NHD layout (core needs one of NHD/HND)",
    "hnd": "HND layout (core needs one of NHD/HND)",
    "ragged": "RAGGED block tables",
    "kv_offsets": "KV_OFFSETS block tables",
    "secondary_pool": "secondary pool (10)",
    "nonzero_tail": "newer-minor structs with non-zero unknown fields",
    "device_memory": "KVX_MEMORY_DEVICE",
    "unified_memory": "KVX_MEMORY_UNIFIED",
    "host_memory": "KVX_MEMORY_HOST",
    "fp4": "KVX 1.2 FP4 caches",
    "multi_device": "DEVICE buffers on a GPU other than the current one (R-PLACEMENT)",
    "large_cache": "caches of more than 2^31 elements (64-bit offsets)",
    "scale_strides": "PER_HEAD scale values stride[0] apart (6.6; the reference refuses them, R-FP8)",
}


#: Optional features whose refusal the spec says SHOULD be UNSUPPORTED (4.2 strides; 4.4
#: alignment, as the readings take it): refused with INVALID_ARGUMENT instead, the refusal
#: is accepted and a recommended-level warning is recorded on the test.
SHOULD_REFUSE_WITH_UNSUPPORTED = {"noncanonical_strides": "spec 4.2", "negative_strides": "spec 4.2",
                                  "scale_strides": "spec 4.2", "misaligned": "spec 4.4"}


def conformance(
    id: str,
    clause: str,
    level: Level = Level.REQUIRED,
    profile: str = "core",
    entry: str | tuple[str, ...] = (),
    feature: str | None = None,
    seeded: bool = False,
):
    """Mark a test: stable ``id``, spec ``clause``(s), ``level``, ``profile``, the entry
    point(s) it calls (``"version"``, ``"validate"``, ``"write"``, ``"gather"``), the
    optional ``feature`` it exercises (UNSUPPORTED is acceptable only then) and whether the
    run's ``--seed`` draws its cases (``seeded``: the repro command then names the seed; other
    tests fix their seeds, printed in the failure)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}")
    if feature is not None and feature not in OPTIONAL_FEATURES:
        raise ValueError(f"unknown optional feature {feature!r}")
    import pytest  # imported here so that the CLI's vocabulary imports stay light

    entries = (entry,) if isinstance(entry, str) else tuple(entry)
    return pytest.mark.kvx(id=id, clause=clause, level=Level(level).value, profile=profile, entry=entries, feature=feature,
                           seeded=seeded)
