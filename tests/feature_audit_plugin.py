"""pytest plugin for tests/test_required_features.py: records, for every VALID call a
conformance test holds against the oracle (``checks._judge`` with an oracle answer of OK),
the test's metadata and the optional features the case uses (``checks.refusable_features``
with both core layouts counted as required). Writes JSON lines to $KVX_FEATURE_AUDIT."""
from __future__ import annotations

import json
import os

import pytest

from kvx_conformance.abi.header import Status
from kvx_conformance.cases import checks
from kvx_conformance.harness.plugin import item_meta

_CURRENT: dict = {}
_OUT = os.environ.get("KVX_FEATURE_AUDIT")
_orig_judge = checks._judge


def _judge(got, expected, case, opts, **kw):
    meta = _CURRENT.get("meta")
    if meta is not None and _OUT and int(expected.status) == Status.OK:
        with open(_OUT, "a", encoding="utf-8") as f:
            f.write(json.dumps({"id": meta["id"], "level": meta["level"], "profile": meta["profile"],
                                "declared": meta["feature"], "passed": kw.get("feature"),
                                "features": list(checks.refusable_features(case))}) + "\n")
    return _orig_judge(got, expected, case, opts, **kw)


checks._judge = _judge


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _CURRENT["meta"] = item_meta(item, None)
    yield
    _CURRENT.pop("meta", None)
