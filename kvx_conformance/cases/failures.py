"""What a check concludes when a provider's answer is not allowed: the two exceptions of the suites.

Raise :class:`Unsupported` when the provider answered ``KVX_STATUS_UNSUPPORTED`` for the feature
under test, :class:`ConformanceFailure` (via ``kvx_conformance.cases.checks``) for a failure;
:func:`note_served_call` counts the valid calls the provider answered correctly (the
evidence that a profile is served).
``kvx_conformance.results.outcomes`` re-exports them with the rest of the suites' vocabulary.
"""
from __future__ import annotations


_served_calls = [0]


def note_served_call() -> None:
    """Record that the running test's provider answered OK, correctly, to a valid write or
    gather (called by the checks): the evidence that a profile was served (results)."""
    _served_calls[0] += 1


def take_served_calls() -> int:
    """The served calls noted since the last take (the plugin takes them per test phase)."""
    n, _served_calls[0] = _served_calls[0], 0
    return n


class Unsupported(Exception):
    """The provider refused a case using ``feature``: a key of OPTIONAL_FEATURES, a tuple of
    them (the refusal is acceptable when any of them is unclaimed), or None (required
    behaviour: never acceptable). ``refused_with`` is the status of the refusal:
    ``"UNSUPPORTED"``, or ``"INVALID_ARGUMENT"`` (spec 8: "unsupported field") for a call the
    oracle answers OK."""

    def __init__(self, message: str, feature: str | tuple[str, ...] | None = None,
                 refused_with: str = "UNSUPPORTED"):
        super().__init__(message)
        self.feature = feature
        self.refused_with = refused_with


class ConformanceFailure(AssertionError):
    """A provider's answer that the spec (as read in docs/spec-readings.md) does not allow."""

    def __init__(self, what: str, *, expected: str, got: str, clause: str, case: str = "", seed: int | None = None):
        self.what, self.expected, self.got, self.clause, self.case, self.seed = what, expected, got, clause, case, seed
        lines = [what, f"  expected: {expected}", f"  got:      {got}", f"  clause:   {clause}"]
        if seed is not None:
            lines.append(f"  seed:     {seed}")
        if case:
            lines.append(f"  case:     {case}")
        super().__init__("\n".join(lines))
