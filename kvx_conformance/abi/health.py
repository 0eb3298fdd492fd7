"""Whether the process that calls a provider can still be trusted: device faults, late writes.

Two things can leave a test process unusable without killing it:

- a **device fault**: a provider's kernel makes an illegal (or misaligned, ...) memory
  access. CUDA errors of that kind are *sticky*: the process's CUDA context is lost and
  every later CUDA call in it fails, so the harness's own next call would raise and be
  read as a harness error. After every provider call on device or unified memory
  (:func:`after_call`, called by :class:`~kvx_conformance.abi.loader.Provider`) the context is
  synchronized and a sticky error is turned into a :class:`Fault` naming the error, the
  entry point and the case, handed to the installed handler (the pytest plugin writes it
  to the worker's fault log and ends the worker at once, so the test that faulted is the
  one charged and a fresh worker runs the rest; see docs/device-faults.md);
- **writes after return**: a thread or kernel the provider left running writes into
  buffers the harness already gave back. :mod:`~kvx_conformance.abi.buffers` keeps freed
  buffers quarantined behind a canary for a quiet period; :func:`note_late_write`
  records a finding and the plugin replaces the worker.

This module is a leaf (ctypes and the standard library only): the loader and the
buffers import it, the plugin installs the handler.

``KVX_CONFORM_FAKE_DEVICE_FAULT`` (tests only) makes the checker report a sticky fault
without a GPU: ``ENTRY:GLOB`` faults the first call of entry point ``ENTRY``
(``kvx_write_kv``, ``*`` for any) made while a test whose nodeid matches ``GLOB`` runs,
and keeps reporting it for every later call in that process, as a real sticky error does.
(In the child processes of ``accuracy`` and ``model-eval`` the "test" is the unit's name,
``accuracy/METHOD/DISTRIBUTION`` or ``model-eval/FORMAT``; see docs/device-faults.md.)
"""
from __future__ import annotations

import contextlib
import ctypes
import fnmatch
import glob
import os
import threading
from dataclasses import asdict, dataclass, field

#: exit status of a worker ended because a provider call left a sticky device fault
EXIT_DEVICE_FAULT = 86
#: exit status of a worker replaced after writes after return (its test's outcome is kept)
EXIT_LATE_WRITE = 87
#: environment variable of the fake checker (tests of the harness only)
FAKE_ENV = "KVX_CONFORM_FAKE_DEVICE_FAULT"


@dataclass
class Fault:
    """A sticky device fault seen right after a provider call."""

    kind: str  # "device-fault"
    error: str  # e.g. cudaErrorIllegalAddress
    error_string: str  # e.g. "an illegal memory access was encountered"
    code: int
    entry: str = ""  # the KVX entry point that had just returned
    case: str = ""  # the case being run (set by the executor), when known
    test: str = ""  # the nodeid of the running test, when known
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def message(self) -> str:
        where = f" in {self.entry}" if self.entry else ""
        return f"device fault{where}: {self.error} ({self.error_string})"


class DeviceFault(BaseException):
    """Raised by the default handler. A BaseException: test code and hypothesis must not
    catch it as an ordinary failure (the process's CUDA context is gone)."""

    def __init__(self, fault: Fault):
        super().__init__(fault.message())
        self.fault = fault


# ----------------------------------------------------------------------------- CUDA runtime

_CUDART = None


def cudart():
    """The CUDA runtime torch loaded (libcudart next to torch, else the system's)."""
    global _CUDART
    if _CUDART is None:
        cands: list[str] = []
        try:
            import torch

            top = os.path.dirname(torch.__file__)
            cands += glob.glob(os.path.join(top, "lib", "libcudart*.so*"))
            cands += glob.glob(os.path.join(os.path.dirname(top), "nvidia", "cuda_runtime", "lib", "libcudart.so*"))
        except ImportError:
            pass
        cands += ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
        for c in cands:
            try:
                lib = ctypes.CDLL(c)
            except OSError:
                continue
            lib.cudaGetErrorName.restype = ctypes.c_char_p
            lib.cudaGetErrorString.restype = ctypes.c_char_p
            _CUDART = lib
            break
        if _CUDART is None:
            raise RuntimeError("libcudart not found (next to torch or on the library path)")
    return _CUDART


#: answers of a process that has no usable CUDA at all (nothing to check, not a fault):
#: initialization error, insufficient driver, stub library, no device
_NO_CUDA = {3, 34, 35, 100}


def _cuda_fault() -> Fault | None:
    """Synchronize the device; a *sticky* error (the context is lost) is a Fault. A pending
    non-sticky error (e.g. a refused launch the provider answered with a status) is
    cleared, so that it does not surface in the harness's next CUDA call."""
    lib = cudart()
    code = lib.cudaDeviceSynchronize() or lib.cudaGetLastError()
    if code == 0 or code in _NO_CUDA:
        return None
    if lib.cudaDeviceSynchronize() == 0 and lib.cudaGetLastError() == 0:
        return None  # cleared: not sticky
    name = (lib.cudaGetErrorName(code) or b"cudaError?").decode(errors="replace")
    text = (lib.cudaGetErrorString(code) or b"").decode(errors="replace")
    return Fault("device-fault", name, text, int(code))


# ----------------------------------------------------------------------------- state

_state = threading.local()
_lock = threading.Lock()


class _Armed:
    on = False
    fake: tuple[str, str] | None = None
    fake_hit = False
    handler = None
    test = ""  # nodeid of the running test (set by the plugin)
    late: list[dict] = []  # writes-after-return findings not yet handled


def _fake_spec() -> tuple[str, str] | None:
    raw = os.environ.get(FAKE_ENV, "")
    if ":" not in raw:
        return None
    entry, pattern = raw.split(":", 1)
    return entry.strip() or "*", pattern.strip() or "*"


def arm(on: bool = True, handler=None) -> None:
    """Check after every provider call (device / unified runs); ``handler(fault)`` is
    called with a :class:`Fault` (default: raise :class:`DeviceFault`)."""
    _Armed.fake = _fake_spec()
    _Armed.on = bool(on) or _Armed.fake is not None
    _Armed.handler = handler


def disarm() -> None:
    _Armed.on = False
    _Armed.handler = None


def armed() -> bool:
    return _Armed.on


def set_test(nodeid: str) -> None:
    _Armed.test = nodeid


def current_test() -> str:
    return _Armed.test


def set_case(case) -> None:
    """The case the calling thread is about to run (a case object with ``describe()``, or a
    string), named in the fault record."""
    _state.case = case


def _case_text() -> str:
    c = getattr(_state, "case", None)
    try:
        return c.describe() if hasattr(c, "describe") else str(c or "")
    except Exception:  # noqa: BLE001 - a description is best effort
        return ""


def check(entry: str = "") -> Fault | None:
    """A sticky device fault right now (None when the context is healthy or unchecked)."""
    fake = _Armed.fake
    if fake is not None:
        with _lock:
            if not _Armed.fake_hit and fnmatch.fnmatch(entry, fake[0]) and fnmatch.fnmatch(_Armed.test, fake[1]):
                _Armed.fake_hit = True
            if _Armed.fake_hit:
                return Fault("device-fault", "cudaErrorIllegalAddress",
                             "an illegal memory access was encountered (simulated: " + FAKE_ENV + ")", 700)
        return None
    try:
        return _cuda_fault()
    except (RuntimeError, OSError, AttributeError):
        return None


def after_call(entry: str) -> None:
    """Called by the loader after every provider call; hands a fault to the handler."""
    if not _Armed.on:
        return
    fault = check(entry)
    if fault is None:
        return
    fault.entry = entry
    fault.case = _case_text()
    fault.test = _Armed.test
    handler = _Armed.handler
    if handler is not None:
        handler(fault)  # the plugin's handler ends the process
    raise DeviceFault(fault)


@contextlib.contextmanager
def one_check(entry: str):
    """Within: provider calls are not followed by the synchronizing check, so work queued on a
    stream after a call is not held back until the call's work has finished (the stream-order
    check queues work behind the calls); on leaving, a single check covers every call made
    within, charged to ``entry``."""
    was = _Armed.on
    _Armed.on = False
    try:
        yield
    finally:
        _Armed.on = was
        after_call(entry)


# ----------------------------------------------------------------------------- late writes


def note_late_write(what: str, *, owner: str = "", where: str = "") -> None:
    """A write after return was seen: ``what`` says which buffer and how many bytes,
    ``owner`` the test whose call the buffer belonged to, ``where`` how it was seen."""
    with _lock:
        _Armed.late.append({"what": what, "owner": owner or _Armed.test, "where": where, "seen_in": _Armed.test})


def take_late_writes() -> list[dict]:
    with _lock:
        out, _Armed.late = _Armed.late, []
    return out
