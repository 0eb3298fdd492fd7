"""Vendor input files: the claims file (what a provider says it supports) and the
expectations file (waivers for known failures).

Both are YAML or JSON (chosen by content: JSON is tried first, YAML needs pyyaml).

Claims::

    profiles: [core, layouts, tables]     # exactly the profiles to certify (default: DEFAULT_PROFILES)
    opt_in: [fp4_exact]                   # or: the default profiles and these opt-in ones
    features: [ragged, kv_offsets, fp8]   # optional features claimed (OPTIONAL_FEATURES)

With no claims file (or no ``profiles`` key) every profile but the opt-in ones
(:data:`OPT_IN_PROFILES`: the FP4 exact tier) is claimed, so the default certification
covers every MUST; a profile the provider does not serve at all (its optional feature
refused throughout) then reads "not served" and does not block. An opt-in profile's tests
still run and its verdict is reported; it decides the run's verdict only when claimed (a
claims file's ``opt_in:`` or ``profiles:`` naming it, or ``--profile``). ``opt_in:`` adds
opt-in profiles to the default claims and keeps their reading (a claimed profile not served
or not run does not block). A vendor may instead claim a set explicitly (``profiles:``): the
certificate, the report and the console then name the profiles not claimed, and an
explicitly claimed profile that is not served blocks.

The bundled reference provider claims every profile, the opt-in ones included
(``opt_in: [fp4_exact]``): its claims file ships beside this module
(:func:`reference_claims_file`); ``kvx-conform run`` with no provider and no ``--claims``
uses it, and the mutant runs (``harness/mutants.py``, the reference with one defect each)
pass it.

A claimed feature that is refused (UNSUPPORTED, or INVALID_ARGUMENT for a valid call: spec
8 "unsupported field") is a failure; an unclaimed optional feature may be refused.
Expectations::

    waivers:                               # or a bare list
      - id: write.oob_slot.status[S64]     # a stable test id; '*' matches any run of characters
        reason: "ACME-123: returns INVALID_ARGUMENT, fix in 2.4"

A waived required failure does not break certification but is printed on the
certificate; a waiver matching no test is warned about.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .outcomes import OPTIONAL_FEATURES, PROFILES

#: Profiles claimed only on request (a claims file's ``profiles:`` or ``--profile``). The FP4
#: extension has two conformance tiers (product readings, FP4 extension: "Two conformance tiers:
#: 'exact' (codes, scales and decoded values bit-identical to the reference codec) and
#: 'compatible' (each scale within one E4M3 step or one exponent, each decoded value equal to the
#: decode of the reference code or of an adjacent code, and the error metrics within 5% of the
#: reference's)"; docs/spec-readings.md R-FP4): a provider meeting the compatible tier (``fp4``)
#: conforms, and bit-identity (``fp4_exact``) is a claim a vendor makes, not a MUST of the spec.
OPT_IN_PROFILES = ("fp4_exact",)

#: Claimed when the claims file names no profiles (or there is none): every profile but the
#: opt-in ones.
DEFAULT_PROFILES = tuple(p for p in PROFILES if p not in OPT_IN_PROFILES)

#: The bundled reference's claims file (:func:`reference_claims_file`).
REFERENCE_CLAIMS_NAME = "reference-claims.json"


def reference_claims_file() -> Path:
    """The claims of the bundled reference provider (and of its mutants): the default claims
    with every opt-in profile (``opt_in:``; its FP4 codec is the exact tier's definition), no
    optional feature (a refusal stays excused, as for any provider with the default claims)."""
    return Path(__file__).resolve().with_name(REFERENCE_CLAIMS_NAME)


class InputFileError(Exception):
    """A claims / expectations file that cannot be used; ``str(e)`` is one line."""


def _read_structured(path: str | os.PathLike, what: str):
    p = Path(path)
    if not p.exists():
        raise InputFileError(f"{what} file not found: {path}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputFileError(f"cannot read {what} file {path}: {e}") from None
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        import yaml
    except ImportError:
        raise InputFileError(
            f"{what} file {path} is not JSON, and reading YAML needs pyyaml (pip install pyyaml)"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0] if str(e) else "syntax error"
        raise InputFileError(f"{what} file {path} is neither JSON nor valid YAML: {first}") from None


def _string_list(value, key: str, path) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputFileError(f"claims file {path}: '{key}' must be a list of names")
    return list(value)


@dataclass(frozen=True)
class Claims:
    profiles: tuple[str, ...] = DEFAULT_PROFILES
    features: frozenset[str] = frozenset()
    source: str | None = None
    #: the vendor named the profiles (claims file ``profiles:`` or ``--profile``); otherwise
    #: DEFAULT_PROFILES are claimed and one that is not served does not block.
    #: None: explicit when the profiles are not the default set.
    explicit: bool | None = None

    def __post_init__(self):
        if self.explicit is None:
            object.__setattr__(self, "explicit", set(self.profiles) != set(DEFAULT_PROFILES))

    @property
    def not_claimed(self) -> list[str]:
        """Profiles of ``outcomes.PROFILES`` outside the claimed set (the opt-in ones, with
        the default claims): their verdicts are reported and do not decide the run's."""
        return [p for p in PROFILES if p not in self.profiles]

    def to_dict(self) -> dict:
        return {"profiles": list(self.profiles), "features": sorted(self.features), "source": self.source,
                "explicit": self.explicit, "not_claimed": self.not_claimed}

    @classmethod
    def from_dict(cls, d: dict | None) -> "Claims":
        if not d:
            return cls()
        profiles = tuple(d.get("profiles") or DEFAULT_PROFILES)
        return cls(profiles, frozenset(d.get("features") or ()), d.get("source"), d.get("explicit"))


def load_claims(path: str | os.PathLike | None) -> Claims:
    if path is None:
        return Claims()
    data = _read_structured(path, "claims")
    if not isinstance(data, dict):
        raise InputFileError(f"claims file {path}: expected a mapping with 'profiles' and 'features'")
    unknown_keys = set(data) - {"profiles", "opt_in", "features", "provider", "vendor", "notes"}
    if unknown_keys:
        raise InputFileError(f"claims file {path}: unknown key(s) {', '.join(sorted(unknown_keys))}")
    named = _string_list(data.get("profiles"), "profiles", path)
    opt_in = _string_list(data.get("opt_in"), "opt_in", path)
    bad_o = [p for p in opt_in if p not in OPT_IN_PROFILES]
    if bad_o:
        raise InputFileError(f"claims file {path}: 'opt_in' names opt-in profiles only, not "
                             f"{', '.join(bad_o)} (opt-in: {', '.join(OPT_IN_PROFILES)})")
    if named and opt_in:
        raise InputFileError(f"claims file {path}: name either 'profiles' (exactly those) or 'opt_in' "
                             f"(the default profiles and these), not both")
    profiles = named or [*DEFAULT_PROFILES, *opt_in]
    features = _string_list(data.get("features"), "features", path)
    bad_p = [p for p in profiles if p not in PROFILES]
    if bad_p:
        raise InputFileError(
            f"claims file {path}: unknown profile(s) {', '.join(bad_p)} (known: {', '.join(PROFILES)})"
        )
    bad_f = [f for f in features if f not in OPTIONAL_FEATURES]
    if bad_f:
        raise InputFileError(
            f"claims file {path}: unknown feature(s) {', '.join(bad_f)} (known: {', '.join(OPTIONAL_FEATURES)})"
        )
    return Claims(tuple(dict.fromkeys(profiles)), frozenset(features), str(path), explicit=bool(named))


@dataclass(frozen=True)
class Waiver:
    id: str  # exact stable id, or a pattern where '*' matches any run of characters
    reason: str

    def matches(self, test_id: str) -> bool:
        if "*" not in self.id:
            return self.id == test_id
        return _glob_re(self.id).fullmatch(test_id) is not None


def _glob_re(pattern: str) -> re.Pattern:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))


def load_expectations(path: str | os.PathLike | None) -> list[Waiver]:
    if path is None:
        return []
    data = _read_structured(path, "expectations")
    if isinstance(data, dict):
        data = data.get("waivers", data.get("expectations"))
    if data is None:
        return []
    if not isinstance(data, list):
        raise InputFileError(f"expectations file {path}: expected a list of {{id, reason}} entries")
    out: list[Waiver] = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or not entry["id"].strip():
            raise InputFileError(f"expectations file {path}: entry {i + 1} needs an 'id' string")
        reason = entry.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise InputFileError(f"expectations file {path}: entry {i + 1} ({entry['id']}) needs a 'reason'")
        out.append(Waiver(entry["id"].strip(), reason.strip()))
    return out


@dataclass
class WaiverMatch:
    waiver: Waiver
    matched: list[str] = field(default_factory=list)


def match_waivers(waivers: list[Waiver], test_ids) -> tuple[dict[str, Waiver], list[WaiverMatch]]:
    """Map each test id to the first waiver matching it; also return every waiver with its matches."""
    ids = list(test_ids)
    by_id: dict[str, Waiver] = {}
    matches = [WaiverMatch(w) for w in waivers]
    for m in matches:
        for tid in ids:
            if m.waiver.matches(tid):
                m.matched.append(tid)
                by_id.setdefault(tid, m.waiver)
    return by_id, matches
