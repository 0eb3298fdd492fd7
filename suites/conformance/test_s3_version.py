"""Spec 3, 7 (R-SIZE): ``kvx_get_version``.

The version struct is handed over in a larger buffer whose bytes past the struct are
poisoned, so a provider writing beyond the ``size`` it was given is seen.
"""
from __future__ import annotations

import ctypes

import pytest

from kvx_conformance.abi import header as abi
from kvx_conformance.abi.header import Status
from kvx_conformance.cases.checks import check_status
from kvx_conformance.results.outcomes import RECOMMENDED, REQUIRED, ConformanceFailure, conformance

VERSION_SIZE = ctypes.sizeof(abi.kvx_version_t)  # 16
POISON = 0xA5
CL_VERSION = "spec 3, 7 (kvx_get_version MUST populate kvx_version_t and set size); R-SIZE"


def _call(provider, size: int, total: int = 64) -> tuple[int, bytes]:
    """Call kvx_get_version on a ``total``-byte poisoned buffer whose ``size`` field is ``size``."""
    buf = (ctypes.c_uint8 * total)(*([POISON] * total))
    ctypes.c_uint32.from_buffer(buf, 0).value = size
    v = ctypes.cast(buf, ctypes.POINTER(abi.kvx_version_t)).contents
    st = provider.get_version_raw(v)
    return st, bytes(buf)


def _fail(what: str, expected: str, got: str, case: str) -> ConformanceFailure:
    return ConformanceFailure(what, expected=expected, got=got, clause=CL_VERSION, case=case)


@conformance("version.fills_struct", CL_VERSION, REQUIRED, "core", "version")
def test_version_fills(kvx_provider):
    case = f"kvx_get_version(size={VERSION_SIZE}) on a poisoned 64-byte buffer"
    st, raw = _call(kvx_provider, VERSION_SIZE)
    check_status(st, Status.OK, clause=CL_VERSION, case=case)
    v = abi.kvx_version_t.from_buffer_copy(raw[:VERSION_SIZE])
    if v.abi_major != abi.ABI_VERSION_MAJOR:
        raise _fail("wrong ABI major", str(abi.ABI_VERSION_MAJOR), str(v.abi_major), case)
    if v.abi_minor < 1 or v.abi_minor == POISON * 0x01010101:
        raise _fail("ABI minor not filled in (a v1.1 provider reports minor >= 1)", ">= 1", str(v.abi_minor), case)
    if v.abi_patch == POISON * 0x01010101:
        raise _fail("abi_patch not written", "a patch number", hex(v.abi_patch), case)
    if v.size != VERSION_SIZE:
        raise _fail("size not set to sizeof(kvx_version_t)", str(VERSION_SIZE), str(v.size), case)
    if raw[VERSION_SIZE:] != bytes([POISON]) * (len(raw) - VERSION_SIZE):
        raise _fail("bytes past the struct were written", "untouched", "modified", case)


@conformance("version.null_pointer", "spec 3, 8; R-SIZE", REQUIRED, "core", "version")
def test_version_null(kvx_provider):
    st = kvx_provider.get_version_raw(None)
    check_status(st, Status.INVALID_ARGUMENT, clause="spec 3, 8; R-SIZE", case="kvx_get_version(NULL)")


@conformance("version.size_too_small", "spec 3, 6; R-SIZE (size < 16 is INVALID_ARGUMENT, nothing written; "
             "recommended: spec 3 has the provider set size)", RECOMMENDED, "core", "version")
@pytest.mark.parametrize("size", [0, 4, 12, VERSION_SIZE - 1])
def test_version_too_small(kvx_provider, size):
    case = f"kvx_get_version with size={size}"
    st, raw = _call(kvx_provider, size)
    check_status(st, Status.INVALID_ARGUMENT, clause="spec 3, 6; R-SIZE", case=case)
    want = size.to_bytes(4, "little") + bytes([POISON]) * (len(raw) - 4)
    if raw != want:
        raise ConformanceFailure("kvx_get_version wrote into a struct it refused", expected="nothing written",
                                 got=f"bytes changed: {raw[:VERSION_SIZE].hex()}", clause="spec 3, 6; R-SIZE",
                                 case=case)


@conformance("version.size_larger", "spec 3 (newer minor structs); R-SIZE", RECOMMENDED, "core", "version")
@pytest.mark.parametrize("size", [VERSION_SIZE + 4, 64])
def test_version_larger(kvx_provider, size):
    """A newer caller's larger struct: filled, size set to the provider's own 16, tail untouched."""
    case = f"kvx_get_version with size={size} (zeroed tail)"
    total = 80
    buf = (ctypes.c_uint8 * total)(*([0] * size + [POISON] * (total - size)))
    ctypes.c_uint32.from_buffer(buf, 0).value = size
    st = kvx_provider.get_version_raw(ctypes.cast(buf, ctypes.POINTER(abi.kvx_version_t)).contents)
    raw = bytes(buf)
    check_status(st, Status.OK, clause="spec 3; R-SIZE", case=case)
    v = abi.kvx_version_t.from_buffer_copy(raw[:VERSION_SIZE])
    if v.abi_major != abi.ABI_VERSION_MAJOR or v.size != VERSION_SIZE:
        raise _fail("larger struct not filled as a v1.1 one", f"major 1, size {VERSION_SIZE}",
                    f"major {v.abi_major}, size {v.size}", case)
    if raw[VERSION_SIZE:] != bytes(size - VERSION_SIZE) + bytes([POISON]) * (total - size):
        raise _fail("bytes past sizeof(kvx_version_t) were written", "untouched", "modified", case)
