"""Bit-exact comparison of two call results, shared by the differential tests
(oracle vs host provider, oracle vs CUDA provider)."""
from __future__ import annotations

import numpy as np

from kvx_conformance.abi.dtypes import bits_view
from kvx_conformance.abi.loader import status_name
from kvx_conformance.cases.case import Result


def compare(exp: Result, got: Result) -> str:
    """'' when identical (status, every element's bits, guards), else what differs."""
    problems = []
    if got.status != exp.status:
        problems.append(f"status: expected {status_name(exp.status)} ({exp.rule or 'OK'}), "
                        f"got {status_name(got.status)}")
    for name, want in exp.arrays.items():
        have = got.arrays.get(name)
        a, b = bits_view(want), bits_view(have)
        if a.shape != b.shape:
            problems.append(f"{name}: {b.shape[0]} elements, expected {a.shape[0]}")
            continue
        bad = np.nonzero(a != b)[0]
        if bad.size:
            problems.append(
                f"{name}: {bad.size} element(s) differ, first at {bad[:6].tolist()}: expected bits "
                f"{[hex(int(x)) for x in a[bad[:6]]]} ({want[bad[:6]].tolist()}), got "
                f"{[hex(int(x)) for x in b[bad[:6]]]} ({have[bad[:6]].tolist()})"
            )
    problems += got.guard_violations
    return "; ".join(problems)
