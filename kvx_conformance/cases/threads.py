"""Calls from several threads at once (spec 7.2, R-THREADS): a provider proxy whose calls wait at a
barrier and then enter the provider together, and a runner that joins the threads and re-raises the
first error in the caller's thread. ctypes drops the GIL for the call, so the calls overlap."""
from __future__ import annotations

import threading


class BarrierProvider:
    """A provider proxy whose writes and gathers wait for all threads, then enter the provider together;
    ``cache`` (a shared kvx_cache_desc_t) replaces the call's own cache when given. Other attributes
    are the provider's."""

    def __init__(self, provider, barrier: threading.Barrier, cache=None):
        self.provider, self.barrier, self.cache = provider, barrier, cache
        self.path = getattr(provider, "path", "")

    def __getattr__(self, name):
        return getattr(self.provider, name)

    def validate_cache_desc(self, cache):
        return self.provider.validate_cache_desc(cache)

    def write_kv(self, cache, desc, stream=None):
        self.barrier.wait(timeout=60)
        return self.provider.write_kv(self.cache if self.cache is not None else cache, desc, stream)

    def gather_kv(self, cache, desc, stream=None):
        self.barrier.wait(timeout=60)
        return self.provider.gather_kv(self.cache if self.cache is not None else cache, desc, stream)


def run_threads(fns, timeout_s: float = 60.0) -> list:
    """Run each of ``fns`` in a thread of its own; their results (None for a thread still running after
    ``timeout_s``), the first exception raised again here."""
    results: list = [None] * len(fns)
    errors: list = []

    def body(i):
        try:
            results[i] = fns[i]()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout_s)
    if errors:
        raise errors[0]
    return results
