"""The numpy oracle: the executable reading of the KVX v1 spec (docs/spec-readings.md).

Pure functions of a case (``kvx_conformance.cases.case``), mirroring what the executor
returns for the same case:

- ``expected_validate(case) -> Result``: status of ``kvx_validate_cache_desc``;
- ``expected_write(case) -> Result``: status and the full flat K/V cache storage after
  ``kvx_write_kv``;
- ``expected_gather(case) -> Result``: status and the full flat K/V output storage after
  ``kvx_gather_kv``.

``Result.rule`` names the rule (``rules.RULES``) that decided a non-OK status.
Descriptor problems are decided from the C structs the provider would receive
(``cview``), in R-ORDER; ``violations(case)`` lists every descriptor rule a case
breaks, for single-rule negative tests.
"""
from __future__ import annotations

from kvx_conformance.abi.header import Memory, Status
from kvx_conformance.cases.case import CacheCase, GatherCase, Result, ValidateCase, WriteCase

from .cview import CaseError, gather_view, validate_view, write_view
from .gather import expected_gather
from .rules import RULES, Rule
from .validate import all_descriptor_violations, descriptor_violations
from .write import expected_write

__all__ = [
    "CaseError",
    "RULES",
    "Rule",
    "expected_gather",
    "expected_validate",
    "expected_write",
    "expected",
    "violations",
]


def expected_validate(case: ValidateCase | CacheCase, memory: Memory = Memory.HOST) -> Result:
    view = validate_view(case, memory)
    found = descriptor_violations(view, "validate")
    if found:
        return Result(int(RULES[found[0]].status), {}, rule=found[0])
    return Result(int(Status.OK), {})


def expected(case, memory: Memory = Memory.HOST, memory_supported: bool = True, served: tuple[str, ...] = ()) -> Result:
    """The oracle's answer for any case kind (``served``: UNSUPPORTED rules read as served)."""
    if isinstance(case, WriteCase):
        return expected_write(case, memory, memory_supported, served)
    if isinstance(case, GatherCase):
        return expected_gather(case, memory, memory_supported, served)
    return expected_validate(case, memory)


def violations(case, memory: Memory = Memory.HOST) -> list[str]:
    """Every descriptor rule (steps 1-3) the case breaks, plus the data rule deciding step 5.

    A case built to break exactly one rule yields exactly that rule's id.
    """
    if isinstance(case, WriteCase):
        found = all_descriptor_violations(write_view(case, memory), "write")
    elif isinstance(case, GatherCase):
        found = all_descriptor_violations(gather_view(case, memory), "gather")
    else:
        found = all_descriptor_violations(validate_view(case, memory), "validate")
    if found or isinstance(case, (ValidateCase, CacheCase)):
        return found
    rule = expected(case, memory).rule
    return [rule] if rule else []
