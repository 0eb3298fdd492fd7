"""``kvx-conform verify CERTIFICATE``: does a certificate still describe what is installed?

A certificate (``certificate.json``, written by ``kvx-conform run``) binds a verdict to
the sha256 of the provider binary and to a hash of the suite files plus the harness
version (``certificate.suites_hash``). ``verify`` re-hashes both here and compares:

- the provider at ``--provider`` (default: the path the certificate names);
- the suites the certificate names (``suites.source``, default the installed
  ``kvx_conformance.suites``) with the *installed* harness version;
- that the certificate certifies: verdict ``certified``, a certifying (full, not quick)
  run, and every claimed profile certified.

Each mismatch is one line on stdout. The certificate is not signed: verify proves
that a certificate matches a binary and a suite, not who wrote it.

Exit status: 0 valid; 1 mismatch (changed provider or suite, or not a certification);
3 the provider file does not exist; 9 the certificate is missing, unreadable or not a
kvx-conform certificate (docs/exit-codes.md).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import __version__
from ..abi.loader import EXIT_BAD_INPUT_FILE, EXIT_CERTIFIED, EXIT_NOT_CERTIFIED, EXIT_NOT_FOUND, sha256_of

EXIT_VALID = EXIT_CERTIFIED  # 0
EXIT_MISMATCH = EXIT_NOT_CERTIFIED  # 1
CERTIFICATE_KIND = "kvx-conform-certificate"
SUPPORTED_SCHEMA_MAJOR = "1"


class CertificateError(Exception):
    """A certificate that cannot be checked at all; ``str(e)`` is one line."""


def load_certificate(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise CertificateError(f"certificate not found: {path}")
    try:
        cert = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CertificateError(f"cannot read certificate {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(cert, dict) or cert.get("kind") != CERTIFICATE_KIND:
        raise CertificateError(f"{path} is not a kvx-conform certificate (kind != {CERTIFICATE_KIND!r})")
    schema = str(cert.get("certificate_schema", ""))
    if schema.split(".")[0] != SUPPORTED_SCHEMA_MAJOR:
        raise CertificateError(f"{path}: certificate schema {schema or '?'} is not supported "
                               f"(this kvx-conform reads {SUPPORTED_SCHEMA_MAJOR}.x)")
    for key in ("provider", "suites"):
        if not isinstance(cert.get(key), dict) or not cert[key].get("sha256"):
            raise CertificateError(f"{path}: the certificate has no {key}.sha256")
    return cert


def check_certificate(cert: dict, provider: str | None = None, suite: str | None = None) -> tuple[list[str], dict]:
    """(mismatch lines, facts). Raises FileNotFoundError when the provider file is missing."""
    from ..results.certificate import SUITE_PACKAGE, suite_root, suites_hash

    problems: list[str] = []
    prov = cert["provider"]
    path = provider or prov.get("path")
    if not path:
        raise CertificateError("the certificate names no provider path; pass --provider")
    if not Path(path).is_file():
        raise FileNotFoundError(path)
    got = sha256_of(path)
    if got != prov["sha256"]:
        problems.append(f"provider changed: {path} has sha256 {got}, the certificate was issued for "
                        f"{prov['sha256']}")

    source = suite or (cert["suites"].get("source") or SUITE_PACKAGE)
    root = suite_root(source)
    cert_version = (cert.get("harness") or {}).get("version")
    if root is None:
        problems.append(f"suite changed: {source} is not installed here (cannot re-hash it)")
        suite_got = None
    else:
        suite_got = suites_hash(root)
        if suite_got != cert["suites"]["sha256"]:
            why = (f" (certificate from kvx-conform {cert_version}, this is {__version__})"
                   if cert_version and cert_version != __version__ else "")
            problems.append(f"suite changed: {source} at {root} hashes to {suite_got}, the certificate was "
                            f"issued for {cert['suites']['sha256']}{why}")

    verdict = cert.get("verdict")
    if verdict != "certified":
        problems.append(f"not a certification: verdict is {verdict!r}")
    elif not cert.get("certifying") or cert.get("quick") or not cert.get("complete"):
        problems.append("not a certification: a quick, partial or incomplete run")
    else:
        profiles = cert.get("profiles") or {}
        for name in cert.get("claimed_profiles") or []:
            pv = (profiles.get(name) or {}).get("verdict")
            if pv != "certified":
                problems.append(f"not a certification: claimed profile {name} is {pv or 'missing'}")
    facts = {"provider": {"path": str(path), "sha256": got, "certified_sha256": prov["sha256"]},
             "suites": {"source": source, "root": str(root) if root else None, "sha256": suite_got,
                        "certified_sha256": cert["suites"]["sha256"]},
             "harness": {"installed": __version__, "certified": cert_version},
             "verdict": verdict, "claimed_profiles": cert.get("claimed_profiles") or [],
             "waivers": len(cert.get("waivers") or []), "date": cert.get("date")}
    return problems, facts


class VerifyCommand:
    name = "verify"

    @staticmethod
    def add_parser(sub) -> argparse.ArgumentParser:
        p = sub.add_parser(
            "verify", help="re-hash the provider and the suites and check a certificate",
            formatter_class=argparse.RawDescriptionHelpFormatter,
            description=(
                "Check that CERTIFICATE (certificate.json from `kvx-conform run`) still describes what is here:\n"
                "the provider's sha256, the hash of the installed suites and harness version, and a certified\n"
                "verdict from a full run. Each mismatch is printed on one line.\n\n"
                "Exit status: 0 valid, 1 mismatch (changed provider or suite, or not a certification),\n"
                "3 provider file not found, 9 certificate missing or unreadable (docs/exit-codes.md)."),
            epilog=("examples:\n"
                    "  kvx-conform verify kvx-results/certificate.json\n"
                    "  kvx-conform verify certificate.json --provider build/libacme_kvx.so\n"
                    "  kvx-conform verify certificate.json --json\n"),
        )
        p.add_argument("certificate", help="certificate.json written by kvx-conform run")
        p.add_argument("--provider", metavar="PATH",
                       help="provider to check (default: the path recorded in the certificate)")
        p.add_argument("--suite", metavar="SUITE",
                       help="suite package or directory to re-hash (default: the one the certificate names)")
        p.add_argument("--json", action="store_true", help="print the findings as JSON")
        return p

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        try:
            cert = load_certificate(args.certificate)
            problems, facts = check_certificate(cert, provider=args.provider, suite=args.suite)
        except CertificateError as e:
            print(f"kvx-conform: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT_FILE
        except FileNotFoundError as e:
            print(f"kvx-conform: provider not found: {e}", file=sys.stderr)
            return EXIT_NOT_FOUND
        if args.json:
            print(json.dumps({"valid": not problems, "problems": problems, **facts}, indent=1))
        else:
            for line in problems:
                print(line)
            if not problems:
                print(f"valid: {facts['provider']['path']} (sha256 {facts['provider']['sha256'][:16]}...) is "
                      f"certified for {', '.join(facts['claimed_profiles']) or 'no profile'} by suite "
                      f"{facts['suites']['source']} (kvx-conform {__version__}); "
                      f"{facts['waivers']} waiver(s); issued {facts['date']}")
        return EXIT_MISMATCH if problems else EXIT_VALID
