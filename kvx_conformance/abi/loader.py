"""Loading a KVX provider with ctypes: dlopen, the four entry points, version negotiation.

Every way a provider can fail to load is a :class:`ProviderLoadError` with a one-line
message and a distinct exit code (docs/exit-codes.md); the CLI prints it, never a
traceback.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from . import header as abi, health
from .header import Status

ENTRY_POINTS = ("kvx_get_version", "kvx_validate_cache_desc", "kvx_write_kv", "kvx_gather_kv")

# Exit codes of the kvx-conform CLI (docs/exit-codes.md holds the table; keep both in step).
EXIT_CERTIFIED = 0  # every claimed profile certified
EXIT_NOT_CERTIFIED = 1  # the run finished and some claimed profile is not certified
EXIT_USAGE = 2  # bad command line, unusable output directory
EXIT_NOT_FOUND = 3  # the provider file does not exist
EXIT_NOT_A_LIBRARY = 4  # not a loadable shared library
EXIT_NOT_A_PROVIDER = 5  # a library without the KVX entry points
EXIT_INCOMPATIBLE = 6  # ABI major differs from the harness's
EXIT_VERSION_FAILED = 7  # kvx_get_version did not answer OK
EXIT_PROVIDER_CRASHED = 8  # the provider crashed or hung while being loaded or asked its version
EXIT_BAD_INPUT_FILE = 9  # unreadable or invalid claims / expectations / results file
EXIT_MEMORY_UNAVAILABLE = 10  # the requested memory type cannot be used on this machine
EXIT_NO_TESTS = 11  # the selection (-k, --profile, --id) matched no test
EXIT_HARNESS_ERROR = 12  # the harness itself failed (suite import error, pytest internal error)
EXIT_MERGE_REFUSED = 14  # kvx-conform merge: the parts are not one run split in N (docs/scale.md)
EXIT_INTERRUPTED = 130  # interrupted (Ctrl-C)



_ENV_LOCK = threading.Lock()


def hide_test_environment() -> None:
    """No ``PYTEST_*`` variable (pytest's and xdist's names of the test phase, the worker, the
    version) in the environment a provider call sees: pytest sets the test's name again in each
    phase, so this runs before every call (a no-op once they are gone). A provider cannot learn
    from its environment that a test harness calls it; other signs, the harness does not hide.
    Thread-safe: the concurrency tests call providers from several threads at once, and two
    threads removing one variable (``os.environ.pop`` reads, then deletes) raised KeyError in
    the second, a harness error of the test."""
    if not any(k.startswith("PYTEST_") for k in os.environ):  # the usual case: no lock on a provider call
        return
    with _ENV_LOCK:
        for k in [k for k in os.environ if k.startswith("PYTEST_")]:
            try:
                del os.environ[k]
            except KeyError:  # another process-level writer removed it first
                pass


class ProviderLoadError(Exception):
    """A provider that cannot be used; ``str(e)`` is the one-line message."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class Version:
    major: int
    minor: int
    patch: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


def sha256_of(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


class Provider:
    """A loaded provider: typed access to the four KVX entry points."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).resolve()
        if not self.path.exists():
            raise ProviderLoadError(f"provider not found: {path}", EXIT_NOT_FOUND)
        if self.path.is_dir():
            raise ProviderLoadError(f"provider is a directory, not a shared library: {path}", EXIT_NOT_A_LIBRARY)
        try:
            self.lib = ctypes.CDLL(str(self.path), mode=ctypes.RTLD_LOCAL)
        except OSError as e:
            if not _is_elf(self.path):
                raise ProviderLoadError(f"not a shared library: {path}", EXIT_NOT_A_LIBRARY) from None
            detail = str(e).splitlines()[0] if str(e) else "dlopen failed"
            raise ProviderLoadError(f"cannot load shared library {path}: {detail}", EXIT_NOT_A_LIBRARY) from None
        missing = [name for name in ENTRY_POINTS if not hasattr(self.lib, name)]
        if missing:
            raise ProviderLoadError(
                f"not a KVX provider: {path} lacks {', '.join(missing)}", EXIT_NOT_A_PROVIDER
            )
        P = ctypes.POINTER
        self._get_version = self.lib.kvx_get_version
        self._get_version.argtypes = [P(abi.kvx_version_t)]
        self._get_version.restype = ctypes.c_int
        self._validate = self.lib.kvx_validate_cache_desc
        self._validate.argtypes = [ctypes.c_void_p]
        self._validate.restype = ctypes.c_int
        self._write = self.lib.kvx_write_kv
        self._write.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._write.restype = ctypes.c_int
        self._gather = self.lib.kvx_gather_kv
        self._gather.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._gather.restype = ctypes.c_int
        self._sha256: str | None = None

    @property
    def sha256(self) -> str:
        if self._sha256 is None:
            self._sha256 = sha256_of(self.path)
        return self._sha256

    # -- raw entry points: pointers may be ctypes structs (passed by reference) or ints / None
    @staticmethod
    def _ref(obj) -> int | None:
        if obj is None or isinstance(obj, int):
            return obj
        return ctypes.addressof(obj)

    # Each call is preceded by hide_test_environment and followed by health.after_call: on device /
    # unified runs it synchronizes and turns a sticky CUDA error into a device fault charged to
    # this entry point.
    def get_version_raw(self, version: abi.kvx_version_t | None) -> int:
        hide_test_environment()
        st = self._get_version(ctypes.byref(version) if version is not None else None)
        health.after_call("kvx_get_version")
        return st

    def validate_cache_desc(self, cache) -> int:
        hide_test_environment()
        st = self._validate(self._ref(cache))
        health.after_call("kvx_validate_cache_desc")
        return st

    def write_kv(self, cache, desc, stream: int | None = None) -> int:
        hide_test_environment()
        st = self._write(self._ref(cache), self._ref(desc), stream)
        health.after_call("kvx_write_kv")
        return st

    def gather_kv(self, cache, desc, stream: int | None = None) -> int:
        hide_test_environment()
        st = self._gather(self._ref(cache), self._ref(desc), stream)
        health.after_call("kvx_gather_kv")
        return st

    def version(self) -> Version:
        v = abi.kvx_version_t.new()
        st = self.get_version_raw(v)
        if st != Status.OK:
            raise ProviderLoadError(
                f"kvx_get_version failed for {self.path.name}: status {status_name(st)}", EXIT_VERSION_FAILED
            )
        return Version(v.abi_major, v.abi_minor, v.abi_patch)

    def negotiate(self) -> Version:
        """Spec 3: refuse a provider whose ABI major differs from ours."""
        ver = self.version()
        if ver.major != abi.ABI_VERSION_MAJOR:
            raise ProviderLoadError(
                f"incompatible provider {self.path.name}: ABI {ver} (major {ver.major}), "
                f"this harness speaks major {abi.ABI_VERSION_MAJOR} (KVX_STATUS_INCOMPATIBLE)",
                EXIT_INCOMPATIBLE,
            )
        return ver


def status_name(code: int) -> str:
    try:
        return Status(code).name
    except ValueError:
        return f"<unknown status {code}>"


def load_provider(path: str | os.PathLike, negotiate: bool = True) -> Provider:
    p = Provider(path)
    if negotiate:
        p.negotiate()
    return p
