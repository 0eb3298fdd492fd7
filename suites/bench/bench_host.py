"""Host-memory bandwidth benchmarks, timed by pytest-benchmark.

Not a conformance suite (its name does not match ``test_*.py``, so ``kvx-conform run``
never collects it): ``kvx-conform bench --memory host`` writes a plan (provider,
reference, cases of the preset) and runs this file with ``--benchmark-json``; each
case is one pytest-benchmark benchmark per implementation (provider, bundled
reference, numpy peer), plus the host memcpy roofline. After timing, the verified sets'
results are zeroed and their calls made once more (repeats, as the timed calls were), then
held against the numpy oracle; the outcome goes to ``extra_info``.

Run by hand: ``KVX_BENCH_PLAN=plan.json pytest -p pytest_benchmark.plugin suites/bench/bench_host.py``.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from kvx_conformance.bench.peers import numpy_peer
from kvx_conformance.bench.prepare import prepare
from kvx_conformance.bench.run import case_seed, label_verified
from kvx_conformance.bench.sweep import BenchCase

_PLAN_PATH = os.environ.get("KVX_BENCH_PLAN")
if not _PLAN_PATH:
    pytest.skip("KVX_BENCH_PLAN is not set: run through `kvx-conform bench --memory host`", allow_module_level=True)
with open(_PLAN_PATH, encoding="utf-8") as _f:
    PLAN = json.load(_f)

#: host last-level cache assumed for rotation (bytes)
HOST_LLC = 32 << 20
ROOFLINE_BYTES = 256 << 20
_PROVIDERS: dict = {}


def _provider(path: str):
    from kvx_conformance.abi.loader import load_provider

    if path not in _PROVIDERS:
        _PROVIDERS[path] = load_provider(path)
    return _PROVIDERS[path]


def _params():
    impls = ["provider"] + (["reference"] if PLAN.get("reference") else []) + (["numpy"] if PLAN.get("peers") else [])
    return [pytest.param(cd, impl, id=f"{impl}:{cd['id']}") for cd in PLAN["cases"] for impl in impls]


def _rounds(fn, budget_s: float = 0.25) -> tuple[int, int]:
    t0 = time.perf_counter()
    fn()
    t = max(time.perf_counter() - t0, 1e-7)
    iterations = max(1, min(100, int(1e-3 / t)))
    rounds = max(3, min(int(PLAN.get("rounds", 7)), int(budget_s / (t * iterations)) + 1))
    return rounds, iterations


def test_host_memcpy(benchmark):
    src = np.frombuffer(np.random.default_rng(0).bytes(ROOFLINE_BYTES), dtype=np.uint8).copy()
    dst = np.empty_like(src)
    benchmark.extra_info.update(kind="roofline", bytes=ROOFLINE_BYTES)
    benchmark.pedantic(np.copyto, args=(dst, src), rounds=max(3, int(PLAN.get("rounds", 7))), iterations=1,
                       warmup_rounds=1)
    benchmark.extra_info["verified"] = bool(np.array_equal(src, dst))


@pytest.mark.parametrize("case_dict,impl", _params())
def test_bench(benchmark, case_dict, impl):
    case = BenchCase.from_dict(case_dict)
    pr = prepare(case, seed=case_seed(case), last_level_cache=HOST_LLC)
    benchmark.extra_info.update(case=case.id, impl=impl, nsets=pr.nsets)
    if impl == "numpy":
        fn, what = numpy_peer(pr)
        benchmark.extra_info["what"] = what
        if fn is None:
            pytest.skip(f"numpy peer: {what}")
        call = fn
    else:
        prov = _provider(PLAN["provider"] if impl == "provider" else PLAN["reference"])
        st = pr.call(prov, 0)
        benchmark.extra_info["status"] = int(st)
        if st != 0:  # not timed: kvx-conform bench tells a refusal from an error (docs/benchmarks.md)
            if PLAN.get("status_log"):
                with open(PLAN["status_log"], "a", encoding="utf-8") as f:
                    f.write(json.dumps({"case": case.id, "impl": impl, "status": int(st)}) + "\n")
            pytest.skip(f"{impl} answered status {st} for {case.id}")

        def call(i, p=prov):
            return pr.call(p, i)

    calls = [0]

    def one():
        calls[0] += 1
        return call(calls[0] - 1)

    rounds, iterations = _rounds(one)
    benchmark.pedantic(one, rounds=rounds, iterations=iterations, warmup_rounds=1)
    # the sets the timed calls used: the first and the last one called, their results zeroed and the
    # calls made once more, as the timed calls repeated them: a provider that skips a call it has
    # seen (spec 7.2: stateless aside from user buffers) leaves zeros
    vsets = tuple(sorted({0, (calls[0] - 1) % pr.nsets}))
    pr.poison(vsets)
    for j in vsets:
        call(j)
    v = label_verified(pr.verify(vsets), "a repeat of the timed calls")
    benchmark.extra_info["verified"] = v
    assert v["ok"], f"{impl} {case.id}: memory after timing differs from the oracle: {v['problems']}"
