"""Where the package build put its native files (reference provider, mutants, probe)."""
from __future__ import annotations

import os
from pathlib import Path


class NativeBuildMissing(RuntimeError):
    pass


def native_dir() -> Path:
    """Directory holding libkvx_reference.so, the mutants and kvx_abi_probe.

    ``KVX_CONFORM_NATIVE_DIR`` overrides it (for a build tree outside the package).
    """
    env = os.environ.get("KVX_CONFORM_NATIVE_DIR")
    if env:
        return Path(env)
    try:
        from .. import _native  # installed by the CMake build
    except ImportError:
        raise NativeBuildMissing(
            "kvx-conform's native build is missing: install the package (pip install .) so "
            "that CMake builds the reference provider"
        ) from None
    return Path(_native.__file__).resolve().parent


def have_cuda() -> bool:
    """True when the reference provider was compiled with its CUDA backend."""
    try:
        from .. import _native
    except ImportError:
        return False
    return bool(getattr(_native, "HAVE_CUDA", False))


def reference_provider() -> Path:
    return native_dir() / "libkvx_reference.so"


def mutant_provider(name: str) -> Path:
    return native_dir() / f"libkvx_mutant_{name}.so"


def mutant_names() -> list[str]:
    d = native_dir()
    return sorted(p.name[len("libkvx_mutant_"):-3] for p in d.glob("libkvx_mutant_*.so"))


def testing_provider(mode: str) -> Path:
    """A hostile / malformed test provider (csrc/testing/kvx_testing.c): segv_on_gather,
    hang_on_gather, major2, no_entry_points."""
    return native_dir() / f"libkvx_testing_{mode}.so"


def reference_provider_v1_1() -> Path:
    """The reference built against the v1.1 header (reports ABI 1.1, no FP4 extension)."""
    return native_dir() / "libkvx_reference_v1_1.so"


def bench_copy_library() -> Path:
    """libkvx_bench_copy.so (csrc/bench): the bench roofline's cudaMemcpyAsync and copy kernel.
    Built only with the CUDA backend; not a provider."""
    return native_dir() / "libkvx_bench_copy.so"


def abi_probe(minor: int = 2) -> Path:
    """The ABI probe of the header's default (1.2) build, or of its v1.1 build."""
    return native_dir() / ("kvx_abi_probe_v1_1" if minor == 1 else "kvx_abi_probe")


def default_provider() -> str | None:
    try:
        return str(reference_provider())
    except Exception:
        return None
