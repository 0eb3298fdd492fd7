"""Shards: a deterministic, balanced part of the suite for one CI machine.

``kvx-conform run --shard K/N`` keeps the K-th of N parts of the *full selection* (the
tests a run with the same settings would run: after ``--profile``, ``--id``, ``-k``,
``--quick`` and the memory type). Every process that computes the split computes the
same one:

- the selection is ordered by (stable id, pytest node id);
- without durations, test ``i`` of that order goes to part ``i % N`` (counts differ by
  at most one);
- with ``--durations-from results.json`` (a previous run, full or merged), the longest
  test first goes to the part with the least recorded time so far (ties: the lowest
  part); a test the file does not know counts as the median known duration.

A shard's results.json carries ``shard``: K, N, the full selection's size and a sha256
of its node ids, the balance and the durations file's sha256, so that
``kvx-conform merge`` can prove that the parts cover the selection exactly once.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path


class ShardSpecError(ValueError):
    """A ``--shard`` or ``--durations-from`` value that cannot be used; ``str(e)`` is one line."""


def parse_shard(spec: str) -> tuple[int, int]:
    """``"K/N"`` -> (K, N), 1 <= K <= N."""
    try:
        k_s, n_s = spec.split("/")
        k, n = int(k_s), int(n_s)
    except ValueError:
        raise ShardSpecError(f"--shard {spec!r}: write K/N, e.g. 2/3 (the second of three parts)") from None
    if n < 1 or not 1 <= k <= n:
        raise ShardSpecError(f"--shard {spec!r}: K must be between 1 and N (N >= 1)")
    return k, n


def selection_hash(nodeids) -> str:
    h = hashlib.sha256()
    for n in sorted(nodeids):
        h.update(n.encode("utf-8") + b"\n")
    return h.hexdigest()


def load_durations(path: str | Path) -> tuple[dict[str, float], str]:
    """({test id or node id: seconds}, sha256 of the file) from a results.json."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        doc = json.loads(raw)
    except FileNotFoundError:
        raise ShardSpecError(f"--durations-from {path}: file not found") from None
    except (OSError, ValueError) as e:
        raise ShardSpecError(f"--durations-from {path}: cannot read it ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tests"), list):
        raise ShardSpecError(f"--durations-from {path}: not a kvx-conform results.json (no tests list)")
    out: dict[str, float] = {}
    for t in doc["tests"]:
        try:
            d = float(t.get("duration") or 0.0)
        except (TypeError, ValueError):
            continue
        for key in (t.get("nodeid"), t.get("id")):
            if key:
                out[key] = d
    return out, hashlib.sha256(raw).hexdigest()


def _order(tests: list[tuple[str, str]]) -> list[int]:
    return sorted(range(len(tests)), key=lambda i: (tests[i][0], tests[i][1]))


def partition(tests: list[tuple[str, str]], n: int, durations: dict[str, float] | None = None) -> list[int]:
    """The part (0-based) of each test; ``tests`` are (stable id, node id) pairs."""
    order = _order(tests)
    parts = [0] * len(tests)
    if not durations:
        for pos, i in enumerate(order):
            parts[i] = pos % n
        return parts
    known = sorted(v for v in (durations.get(t[1], durations.get(t[0])) for t in tests) if v is not None)
    fill = known[len(known) // 2] if known else 1.0
    cost = [durations.get(nid, durations.get(tid, fill)) for tid, nid in tests]
    load = [0.0] * n
    count = [0] * n
    # longest first; equal costs keep the stable order
    for i in sorted(order, key=lambda i: -cost[i]):
        p = min(range(n), key=lambda j: (load[j], count[j], j))
        parts[i] = p
        load[p] += cost[i]
        count[p] += 1
    return parts


def select(tests: list[tuple[str, str]], k: int, n: int, durations: dict[str, float] | None = None,
           durations_sha256: str | None = None, durations_path: str | None = None) -> tuple[list[int], dict]:
    """(indexes of ``tests`` in part K of N, the ``shard`` record for results.json)."""
    parts = partition(tests, n, durations)
    keep = [i for i, p in enumerate(parts) if p == k - 1]
    est = None
    if durations:
        known = sorted(durations.values())
        fill = known[len(known) // 2] if known else 1.0
        est = round(sum(durations.get(tests[i][1], durations.get(tests[i][0], fill)) for i in keep), 3)
    info = {
        "index": k, "count": n,
        "selection": {"tests": len(tests), "sha256": selection_hash(t[1] for t in tests)},
        "tests": len(keep),
        "balance": "durations" if durations else "count",
        "durations_from": ({"path": durations_path, "sha256": durations_sha256} if durations else None),
        "estimated_s": est,
    }
    return keep, info
