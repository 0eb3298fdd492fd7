"""``--memory auto`` runs on device memory only where the provider serves it there: a tiny valid write
of that memory type answered OK (``preflight.memory_support``), not validation alone. Spec 7 has
``kvx_validate_cache_desc`` "validate layout, dtype, shape, stride, and required fields", and a memory
type the build cannot serve is refused by the call (docs/spec-readings.md R-ORDER, step 4). A host-only
provider that validated a device-memory cache OK was run on device memory on a GPU machine and read
NOT CERTIFIED, every valid call's UNSUPPORTED a failure; an HND-only device provider whose validation
refuses NHD was run on host memory. No GPU is needed: the calls are stood in for.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvx_conformance.abi import buffers
from kvx_conformance.abi.header import Layout, Memory, Status
from kvx_conformance.cases import execute
from kvx_conformance.harness import preflight, runner

#: name -> (validate(memory, layout), write(memory, layout)) of a stand-in provider
PROVIDERS = {
    # validates any cache; its writes serve host memory only
    "host_only": (lambda m, lay: Status.OK, lambda m, lay: Status.OK if m == Memory.HOST else Status.UNSUPPORTED),
    # HND alone, on every memory type; NHD refused with INVALID_ARGUMENT by validation too (spec 8)
    "hnd_only": (lambda m, lay: Status.OK if lay == Layout.BLOCK_HND else Status.INVALID_ARGUMENT,
                 lambda m, lay: Status.OK if lay == Layout.BLOCK_HND else Status.INVALID_ARGUMENT),
    # refuses device memory already in validation
    "host_validated": (lambda m, lay: Status.OK if m == Memory.HOST else Status.UNSUPPORTED,
                       lambda m, lay: Status.OK if m == Memory.HOST else Status.UNSUPPORTED),
}


@pytest.mark.parametrize("name,support,auto", [
    ("host_only", {"host": "OK", "device": "UNSUPPORTED (write; validate OK)",
                   "unified": "UNSUPPORTED (write; validate OK)"}, "host"),
    ("hnd_only", {"host": "OK", "device": "OK", "unified": "OK"}, "device"),
    ("host_validated", {"host": "OK", "device": "UNSUPPORTED", "unified": "UNSUPPORTED"}, "host"),
])
def test_auto_memory_follows_what_the_writes_serve(monkeypatch, name, support, auto):
    validate, write = PROVIDERS[name]
    calls = []

    def run(answer, kind):
        def call(provider, case, opts):
            calls.append((kind, opts.memory, Layout(case.cache.k.layout)))
            return SimpleNamespace(status=answer(opts.memory, Layout(case.cache.k.layout)))
        return call

    monkeypatch.setattr(buffers, "memory_available", lambda mem: None)  # as on a GPU machine
    monkeypatch.setattr(execute, "run_validate", run(validate, "validate"))
    monkeypatch.setattr(execute, "run_write", run(write, "write"))
    got = preflight.memory_support(provider=None)
    assert got == support, (name, got)
    memory, error, notes = runner._resolve_memory("auto", SimpleNamespace(memory_support=got))
    assert (memory, error) == (auto, None), (name, memory, notes)
    if auto == "host":
        assert notes == [f"memory auto: host (device: {got['device']})"]
    # a write is tried only after its validation passed, and only until one layout serves
    for i, (kind, mem, lay) in enumerate(calls):
        if kind == "write":
            assert calls[i - 1] == ("validate", mem, lay)


def test_device_asked_of_a_provider_that_does_not_serve_it_is_one_line_and_exit_10():
    """``--memory device`` for a provider whose tiny valid device-memory write is refused stops before the
    run, as for a machine without a GPU: one line naming the answer, exit 10 (docs/exit-codes.md), not
    a run of every test failing with the same refusal."""
    info = SimpleNamespace(memory_support={"host": "OK", "device": "UNSUPPORTED (write; validate OK)",
                                           "unified": "INVALID_ARGUMENT"})
    for mem, answer in (("device", "UNSUPPORTED (write; validate OK)"), ("unified", "INVALID_ARGUMENT")):
        memory, error, _ = runner._resolve_memory(mem, info)
        assert memory is None and error.startswith(f"memory type {mem} is not served by the provider"), error
        assert answer in error and "--memory host" in error, error
    # a probe that could not run (the provider crashed in it) says nothing: the run goes on and shows it
    memory, error, notes = runner._resolve_memory(
        "device", SimpleNamespace(memory_support={"host": "not probed: provider crashed (SIGSEGV)"}))
    assert (memory, error) == ("device", None) and notes == ["the provider's memory probe: not probed"], notes
    assert runner._resolve_memory("device", SimpleNamespace(memory_support={"device": "OK"}))[:2] == ("device", None)


def test_bench_memory_follows_the_same_probe(monkeypatch):
    """``kvx-conform bench --memory auto`` on a GPU machine benches device memory only where the provider
    serves it (the same ``served.memory_answer`` as the run), and an explicit request it refuses is exit
    10's one line."""
    import sys

    from kvx_conformance.abi import loader
    from kvx_conformance.bench import cli as bench_cli
    from kvx_conformance.cases import served

    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: True)))
    monkeypatch.setattr(loader, "load_provider", lambda path: path)
    answers = {"host_only.so": "UNSUPPORTED (write; validate OK)", "device.so": "OK"}
    monkeypatch.setattr(served, "memory_answer", lambda provider, mem: answers[provider])
    assert bench_cli.resolve_memory("auto", "host_only.so") == ("host", None)
    assert bench_cli.resolve_memory("auto", "device.so") == ("device", None)
    assert bench_cli.resolve_memory("device", "device.so") == ("device", None)
    memory, error = bench_cli.resolve_memory("device", "host_only.so")
    assert memory is None and error.startswith("memory type device is not served by the provider"), error
    assert bench_cli.resolve_memory("host", "host_only.so") == ("host", None)
