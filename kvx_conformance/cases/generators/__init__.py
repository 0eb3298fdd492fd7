"""Seeded random generators of KVX cases: valid ones, and ones that break exactly one rule.

- ``random_write_case(rng, **constraints)`` / ``random_gather_case(rng, **constraints)`` /
  ``random_validate_case(rng, **constraints)``: VALID cases over every layout (NHD, HND,
  HND_PACKED with pack in {1, 2, 4, 8, 16}, CUSTOM, padded and permuted strides, vLLM's
  V cache ``[blocks, H, D, block_size]`` as HND with order (0, 1, 3, 2)), K and V of
  different layouts and dtypes, every cache dtype (FP8 with and without scales,
  PER_TENSOR and PER_HEAD), S32/S64 metadata, invalid slots (-1, other negatives, a
  non-negative ``invalid_slot``), PACKED / RAGGED / KV_OFFSETS tables (beams, secondary
  pool, pools larger than ``num_blocks``), 3-D and 4-D gather outputs, ``max_seq_len``
  truncation and zero lengths. Caches start random (finite, never zero); gather
  outputs start poisoned with ``POISON_BYTE``.
- ``random_invalid_case(rng, rule)``: a case breaking exactly the named rule (ids of
  docs/spec-readings.md as listed in ``RULES``), with the status the readings expect.

Sizes stay small: every case runs in milliseconds. All randomness comes from the
``numpy.random.Generator`` passed in; ``seed`` is recorded in the case when given.
"""
from __future__ import annotations

from ...abi.header import BASELINE_DTYPES
from .valid import (
    random_gather_case,
    random_geometry,
    random_io_layout,
    random_tensor_layout,
    random_validate_case,
    random_write_case,
    strides_for,
)
from .values import (
    CORE,
    FULL,
    INT32_MAX,
    INT32_MIN,
    IO_KINDS,
    LAYOUT_KINDS,
    NULL_INDEX,
    PACKS,
    POISON_BYTE,
    Profile,
    SECONDARY_BIT,
    VALUE_MODES,
    poisoned,
    random_finite,
    random_values,
    tie_values,
    using_profile,
)
from .violations import RULES, RuleCase, Violation, profile_for, random_invalid_case
