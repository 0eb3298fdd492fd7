"""The oracle's rule catalog, the single-rule generators, and the oracle's view of the C structs.

- every rule of the oracle's catalog (reference_impl.rules) but the provider-dependent
  R-ORDER.memory_unsupported has a generator, and the generators' RULES table states the
  same status, written independently from docs/spec-readings.md;
- ``random_invalid_case(rng, rule)`` breaks exactly that rule (the oracle lists no other
  descriptor violation) and the oracle answers the rule's status, for both profiles;
- valid random cases are valid for the oracle and the oracle reads them without error;
- the structs the oracle reasons about are the ones the executor hands a provider.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kvx_conformance.abi.header import Status
from kvx_conformance.cases import execute, generators
from kvx_conformance.cases.case import GatherCase, ValidateCase, WriteCase
from kvx_conformance.reference_impl import RULES, expected, violations
from kvx_conformance.reference_impl.cview import gather_view, validate_view, write_view

PROVIDER_DEPENDENT = {"R-ORDER.memory_unsupported"}
SEEDS = range(12)


def test_every_rule_has_a_generator_with_the_same_status():
    assert set(RULES) - PROVIDER_DEPENDENT == set(generators.RULES)
    for rule_id, rc in generators.RULES.items():
        assert rc.status == RULES[rule_id].status, rule_id


@pytest.mark.parametrize("profile", ["CORE", "FULL"])
@pytest.mark.parametrize("rule_id", sorted(generators.RULES))
def test_invalid_case_breaks_exactly_its_rule(rule_id, profile):
    for seed in SEEDS:
        v = generators.random_invalid_case(np.random.default_rng([seed, 11]), rule_id, seed=seed,
                                           profile=getattr(generators, profile))
        found = violations(v.case)
        r = expected(v.case)
        assert found == [rule_id] and r.status == v.status and r.rule == rule_id, (
            f"{rule_id} (clause {v.clause}): expected exactly [{rule_id}] with {Status(v.status).name}, oracle "
            f"found {found} and answered {Status(r.status).name} ({r.rule})\n  case: {v.case.describe()}\n"
            f"  overrides: {v.case.c_overrides}\n  repro: generators.random_invalid_case("
            f"np.random.default_rng([{seed}, 11]), {rule_id!r}, profile=generators.{profile})"
        )
        if v.status != Status.OK:
            init = (v.case.cache.k_init, v.case.cache.v_init) if isinstance(v.case, WriteCase) else (
                (v.case.out_k_init, v.case.out_v_init) if isinstance(v.case, GatherCase) else None)
            if init is not None:  # a failing call writes nothing (R-ORDER)
                assert all(np.array_equal(a.view(np.uint8), b.view(np.uint8))
                           for a, b in zip((r.arrays["k"], r.arrays["v"]), init)), rule_id


@pytest.mark.parametrize("kind", ["write", "gather", "validate"])
def test_random_valid_cases_are_valid(kind):
    gen = {"write": generators.random_write_case, "gather": generators.random_gather_case,
           "validate": generators.random_validate_case}[kind]
    for seed in range(150):
        case = gen(np.random.default_rng([seed, 5]), seed=seed)
        r = expected(case)
        assert r.status == Status.OK, f"seed {seed}: {r.rule}\n{case.describe()}"


def test_core_profile_stays_in_core():
    for seed in range(60):
        rng = np.random.default_rng(seed)
        with generators.using_profile(generators.CORE):
            w = generators.random_write_case(rng)
            g = generators.random_gather_case(rng)
        for t in (w.cache.k, w.cache.v, g.cache.k, g.cache.v):
            assert t.dtype in generators.BASELINE_DTYPES and t.layout.name in ("BLOCK_NHD", "BLOCK_HND")
        assert g.table.format.name == "PACKED" and len(g.out_layout.shape) == 3
        assert w.k_scale is None and w.k_scale_desc is None


# ----------------------------------------------------------------------------
# The oracle's C view equals what the executor passes


class _Recorder:
    """A stand-in provider that keeps a copy of the structs it is called with."""

    def __init__(self):
        self.args = None

    @staticmethod
    def _copy(s):
        return None if s is None else type(s).from_buffer_copy(s)

    def validate_cache_desc(self, cache):
        self.args = (self._copy(cache), None)
        return 0

    def write_kv(self, cache, desc, stream=None):
        self.args = (self._copy(cache), self._copy(desc))
        return 0

    def gather_kv(self, cache, desc, stream=None):
        self.args = (self._copy(cache), self._copy(desc))
        return 0


def _same(a, b, path: str) -> list[str]:
    """Field-by-field equality; pointers compare by NULL-ness only."""
    if a is None or b is None:
        return [] if a is None and b is None else [f"{path}: NULL on one side only"]
    out = []
    for name, ctype in a._fields_:
        x, y = getattr(a, name), getattr(b, name)
        p = f"{path}.{name}"
        if isinstance(x, ctypes.Structure):
            out += _same(x, y, p)
        elif ctype is ctypes.c_void_p:
            if bool(x) != bool(y):
                out.append(f"{p}: {'NULL' if not x else 'set'} vs {'NULL' if not y else 'set'}")
        elif isinstance(x, ctypes.Array):
            if list(x) != list(y):
                out.append(f"{p}: {list(x)} vs {list(y)}")
        elif x != y:
            out.append(f"{p}: {x} vs {y}")
    return out


@pytest.mark.parametrize("kind", ["write", "gather", "validate"])
def test_oracle_view_matches_executor_structs(kind):
    rec = _Recorder()
    for seed in range(40):
        rng = np.random.default_rng([seed, 9])
        if seed % 2:
            rule = sorted(generators.RULES)[seed % len(generators.RULES)]
            case = generators.random_invalid_case(rng, rule).case
        else:
            case = {"write": generators.random_write_case, "gather": generators.random_gather_case,
                    "validate": generators.random_validate_case}[kind](rng)
        if isinstance(case, WriteCase):
            execute.run_write(rec, case)
            view = write_view(case)
        elif isinstance(case, GatherCase):
            execute.run_gather(rec, case)
            view = gather_view(case)
        else:
            assert isinstance(case, ValidateCase)
            execute.run_validate(rec, case)
            view = validate_view(case)
        cache, desc = rec.args
        diffs = _same(view.cache, cache, "cache") + _same(view.desc, desc, "desc")
        assert not diffs, f"seed {seed}: oracle view differs from the executor's structs: {diffs}\n{case.describe()}"
