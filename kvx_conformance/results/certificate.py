"""certificate.json: what a run certifies, bound to the exact provider and suites.

The certificate names the provider by its sha256 and the suites by a hash over the
installed suite files plus the harness version, so a certificate cannot be carried
over to a different binary or a different suite. It lists the verdict per profile,
every waiver applied (a waived required failure is certified *with* that waiver
printed), every warning (recommended failures), and the quick/partial flags.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from pathlib import Path

from .. import __version__
from .record import _atomic_write_json, now_iso

CERTIFICATE_SCHEMA = "1.0"
SUITE_PACKAGE = "kvx_conformance.suites"
_HASHED_SUFFIXES = {".py", ".json", ".yaml", ".yml", ".toml", ".txt", ".npz", ".npy"}


def suite_root(suite: str = SUITE_PACKAGE) -> Path | None:
    """Directory of a suite given as a package name or a path (None if neither resolves)."""
    p = Path(suite)
    if p.exists():
        return p.resolve() if p.is_dir() else p.resolve().parent
    try:
        spec = importlib.util.find_spec(suite)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]).resolve()
    return Path(spec.origin).resolve().parent if spec.origin else None


def suites_hash(root: Path | None, harness_version: str = __version__) -> str:
    """sha256 over every suite file (relative path and bytes, in sorted order) and the harness version."""
    h = hashlib.sha256()
    h.update(f"kvx-conform {harness_version}\n".encode())
    if root is not None:
        files = sorted(
            f for f in root.rglob("*")
            if f.is_file() and f.suffix in _HASHED_SUFFIXES and "__pycache__" not in f.parts
        )
        for f in files:
            rel = f.relative_to(root).as_posix()
            h.update(f"{rel}\n{f.stat().st_size}\n".encode())
            h.update(f.read_bytes())
    return h.hexdigest()


#: how the coverage line names optional features (outcomes.OPTIONAL_FEATURES keys)
FEATURE_LABELS = {
    "hnd_packed": "HND_PACKED", "ragged": "RAGGED", "kv_offsets": "KV_OFFSETS", "custom_layout": "CUSTOM layout",
    "nhd": "NHD", "hnd": "HND", "fp8": "FP8", "fp4": "FP4", "mixed_io_dtype": "conversion",
    "host_memory": "host memory", "device_memory": "device memory", "unified_memory": "unified memory",
}
_UNSUPPORTED_MSG = re.compile(r"^UNSUPPORTED \(([^)]*)\)")


def refused_features(results: dict) -> list[str]:
    """The optional features the run's UNSUPPORTED outcomes refused.

    Each such test names the features its case exercises (the answer is excused by any
    unclaimed one of them); the refused features are the fewest that explain every
    UNSUPPORTED outcome: first the features some refused test declares as its own, the
    one explaining most outcomes first, on a tie the one more tests declare (a 4-D RAGGED gather refused is put down to
    RAGGED once RAGGED explains other refusals too)."""
    cands: list[tuple[set[str], set[str]]] = []  # (the case's features, the test's own)
    for t in results.get("tests", []):
        if t.get("outcome") != "unsupported":
            continue
        m = _UNSUPPORTED_MSG.match(t.get("message") or "")
        feats = {f.strip() for f in m.group(1).split(",") if f.strip()} if m else set()
        f = t.get("feature")
        own = {f} if isinstance(f, str) else set(f or ())
        feats |= own
        if feats:
            cands.append((feats, own))
    order = {f: i for i, f in enumerate(FEATURE_LABELS)}
    out: list[str] = []
    while cands:
        count: dict[str, int] = {}
        declared: dict[str, int] = {}
        for c, own in cands:
            for f in c:
                count[f] = count.get(f, 0) + 1
            for f in own:
                declared[f] = declared.get(f, 0) + 1
        best = min(count, key=lambda f: (f not in declared, -count[f], -declared.get(f, 0),
                                          order.get(f, len(order)), f))
        out.append(best)
        cands = [(c, own) for c, own in cands if best not in c]
    return sorted(out, key=lambda f: (order.get(f, len(order)), f))


def coverage(results: dict) -> str:
    """One line: the verdict, the memory types it was earned on, and the optional features
    the provider refused, e.g. "certified on device memory; refused: HND_PACKED, RAGGED, FP8 (in part)"."""
    verdict = str(results.get("verdict") or "unknown")
    mem = results.get("memory_types") or [(results.get("config") or {}).get("memory") or "?"]
    served = {t.get("feature") for t in results.get("tests", []) if t.get("outcome") == "pass"}
    # a feature whose own tests also passed was refused in part (e.g. one optional form of it)
    refused = [FEATURE_LABELS.get(f, f) + (" (in part)" if f in served else "") for f in refused_features(results)]
    return (f"{verdict} on {' and '.join(mem)} memory; "
            + (f"refused: {', '.join(refused)}" if refused else "nothing refused"))


def build_certificate(results: dict) -> dict:
    prov = results.get("provider", {}) or {}
    cfg = results.get("config", {}) or {}
    profiles = results.get("profiles", {}) or {}
    waivers = [w for w in results.get("waivers", []) if w.get("applied_to")]
    return {
        "coverage": coverage(results),
        "certificate_schema": CERTIFICATE_SCHEMA,
        "kind": "kvx-conform-certificate",
        "date": now_iso(),
        "verdict": results.get("verdict"),
        "certifying": results.get("certifying", False),
        "quick": bool(results.get("quick")),
        "complete": bool(results.get("complete")),
        "note": None if results.get("certifying") else
        "NOT CERTIFYING: a quick or partial run; run the full suite to certify",
        "claimed_profiles": (results.get("claims") or {}).get("profiles", []),
        "claimed_features": (results.get("claims") or {}).get("features", []),
        "claims_explicit": bool((results.get("claims") or {}).get("explicit")),
        "not_claimed_profiles": results.get("not_claimed", (results.get("claims") or {}).get("not_claimed", [])),
        "not_served_profiles": results.get("not_served", []),
        "profiles": {name: {"verdict": p.get("verdict"), "claimed": p.get("claimed"), "served": p.get("served"),
                            "required": p.get("required"), "required_passed": p.get("required_passed"),
                            "waived": p.get("waived", []), "warnings": len(p.get("warnings", []))}
                     for name, p in profiles.items()},
        "provider": {"path": prov.get("path"), "sha256": prov.get("sha256"),
                     "abi_version": prov.get("abi_version")},
        "suites": {"source": cfg.get("suite"), "sha256": cfg.get("suites_hash")},
        "harness": results.get("harness"),
        "memory_types": results.get("memory_types", []),
        "refused_features": refused_features(results),
        "counts": results.get("counts", {}),
        "waivers": [{"id": w["id"], "reason": w["reason"], "applied_to": w["applied_to"]} for w in waivers],
        "warnings": results.get("warnings", []),
        "informational_failures": [t["id"] for t in results.get("tests", []) if t.get("level") == "informational"
                                   and t.get("outcome") in ("fail", "crash", "timeout", "error", "flaky")],
        "breaker": {e: b.get("message") for e, b in (results.get("breaker") or {}).items() if b.get("tripped")},
    }


def write_certificate(results: dict, path: str | os.PathLike) -> dict:
    cert = build_certificate(results)
    _atomic_write_json(Path(path), cert)
    return cert
