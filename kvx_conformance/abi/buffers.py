"""Guarded buffers: every region handed to a provider sits between poisoned guards.

A buffer owns ``guard`` bytes before and after its data region, filled with a
position-dependent pattern (so a stray write of any value is seen), and its data
region starts poisoned too. After each call ``violations()`` reports every guard byte
that changed. Host buffers are numpy; device buffers use torch (optional extra) and
unified buffers use ``cudaMallocManaged`` through torch's CUDA runtime; the three
share one interface, so the executor does not care where memory lives.
"""
from __future__ import annotations

import collections
import ctypes
import mmap
import sys
import threading
import time

import numpy as np

from . import health
from .header import Memory

DEFAULT_GUARD = 256
DEFAULT_ALIGN = 256


def guard_pattern(n: int, salt: int = 0, start: int = 0) -> np.ndarray:
    """Bytes ``start .. start + n`` of the position-dependent pattern."""
    i = np.arange(start, start + n, dtype=np.uint32)
    return ((i * 37 + 0x5B + salt * 11) & 0xFF).astype(np.uint8)


class Buffer:
    """Interface: ``ptr`` (int), ``nbytes``, ``upload(array)``, ``download()``, ``violations()``."""

    memory: Memory
    ptr: int
    nbytes: int
    name: str

    def upload(self, data: np.ndarray) -> None:
        raise NotImplementedError

    def download(self) -> np.ndarray:
        """The data region as a fresh uint8 array."""
        raise NotImplementedError

    def seal(self, on: bool) -> None:
        """Read-only while a call runs, where the memory allows it (host pages; not device or
        managed memory, whose read-only inputs are compared after the call instead)."""

    def _all_bytes(self) -> np.ndarray:
        raise NotImplementedError

    def _guard_bytes(self) -> tuple[np.ndarray, np.ndarray]:
        """The guard regions before and after the data region."""
        whole = self._all_bytes()
        return whole[: self._pre], whole[self._pre + self.nbytes : self._pre + self.nbytes + self.guard]

    def violations(self) -> list[str]:
        pre, post = self._guard_bytes()
        out = []
        for label, region, expect in (("before", pre, self._pre_pattern), ("after", post, self._post_pattern)):
            bad = np.nonzero(region != expect)[0]
            if bad.size:
                where = (bad[0] - len(region)) if label == "before" else bad[0]
                out.append(
                    f"{self.name}: {bad.size} guard byte(s) {label} the buffer changed "
                    f"(first at byte offset {int(where):+d} from the {'start' if label == 'before' else 'end'})"
                )
        return out


_LIBC = None


def _mprotect(addr: int, nbytes: int, writable: bool) -> None:
    """mprotect(2) whole pages from ``addr`` (page aligned): read-only, or read-write again."""
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
        _LIBC.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    if _LIBC.mprotect(ctypes.c_void_p(addr), ctypes.c_size_t(nbytes), prot) != 0:
        raise OSError(ctypes.get_errno(), f"mprotect of {nbytes} bytes failed")


def _pages(nbytes: int) -> mmap.mmap:
    """Anonymous, page-aligned memory of at least ``nbytes`` (whole pages: it can be made read-only)."""
    return mmap.mmap(-1, max(1, -(-nbytes // mmap.PAGESIZE)) * mmap.PAGESIZE)


class ReadOnlyWhileCalled:
    """A ctypes struct copied into pages of its own, read-only while a call runs (``sealed``):
    the descriptors a provider gets are const (kvx_abi.h), so a store into one faults at once,
    even one undone before the call returns."""

    def __init__(self, struct: ctypes.Structure):
        self._map = _pages(ctypes.sizeof(struct))
        self.struct = type(struct).from_buffer(self._map)
        ctypes.memmove(ctypes.addressof(self.struct), ctypes.addressof(struct), ctypes.sizeof(struct))

    def seal(self, on: bool) -> None:
        _mprotect(ctypes.addressof(self.struct), len(self._map), writable=not on)


class HostBuffer(Buffer):
    """Host memory in pages of its own (``seal``: read-only while a call runs)."""

    memory = Memory.HOST

    def __init__(self, nbytes: int, name: str = "buffer", *, guard: int = DEFAULT_GUARD,
                 align: int = DEFAULT_ALIGN, misalign: int = 0, salt: int = 0):
        self.name, self.nbytes, self.guard = name, int(nbytes), guard
        self._owner = health.current_test()
        total = guard + align + self.nbytes + guard
        self._map = _pages(total)
        self._raw = np.frombuffer(self._map, dtype=np.uint8, count=total)
        base = self._raw.ctypes.data
        first = (-(base + guard)) % align + misalign % align
        self._pre = guard + first
        self._raw[:] = guard_pattern(len(self._raw), salt)
        self._pre_pattern = self._raw[: self._pre].copy()
        self._post_pattern = self._raw[self._pre + self.nbytes : self._pre + self.nbytes + guard].copy()
        self.ptr = base + self._pre

    def data_view(self) -> np.ndarray:
        return self._raw[self._pre : self._pre + self.nbytes]

    def seal(self, on: bool) -> None:
        """Make the buffer's pages read-only (``on``) or writable again: the inputs of a call
        are const (spec 7.2, kvx_abi.h), so a store into one faults while the call runs."""
        _mprotect(self._raw.ctypes.data, len(self._map), writable=not on)

    def upload(self, data: np.ndarray) -> None:
        b = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        assert b.size == self.nbytes, (self.name, b.size, self.nbytes)
        self.data_view()[:] = b

    def download(self) -> np.ndarray:
        return self.data_view().copy()

    def _all_bytes(self) -> np.ndarray:
        return self._raw

    def __del__(self):
        # only when nothing else holds the memory (a view keeps it alive anyway)
        try:
            raw = getattr(self, "_raw", None)
            if raw is not None and QUARANTINE.on and sys.getrefcount(raw) <= 3:
                QUARANTINE.admit(raw, self.name, getattr(self, "_owner", ""))
        except Exception:  # interpreter shutdown
            pass


# ----------------------------------------------------------------------------- quarantine


#: ``late_writes[].where`` of a changed canary in a freed buffer of an earlier test: listed,
#: charged to no test
LATER_TEST = "later-test"


class Quarantine:
    """Freed host-addressable buffers are not given back at once: each stays allocated,
    filled with a canary byte, for ``hold_s`` (bounded by ``max_bytes``), and is checked
    once it is ``quiet_s`` old and again when it is given back. A changed canary is a
    write after return (spec 7.2) into the buffer of the test that owned it; the late
    write lands in memory the harness still owns instead of in memory a later test reuses.
    Enabled in the processes that run the conformance tests (the pytest plugin)."""

    CANARY = 0xC5

    def __init__(self, quiet_s: float = 0.25, hold_s: float = 3.0, max_bytes: int = 256 << 20):
        self.on = False
        self.quiet_s, self.hold_s, self.max_bytes = quiet_s, hold_s, max_bytes
        self._items: collections.deque = collections.deque()
        self._kept: list = []
        self._bytes = 0
        self._lock = threading.RLock()  # admit() runs from __del__, possibly inside sweep()

    def admit(self, raw: np.ndarray, name: str, owner: str, free=None) -> None:
        raw.fill(self.CANARY)
        with self._lock:
            self._items.append([time.monotonic(), raw, name, owner, free, False])
            self._bytes += raw.nbytes
        if self._bytes > self.max_bytes:
            self.sweep()

    def _check(self, item: list, where: str) -> None:
        raw = item[1]
        bad = np.flatnonzero(raw != self.CANARY)
        if bad.size:
            raw.fill(self.CANARY)  # report each write once
            if item[3] and item[3] != health.current_test():
                # the buffer of an earlier test, changed while a later test ran: that test's
                # out-of-bounds write or the owner's late write; the timing cannot tell which
                health.note_late_write(f"{item[2]} (freed, held by the harness): {bad.size} byte(s) written "
                                       f"while a later test ran (first at byte {int(bad[0])} of the buffer's "
                                       f"allocation): an out-of-bounds write of that test or a late write of "
                                       f"its owner", owner=item[3], where=LATER_TEST)
                return
            health.note_late_write(f"{item[2]}: {bad.size} byte(s) written after the call returned "
                                   f"(first at byte {int(bad[0])} of the buffer's allocation)",
                                   owner=item[3], where=where)

    def sweep(self, final: bool = False) -> None:
        """Check buffers that became quiet; give back those held long enough (all when final)."""
        now = time.monotonic()
        with self._lock:
            for item in self._items:
                if not item[5] and now - item[0] >= self.quiet_s:
                    item[5] = True
                    self._check(item, "quarantine")
            while self._items and (final or now - self._items[0][0] >= self.hold_s or
                                   (self._bytes > self.max_bytes and now - self._items[0][0] >= self.quiet_s)):
                item = self._items.popleft()
                self._check(item, "quarantine")
                self._bytes -= item[1].nbytes
                if final:
                    # the end of a run: threads the provider left may still write; what is held
                    # stays allocated until the process ends (runs in one process: mutant checks)
                    self._kept.append(item)
                elif item[4] is not None:
                    item[4]()

    def youngest_age(self) -> float | None:
        with self._lock:
            return time.monotonic() - self._items[-1][0] if self._items else None


QUARANTINE = Quarantine()


def _torch():
    try:
        import torch
    except ImportError:
        raise RuntimeError(
            "device memory needs torch with CUDA: pip install 'kvx-conform[torch]'"
        ) from None
    if not torch.cuda.is_available():
        raise RuntimeError("device memory needs a CUDA GPU, and torch sees none")
    return torch


class DeviceBuffer(Buffer):
    """cudaMalloc'd memory (through torch's allocator), guards on the device.

    ``device``: the CUDA device index to allocate on (default: the current device)."""

    memory = Memory.DEVICE

    def __init__(self, nbytes: int, name: str = "buffer", *, guard: int = DEFAULT_GUARD,
                 align: int = DEFAULT_ALIGN, misalign: int = 0, salt: int = 0, device: int | None = None):
        torch = _torch()
        self.name, self.nbytes, self.guard = name, int(nbytes), guard
        total = guard + align + self.nbytes + guard
        # the pattern is made on the device: a pool of gigabytes never crosses from the host
        where = "cuda" if device is None else f"cuda:{int(device)}"
        period = torch.from_numpy(guard_pattern(256, salt)).to(where)  # the pattern repeats every 256 bytes
        self._t = period.repeat(-(-total // 256))[:total]
        self.device = self._t.device.index
        base = self._t.data_ptr()
        first = (-(base + guard)) % align + misalign % align
        self._pre = guard + first
        self._pre_pattern = guard_pattern(self._pre, salt)
        self._post_pattern = guard_pattern(guard, salt, start=self._pre + self.nbytes)
        self.ptr = base + self._pre

    def upload(self, data: np.ndarray) -> None:
        torch = _torch()
        b = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        assert b.size == self.nbytes, (self.name, b.size, self.nbytes)
        if b.size:
            self._t[self._pre : self._pre + self.nbytes].copy_(torch.from_numpy(b.copy()))
        torch.cuda.synchronize(self.device)

    def download(self) -> np.ndarray:
        _torch().cuda.synchronize(self.device)
        return self._t[self._pre : self._pre + self.nbytes].cpu().numpy().copy()

    def _all_bytes(self) -> np.ndarray:
        _torch().cuda.synchronize(self.device)
        return self._t.cpu().numpy()

    def _guard_bytes(self) -> tuple[np.ndarray, np.ndarray]:
        # only the guards cross to the host (a pool of gigabytes is checked by its 512 guard bytes)
        _torch().cuda.synchronize(self.device)
        end = self._pre + self.nbytes
        return self._t[: self._pre].cpu().numpy(), self._t[end : end + self.guard].cpu().numpy()

    def data_tensor(self):
        """The data region as a uint8 torch CUDA tensor (a view: writes land in the buffer)."""
        return self._t[self._pre : self._pre + self.nbytes]


class _Cudart:
    """cudaMallocManaged / cudaFree from the CUDA runtime torch loaded."""

    @classmethod
    def lib(cls):
        _torch()
        try:
            return health.cudart()
        except RuntimeError:
            raise RuntimeError("unified memory needs libcudart (not found next to torch)") from None


class UnifiedBuffer(HostBuffer):
    """cudaMallocManaged memory: host-addressable, so guards are checked like host ones."""

    memory = Memory.UNIFIED

    def __init__(self, nbytes: int, name: str = "buffer", *, guard: int = DEFAULT_GUARD,
                 align: int = DEFAULT_ALIGN, misalign: int = 0, salt: int = 0):
        lib = _Cudart.lib()
        self.name, self.nbytes, self.guard = name, int(nbytes), guard
        self._owner = health.current_test()
        total = guard + align + self.nbytes + guard
        p = ctypes.c_void_p()
        if lib.cudaMallocManaged(ctypes.byref(p), ctypes.c_size_t(total), ctypes.c_uint(1)) != 0:
            raise RuntimeError("cudaMallocManaged failed")
        self._managed = p.value
        self._raw = np.ctypeslib.as_array((ctypes.c_uint8 * total).from_address(p.value))
        base = p.value
        first = (-(base + guard)) % align + misalign % align
        self._pre = guard + first
        self._raw[:] = guard_pattern(total, salt)
        self._pre_pattern = self._raw[: self._pre].copy()
        self._post_pattern = self._raw[self._pre + self.nbytes : self._pre + self.nbytes + guard].copy()
        self.ptr = base + self._pre

    def _sync(self):
        _Cudart.lib().cudaDeviceSynchronize()

    def seal(self, on: bool) -> None:
        """Managed memory is not sealed (its read-only inputs are compared after the call)."""

    def download(self) -> np.ndarray:
        self._sync()
        return super().download()

    def _all_bytes(self) -> np.ndarray:
        self._sync()
        return self._raw

    def __del__(self):
        m = getattr(self, "_managed", None)
        if not m:
            return

        def free(m=m):
            try:
                _Cudart.lib().cudaFree(ctypes.c_void_p(m))
            except Exception:
                pass

        if QUARANTINE.on:
            QUARANTINE.admit(self._raw, self.name, getattr(self, "_owner", ""), free)
        else:
            free()


_KINDS = {Memory.HOST: HostBuffer, Memory.DEVICE: DeviceBuffer, Memory.UNIFIED: UnifiedBuffer}


def allocate(nbytes: int, memory: Memory, name: str = "buffer", *, device: int | None = None, **kw) -> Buffer:
    """A guarded buffer; ``device`` places a DEVICE buffer on that CUDA device (host and unified
    memory have no owning device: it must be None there)."""
    if device is not None:
        if Memory(memory) != Memory.DEVICE:
            raise ValueError(f"a device index applies to DEVICE memory only, not {Memory(memory).name}")
        kw["device"] = device
    return _KINDS[Memory(memory)](nbytes, name, **kw)


def memory_available(memory: Memory) -> str | None:
    """None when buffers of this memory type can be made here, else the reason."""
    if memory == Memory.HOST:
        return None
    try:
        _torch()
        if memory == Memory.UNIFIED:
            _Cudart.lib()
    except RuntimeError as e:
        return str(e)
    return None


def synchronize(memory: Memory, device: int | None = None) -> None:
    """Wait for the GPU work on ``device`` (default: the current device); nothing for host memory."""
    if memory != Memory.HOST:
        _torch().cuda.synchronize(device)


def _element_text(a: np.ndarray, i: int) -> str:
    if a.dtype.kind == "f":
        bits = int(a[i : i + 1].view(f"u{a.dtype.itemsize}")[0])
        return f"{float(a[i]):.9g} (0x{bits:0{a.dtype.itemsize * 2}x})"
    if a.dtype.kind in "iub":
        return str(int(a[i]))
    return f"0x{bytes(a[i : i + 1].view(np.uint8)).hex()}"


def input_change(name: str, before: np.ndarray, after: np.ndarray) -> str | None:
    """None when ``after`` (the bytes of a buffer after a call) equals ``before`` (the
    array uploaded into it), else one line naming the buffer, how many elements changed
    and the first one: its index and its value before and after, in the array's dtype."""
    b = np.ascontiguousarray(before).reshape(-1)
    raw = np.ascontiguousarray(after).reshape(-1).view(np.uint8)
    bb = b.view(np.uint8)
    if raw.size == bb.size and np.array_equal(raw, bb):
        return None
    size = max(1, b.dtype.itemsize)
    if raw.size != bb.size or bb.size % size:
        return f"{name}: {raw.size} bytes after the call, {bb.size} before"
    bad = np.nonzero((raw.reshape(-1, size) != bb.reshape(-1, size)).any(axis=1))[0]
    i = int(bad[0])
    return (f"{name}: {bad.size} of {b.size} element(s) changed by the call; first at element {i}: "
            f"{_element_text(b, i)} before, {_element_text(raw.view(b.dtype), i)} after")
