"""Per-engine verdicts of the engine-shaped scenario suites (``suites/engine``).

Engine scenarios have stable ids ``engine.<engine>.<family>.<step>`` (for example
``engine.vllm.paged.decode[llama3_8b]``). :func:`summarize_engines` groups finished
tests by ``<engine>`` and answers, per engine, "does this provider work with the
engine's caches": the ``engines`` key of results.json and the "Engines" section of
the HTML report.

``works`` is one of:

- ``"yes"``: every scenario that ran passed;
- ``"no"``: at least one scenario failed, crashed, timed out or hit a harness error
  (listed in ``failing``, waived ones included and marked);
- ``"partly"``: nothing failed, but the provider answered UNSUPPORTED for some
  scenarios (an optional feature it does not claim, listed in ``unsupported``) or some
  were skipped (``skipped``);
- ``"not run"``: no scenario of the engine ran.

Scenarios that KVX v1.1 itself cannot express (an adapter refusal, such as
TensorRT-LLM's cyclic cache) are recorded as informational skips whose message starts
with :data:`NOT_EXPRESSIBLE`; they are listed in ``not_expressible`` and never count
against the provider. ``where_not`` names the scenario families (``paged``,
``kv_offsets``, ...) of the failing and unsupported scenarios.
"""
from __future__ import annotations

from typing import Any, Iterable

#: engine key in the stable id -> display name
ENGINES = {
    "vllm": "vLLM",
    "tgi": "TGI",
    "trtllm": "TensorRT-LLM",
    "flashinfer": "FlashInfer",
    "ppl": "ppl.nn",
}
ID_PREFIX = "engine."
#: message prefix of the skip that records an adapter refusal
NOT_EXPRESSIBLE = "not expressible in KVX v1.1"

_BAD = ("fail", "crash", "timeout", "error", "flaky")


def _get(t: Any, key: str, default=None):
    return t.get(key, default) if isinstance(t, dict) else getattr(t, key, default)


def _first_line(text: str | None) -> str:
    t = (text or "").strip()
    return t.splitlines()[0] if t else ""


def engine_of(test_id: str) -> str | None:
    """``"vllm"`` for ``engine.vllm.paged.decode[...]``; None for other ids."""
    if not test_id.startswith(ID_PREFIX):
        return None
    return test_id[len(ID_PREFIX):].split(".", 1)[0].split("[", 1)[0] or None


def family_of(test_id: str) -> str:
    """``"paged"`` for ``engine.vllm.paged.decode[...]``."""
    parts = test_id.split("[", 1)[0].split(".")
    return parts[2] if len(parts) > 2 else ""


def is_not_expressible(t: Any) -> bool:
    return _get(t, "outcome") == "skip" and (_get(t, "message") or "").lstrip().startswith(NOT_EXPRESSIBLE)


def summarize_engines(tests: Iterable[Any]) -> dict[str, dict]:
    """Per-engine summary of engine scenario records (TestRecord objects or results.json dicts).

    Returns ``{}`` when no engine scenario ran, so runs without the engine suites
    carry an empty ``engines`` key.
    """
    groups: dict[str, list] = {}
    for t in tests:
        eng = engine_of(str(_get(t, "id", "")))
        if eng is not None:
            groups.setdefault(eng, []).append(t)
    out: dict[str, dict] = {}
    order = [e for e in ENGINES if e in groups] + sorted(set(groups) - set(ENGINES))
    for eng in order:
        mine = sorted(groups[eng], key=lambda t: str(_get(t, "id")))
        failing, unsupported, skipped, refused = [], [], [], []
        passed = 0
        for t in mine:
            o = _get(t, "outcome")
            row = {"id": _get(t, "id"), "outcome": o, "level": _get(t, "level"),
                   "message": _first_line(_get(t, "message"))[:300]}
            if o == "pass":
                passed += 1
            elif o in _BAD:
                row["waived"] = _get(t, "waived")
                failing.append(row)
            elif o == "unsupported":
                unsupported.append(row)
            elif is_not_expressible(t):
                refused.append({"id": row["id"], "reason": row["message"][len(NOT_EXPRESSIBLE):].lstrip(" :")})
            else:
                skipped.append(row)
        ran = passed + len(failing) + len(unsupported)
        if failing:
            works = "no"
        elif ran == 0:
            works = "not run"
        elif unsupported or skipped:
            works = "partly"
        else:
            works = "yes"
        where = []
        for row in failing + unsupported:
            f = family_of(row["id"])
            if f and f not in where:
                where.append(f)
        out[eng] = {
            "name": ENGINES.get(eng, eng),
            "works": works,
            "scenarios": len(mine) - len(refused),
            "passed": passed,
            "failing": failing,
            "unsupported": unsupported,
            "skipped": skipped,
            "not_expressible": refused,
            "where_not": where,
        }
    return out
