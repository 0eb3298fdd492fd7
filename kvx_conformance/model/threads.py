"""Limit the BLAS threads numpy uses, for a while (no extra package).

The decoder's matrix products are small (a decode step is ``[3, 576] @ [576, 1536]``).
Under ``pytest -n 2`` on two cores, OpenBLAS's own threads then spin against the
other worker and the other processes: the model tests took about six times the CPU
(and five times the wall time) with the default thread count than with one thread.

:func:`blas_threads` finds the OpenBLAS that numpy loaded (in ``/proc/self/maps``, or
numpy's bundled ``numpy.libs``) and calls its ``set_num_threads`` entry point; where
there is none (another BLAS, another OS) it changes nothing.
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import os

_NAMES = [f"{p}set_num_threads{s}" for p in ("scipy_openblas_", "openblas_", "goto_") for s in ("64_", "")]


def _candidates() -> list[str]:
    paths: list[str] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                p = line.split()[-1] if line.strip() else ""
                if "openblas" in os.path.basename(p).lower() and p not in paths:
                    paths.append(p)
    except OSError:
        pass
    if not paths:
        import numpy

        base = os.path.dirname(os.path.dirname(numpy.__file__))
        paths = sorted(glob.glob(os.path.join(base, "numpy.libs", "*openblas*")))
    return paths


def _entry_points():
    """(set, get) pairs of every OpenBLAS entry point found (cached)."""
    if _entry_points.cache is None:
        found = []
        for path in _candidates():
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for name in _NAMES:
                fn = getattr(lib, name, None)
                get = getattr(lib, name.replace("set_", "get_"), None)
                if fn is not None and get is not None:
                    fn.argtypes, fn.restype, get.restype = [ctypes.c_int], None, ctypes.c_int
                    found.append((fn, get))
                    break
        _entry_points.cache = found
    return _entry_points.cache


_entry_points.cache = None


@contextlib.contextmanager
def blas_threads(n: int | None):
    """Run the block with at most ``n`` BLAS threads (None: unchanged)."""
    eps = _entry_points() if n is not None else []
    before = [get() for _, get in eps]
    for fn, _ in eps:
        fn(int(n))
    try:
        yield bool(eps)
    finally:
        for (fn, _), b in zip(eps, before):
            fn(b)
