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


def _mprotect(addr: int, nbytes: int, writable: bool, readable: bool = True) -> None:
    """mprotect(2) whole pages from ``addr`` (page aligned): read-only, read-write, or (not
    ``readable``) no access at all."""
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
        _LIBC.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    prot = (mmap.PROT_READ if readable else 0) | (mmap.PROT_WRITE if writable else 0)
    if _LIBC.mprotect(ctypes.c_void_p(addr), ctypes.c_size_t(nbytes), prot) != 0:
        raise OSError(ctypes.get_errno(), f"mprotect of {nbytes} bytes failed")


def _pages(nbytes: int) -> mmap.mmap:
    """Anonymous, page-aligned memory of at least ``nbytes`` (whole pages: it can be made read-only)."""
    return mmap.mmap(-1, max(1, -(-nbytes // mmap.PAGESIZE)) * mmap.PAGESIZE)


class ReadOnlyWhileCalled:
    """A ctypes struct copied into pages of its own, read-only while a call runs (``seal``),
    ending (to within its 8-byte alignment) where an inaccessible page begins: the descriptors
    a provider gets are const (kvx_abi.h), so a store into one faults at once, even one undone
    before the call returns, and so does a read past the struct (a provider built for a newer
    minor that reads fields beyond ``size`` without checking it, spec 6 / R-SIZE)."""

    def __init__(self, struct: ctypes.Structure):
        n = ctypes.sizeof(struct)
        self._data_bytes = -(-n // mmap.PAGESIZE) * mmap.PAGESIZE
        self._map = mmap.mmap(-1, self._data_bytes + mmap.PAGESIZE)
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        _mprotect(self._base + self._data_bytes, mmap.PAGESIZE, writable=False, readable=False)
        self.struct = type(struct).from_buffer(self._map, (self._data_bytes - n) & ~7)
        ctypes.memmove(ctypes.addressof(self.struct), ctypes.addressof(struct), n)

    def seal(self, on: bool) -> None:
        _mprotect(self._base, self._data_bytes, writable=not on)

    def refill(self, struct: ctypes.Structure) -> None:
        """New contents (a struct of the same type) at the same address; the copy must not be sealed."""
        if type(struct) is not type(self.struct):
            raise TypeError(f"refill with a {type(struct).__name__}, not a {type(self.struct).__name__}")
        ctypes.memmove(ctypes.addressof(self.struct), ctypes.addressof(struct), ctypes.sizeof(struct))


class EndsAtInaccessiblePage:
    """A read-only host copy of ``array`` whose last byte is the last one before an inaccessible
    page: a read of any byte past the array (a vector load of the last elements that runs over
    the end) faults in the call that makes it, where a guarded buffer's readable guard bytes
    would hide it. ``ptr`` is the array's address; keep the object alive while a provider may
    read it."""

    def __init__(self, array: np.ndarray):
        a = np.ascontiguousarray(array)
        n = a.nbytes
        self._data_bytes = max(1, -(-n // mmap.PAGESIZE)) * mmap.PAGESIZE
        self._map = mmap.mmap(-1, self._data_bytes + mmap.PAGESIZE)
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        _mprotect(self._base + self._data_bytes, mmap.PAGESIZE, writable=False, readable=False)
        self.ptr = self._base + self._data_bytes - n
        ctypes.memmove(self.ptr, a.ctypes.data, n)
        _mprotect(self._base, self._data_bytes, writable=False)
        self.nbytes = n


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


# ----------------------------------------------------------------------------- sparse


_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)
#: /proc/self/pagemap entry bits: page present, page swapped out
_PM_PRESENT, _PM_SWAPPED = 1 << 63, 1 << 62


class SparseBuffer:
    """A zero-filled buffer of many gigabytes whose untouched memory is never materialized:
    a cache larger than 2^31 elements that a call touches in a few rows (tests of 64-bit
    offsets). Guards of ``guard`` bytes (a position-dependent pattern, as :class:`Buffer`)
    sit right before and after the data region, which starts page aligned.

    - HOST: a private anonymous mapping, no swap reserved (``MAP_NORESERVE``): untouched
      pages read as the shared zero page. :meth:`nonzero_words` scans only the pages the
      process touched (``/proc/self/pagemap``: present or swapped), the whole region where
      that cannot be read. ``seal`` makes the pages read-only while a call runs.
    - DEVICE: ``torch.zeros`` on the GPU, scanned there.
    - UNIFIED: ``cudaMallocManaged`` zeroed with ``cudaMemset``, scanned on the GPU through
      a device staging buffer; small reads and writes go through the host mapping.

    Not quarantined when freed (a canary fill would materialize every page): :meth:`close`
    gives the memory back at once.
    """

    def __init__(self, nbytes: int, memory: Memory, name: str = "buffer", *, guard: int = 4096,
                 salt: int = 0, device: int | None = None):
        self.memory, self.name, self.nbytes, self.salt = Memory(memory), name, int(nbytes), salt
        if self.nbytes % 8:
            raise ValueError("a sparse buffer holds a whole number of 8-byte words")
        page = mmap.PAGESIZE
        self._pre = -(-max(int(guard), 8) // page) * page
        self.guard = int(guard)
        self._total = self._pre + self.nbytes + self.guard
        self._pre_pattern = guard_pattern(self._pre, salt)
        # the pattern repeats every 256 bytes (start taken modulo 256: uint32 positions)
        self._post_pattern = guard_pattern(self.guard, salt, start=(self._pre + self.nbytes) % 256)
        self._map = self._raw = self._t = self._managed = None
        self.device = device
        if self.memory == Memory.HOST:
            if device is not None:
                raise ValueError("a device index applies to DEVICE memory only")
            self._map = mmap.mmap(-1, self._total, flags=mmap.MAP_PRIVATE | _MAP_NORESERVE,
                                  prot=mmap.PROT_READ | mmap.PROT_WRITE)
            self._raw = np.frombuffer(self._map, dtype=np.uint8, count=self._total)
            base = self._raw.ctypes.data
        elif self.memory == Memory.DEVICE:
            torch = _torch()
            where = "cuda" if device is None else f"cuda:{int(device)}"
            self._t = torch.zeros(self._total, dtype=torch.uint8, device=where)
            self.device = self._t.device.index
            base = self._t.data_ptr()
        else:
            if device is not None:
                raise ValueError("a device index applies to DEVICE memory only")
            lib = _Cudart.lib()
            p = ctypes.c_void_p()
            if lib.cudaMallocManaged(ctypes.byref(p), ctypes.c_size_t(self._total), ctypes.c_uint(1)) != 0:
                raise RuntimeError(f"cudaMallocManaged of {self._total} bytes failed")
            self._managed = base = p.value
            if lib.cudaMemset(ctypes.c_void_p(base), 0, ctypes.c_size_t(self._total)) != 0:
                raise RuntimeError("cudaMemset of managed memory failed")
            lib.cudaDeviceSynchronize()
        self._base = base
        self.ptr = base + self._pre
        self._put(0, self._pre_pattern)
        self._put(self._pre + self.nbytes, self._post_pattern)

    # -- bytes at offsets of the whole allocation

    def _host_view(self, start: int, n: int) -> np.ndarray:
        if self._raw is not None:
            return self._raw[start : start + n]
        return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(self._base + start)) if n else \
            np.zeros(0, np.uint8)

    def _put(self, start: int, data: np.ndarray) -> None:
        b = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if not b.size:
            return
        if self._t is not None:
            torch = _torch()
            self._t[start : start + b.size].copy_(torch.from_numpy(b.copy()))
            torch.cuda.synchronize(self.device)
            return
        if self._managed is not None:
            _Cudart.lib().cudaDeviceSynchronize()
        self._host_view(start, b.size)[:] = b

    def _get(self, start: int, n: int) -> np.ndarray:
        if self._t is not None:
            torch = _torch()
            torch.cuda.synchronize(self.device)
            return self._t[start : start + n].cpu().numpy().copy()
        if self._managed is not None:
            _Cudart.lib().cudaDeviceSynchronize()
        return self._host_view(start, n).copy()

    # -- the data region

    def write(self, offset: int, data: np.ndarray) -> None:
        """Store ``data``'s bytes at byte ``offset`` of the data region."""
        b = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if offset < 0 or offset + b.size > self.nbytes:
            raise IndexError(f"{self.name}: bytes {offset}..{offset + b.size} outside the buffer")
        self._put(self._pre + offset, b)

    def read(self, offset: int, n: int) -> np.ndarray:
        """A copy of ``n`` bytes at byte ``offset`` of the data region."""
        if offset < 0 or offset + n > self.nbytes:
            raise IndexError(f"{self.name}: bytes {offset}..{offset + n} outside the buffer")
        return self._get(self._pre + offset, n)

    def violations(self) -> list[str]:
        """As :meth:`Buffer.violations`: one line per guard (before, after) with a changed byte."""
        out = []
        for label, start, expect in (("before", 0, self._pre_pattern),
                                     ("after", self._pre + self.nbytes, self._post_pattern)):
            bad = np.nonzero(self._get(start, expect.size) != expect)[0]
            if bad.size:
                where = (int(bad[0]) - expect.size) if label == "before" else int(bad[0])
                out.append(f"{self.name}: {bad.size} guard byte(s) {label} the buffer changed (first at byte "
                           f"offset {where:+d} from the {'start' if label == 'before' else 'end'})")
        return out

    def seal(self, on: bool) -> None:
        """Host memory: the whole allocation read-only (``on``) or writable again."""
        if self._raw is not None:
            _mprotect(self._base, self._total, writable=not on)

    def _touched_host_pages(self) -> np.ndarray | None:
        """Indices of the pages of the data region the process touched (present or swapped
        out), from ``/proc/self/pagemap``; None where it cannot be read or is not believable
        (the guard pages, written at allocation, must show as touched)."""
        import os

        page = mmap.PAGESIZE
        first, count = self._base // page, -(-self._total // page)
        try:
            with open("/proc/self/pagemap", "rb", buffering=0) as f:
                raw = os.pread(f.fileno(), count * 8, first * 8)
        except OSError:
            return None
        if len(raw) != count * 8:
            return None
        touched = (np.frombuffer(raw, dtype=np.uint64) & np.uint64(_PM_PRESENT | _PM_SWAPPED)) != 0
        last_guard = (self._pre + self.nbytes) // page
        if not (touched[0] and touched[last_guard]):
            return None
        pre_pages = self._pre // page
        return np.flatnonzero(touched[pre_pages:]).astype(np.int64)  # pages from the data start

    def nonzero_words(self, limit: int = 4096, chunk: int = 1 << 28) -> tuple[int, np.ndarray]:
        """The number of non-zero 8-byte words of the data region, and the word indices of
        (at most ``limit``) of them, in ascending order. Reads no untouched host page twice
        and never the whole region into host memory."""
        found: list[np.ndarray] = []
        total = 0
        kept = 0

        def take(idx: np.ndarray) -> None:
            nonlocal kept
            if kept < limit and idx.size:
                found.append(idx[: limit - kept])
                kept += min(idx.size, limit - kept)

        if self._raw is not None:
            data = self._raw[self._pre : self._pre + self.nbytes].view(np.uint64)
            pages = self._touched_host_pages()
            if pages is None:
                spans = [(w, min(w + chunk // 8, data.size)) for w in range(0, data.size, chunk // 8)]
            else:
                wpp = mmap.PAGESIZE // 8
                pages = pages[pages * wpp < data.size]
                spans = []
                if pages.size:
                    breaks = np.flatnonzero(np.diff(pages) != 1) + 1
                    for run in np.split(pages, breaks):
                        spans.append((int(run[0]) * wpp, min((int(run[-1]) + 1) * wpp, data.size)))
            for a, b in spans:
                for s in range(a, b, chunk // 8):
                    part = data[s : min(b, s + chunk // 8)]
                    nz = np.flatnonzero(part)
                    total += int(nz.size)
                    take(nz + s)
            return total, (np.concatenate(found) if found else np.zeros(0, np.int64))
        torch = _torch()
        if self._t is not None:
            torch.cuda.synchronize(self.device)
            words = self._t[self._pre : self._pre + self.nbytes].view(torch.int64)
            for s in range(0, words.numel(), chunk // 8):
                part = words[s : s + chunk // 8]
                n = int(torch.count_nonzero(part))
                total += n
                if n and kept < limit:
                    take(torch.nonzero(part).reshape(-1)[: limit - kept].cpu().numpy().astype(np.int64) + s)
            return total, (np.concatenate(found) if found else np.zeros(0, np.int64))
        # UNIFIED: copied chunk by chunk into a device staging buffer (the pages stay on the GPU)
        lib = _Cudart.lib()
        lib.cudaDeviceSynchronize()
        stage = torch.empty(min(chunk, self.nbytes) or 8, dtype=torch.uint8, device="cuda")
        for s in range(0, self.nbytes, chunk):
            n_bytes = min(chunk, self.nbytes - s)
            if lib.cudaMemcpy(ctypes.c_void_p(stage.data_ptr()), ctypes.c_void_p(self.ptr + s),
                              ctypes.c_size_t(n_bytes), 4) != 0:  # cudaMemcpyDefault
                raise RuntimeError("cudaMemcpy from managed memory failed")
            part = stage[:n_bytes].view(torch.int64)
            n = int(torch.count_nonzero(part))
            total += n
            if n and kept < limit:
                take(torch.nonzero(part).reshape(-1)[: limit - kept].cpu().numpy().astype(np.int64) + s // 8)
        torch.cuda.synchronize()
        return total, (np.concatenate(found) if found else np.zeros(0, np.int64))

    def close(self) -> None:
        """Give the memory back now (host: unmapped; device: freed and the cache emptied)."""
        if self._raw is not None:
            self._raw = None
            try:
                self._map.close()
            except BufferError:  # a view still holds it: freed with the view
                pass
            self._map = None
        if self._t is not None:
            self._t = None
            _torch().cuda.empty_cache()
        if self._managed:
            lib = _Cudart.lib()
            lib.cudaDeviceSynchronize()
            lib.cudaFree(ctypes.c_void_p(self._managed))
            self._managed = None

    def __enter__(self) -> "SparseBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
