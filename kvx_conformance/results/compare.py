"""``kvx-conform compare BASE NEW`` on two conformance results.json files: what changed, by test id.

Tests are matched by stable id. Every test whose outcome differs is listed once, in
one of these groups:

- ``newly_failing``: NEW is fail / crash / timeout / error, BASE was not;
- ``newly_passing``: NEW passes, BASE did not;
- ``flaky``: NEW's outcome is ``flaky`` (failed, then passed on a re-run) and BASE's was not;
- ``changed``: any other change (e.g. pass -> unsupported, fail -> crash, skip -> pass is
  newly passing, pass -> skip is here);
- ``added`` / ``removed``: ids in only one of the files (their outcomes are listed).

The gate (exit 1): a test that passed in BASE now fails, crashes, times out or errors
(any level), or a *required* test that passed in BASE does not pass in NEW (skip and
unsupported included), unless NEW waives it; ``--fail-on-flaky`` adds tests that turned
flaky. A verdict that went from certified to not certified is printed beside it. Exit
0 otherwise, 9 for a file that is not a results file (docs/exit-codes.md).
"""
from __future__ import annotations

import json
import sys

from .record import KIND, load_results

BAD = ("fail", "crash", "timeout", "error")
FLAKY = "flaky"
GROUPS = ("newly_failing", "newly_passing", "flaky", "changed", "added", "removed")


def is_conformance_results(path: str) -> bool:
    """True when ``path`` is a kvx-conform conformance results.json (not a bench file)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("kind") == KIND


def _by_id(doc: dict) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for t in doc.get("tests", []):
        out.setdefault(t["id"], t)
    return out


def compare_results(base: dict, new: dict, *, fail_on_flaky: bool = False) -> dict:
    b, n = _by_id(base), _by_id(new)
    res: dict = {g: [] for g in GROUPS}
    gate: list[dict] = []
    for tid in sorted(set(b) | set(n)):
        bt, nt = b.get(tid), n.get(tid)
        if bt is None:
            res["added"].append({"id": tid, "new": nt["outcome"], "level": nt.get("level")})
            continue
        if nt is None:
            res["removed"].append({"id": tid, "base": bt["outcome"], "level": bt.get("level")})
            continue
        bo, no = bt["outcome"], nt["outcome"]
        if bo == no:
            continue
        row = {"id": tid, "base": bo, "new": no, "level": nt.get("level") or bt.get("level"),
               "profile": nt.get("profile"), "waived": nt.get("waived")}
        if no in BAD and bo not in BAD:
            res["newly_failing"].append(row)
        elif no == "pass":
            res["newly_passing"].append(row)
        elif no == FLAKY:
            res["flaky"].append(row)
        else:
            res["changed"].append(row)
        if bo == "pass" and not row["waived"] and (
                no in BAD or (row["level"] == "required" and no not in ("pass", FLAKY))
                or (fail_on_flaky and no == FLAKY)):
            gate.append(row)
    res["regressions"] = gate
    res["verdict"] = {"base": base.get("verdict"), "new": new.get("verdict")}
    res["verdict_regressed"] = base.get("verdict") == "certified" and new.get("verdict") != "certified"
    res["provider"] = {"base": (base.get("provider") or {}).get("sha256"),
                       "new": (new.get("provider") or {}).get("sha256")}
    return res


def main(args) -> int:
    """The conformance half of ``kvx-conform compare`` (bench/compare.py hands over)."""
    try:
        base, new = load_results(args.base), load_results(args.new)
    except ValueError as e:
        print(f"kvx-conform: {e}", file=sys.stderr)
        return 9
    res = compare_results(base, new, fail_on_flaky=getattr(args, "fail_on_flaky", False))
    if getattr(args, "json", False):
        print(json.dumps(res, indent=1))
    else:
        titles = {"newly_failing": "newly failing", "newly_passing": "newly passing", "flaky": "flaky",
                  "changed": "changed", "added": "added (only in NEW)", "removed": "removed (only in BASE)"}
        for g in GROUPS:
            rows = res[g]
            if not rows:
                continue
            print(f"== {titles[g]}: {len(rows)}")
            for r in rows:
                if g == "added":
                    print(f"  {r['id']}  {r['new']}")
                elif g == "removed":
                    print(f"  {r['id']}  {r['base']}")
                else:
                    flag = "  REGRESSION" if r in res["regressions"] else ""
                    waived = f"  [waived: {r['waived']}]" if r.get("waived") else ""
                    print(f"  {r['id']}  {r['base']} -> {r['new']}  ({r['level']}){waived}{flag}")
        v = res["verdict"]
        print(f"verdict: {v['base']} -> {v['new']}" + ("  (REGRESSED)" if res["verdict_regressed"] else ""))
        changed = sum(len(res[g]) for g in GROUPS)
        print(f"{changed} test(s) changed, {len(res['regressions'])} regression(s)")
    return 1 if res["regressions"] or res["verdict_regressed"] else 0
