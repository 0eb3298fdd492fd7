"""The header against the published KVX v1.1 layout, and the ctypes mirror against the probe.

The published KVX v1.1 table (mirrored below as PUBLISHED) gives field order and C types; natural C
alignment on x86-64/aarch64 LP64 gives the offsets. The ABI probe (compiled from
csrc/include/kvx/kvx_abi.h by the package build) prints what the compiler made of
our header.
"""
from __future__ import annotations

import ctypes
import json
import subprocess

import pytest

from kvx_conformance.abi import header as abi, native

# Published v1.1 layout: (field, C type) in declaration order. "E" is a C enum (int).
U32, I64, PTR, E = ("u32", 4, 4), ("i64", 8, 8), ("ptr", 8, 8), ("enum", 4, 4)
I64x5 = ("i64[5]", 40, 8)
PUBLISHED: dict[str, list[tuple[str, object]]] = {
    "kvx_version_t": [("size", U32), ("abi_major", U32), ("abi_minor", U32), ("abi_patch", U32)],
    "kvx_tensor_desc_t": [("size", U32), ("dtype", E), ("layout", E), ("memory", E), ("ndim", U32),
                          ("shape", I64x5), ("stride", I64x5), ("data", PTR)],
    "kvx_pool_desc_t": [("size", U32), ("memory", E), ("bytes_per_block", U32), ("primary", PTR), ("secondary", PTR)],
    "kvx_cache_desc_t": [("size", U32), ("num_blocks", U32), ("block_size", U32), ("num_kv_heads", U32),
                         ("head_dim", U32), ("k", "kvx_tensor_desc_t"), ("v", "kvx_tensor_desc_t"),
                         ("pool", "kvx_pool_desc_t")],
    "kvx_block_table_t": [("size", U32), ("format", E), ("index_dtype", E), ("indptr_dtype", E), ("seq_count", U32),
                          ("beam_width", U32), ("max_blocks_per_seq", U32), ("indices", PTR), ("indptr", PTR),
                          ("indices_count", U32), ("indptr_count", U32), ("flags", U32)],
    "kvx_slot_mapping_t": [("size", U32), ("dtype", E), ("token_count", U32), ("invalid_slot", I64), ("slots", PTR)],
    "kvx_seq_lens_t": [("size", U32), ("dtype", E), ("seq_count", U32), ("lengths", PTR)],
    "kvx_kv_io_desc_t": [("size", U32), ("key", "kvx_tensor_desc_t"), ("value", "kvx_tensor_desc_t"),
                         ("num_tokens", U32), ("num_kv_heads", U32), ("head_dim", U32)],
    "kvx_scale_desc_t": [("size", U32), ("dtype", E), ("granularity", E), ("ndim", U32), ("shape", I64x5),
                         ("stride", I64x5), ("data", PTR)],
    "kvx_write_desc_t": [("size", U32), ("io", "kvx_kv_io_desc_t"), ("slots", "kvx_slot_mapping_t"),
                         ("k_scale", PTR), ("v_scale", PTR), ("k_scale_desc", "kvx_scale_desc_t"),
                         ("v_scale_desc", "kvx_scale_desc_t")],
    "kvx_gather_desc_t": [("size", U32), ("io", "kvx_kv_io_desc_t"), ("block_table", "kvx_block_table_t"),
                          ("seq_lens", "kvx_seq_lens_t"), ("max_seq_len", U32)],
}
PUBLISHED_ENUMS = {
    "kvx_status_t": dict(OK=0, INVALID_ARGUMENT=1, UNSUPPORTED=2, OUT_OF_RANGE=3, INCOMPATIBLE=4, INTERNAL_ERROR=5),
    "kvx_dtype_t": dict(INVALID=0, F16=1, BF16=2, F32=3, F8_E4M3=4, F8_E5M2=5, S32=6, S64=7, U32=8, U64=9, U8=10),
    "kvx_memory_type_t": dict(UNKNOWN=0, HOST=1, DEVICE=2, UNIFIED=3),
    "kvx_layout_t": dict(INVALID=0, BLOCK_NHD=1, BLOCK_HND=2, BLOCK_HND_PACKED=3, BLOCK_CUSTOM=15),
    "kvx_block_table_format_t": dict(INVALID=0, PACKED=1, RAGGED=2, KV_OFFSETS=3),
    "kvx_block_table_flags_t": dict(NONE=0, KVCACHEINDEX=1),
    "kvx_scale_granularity_t": dict(NONE=0, PER_TENSOR=1, PER_BLOCK=2, PER_HEAD=3, PER_BLOCK_HEAD=4),
}


def _published_layout() -> dict[str, dict]:
    """Offsets and sizes implied by the published table under natural alignment."""
    out: dict[str, dict] = {}

    def layout(name: str) -> dict:
        if name in out:
            return out[name]
        off, align, fields = 0, 1, []
        for fname, ftype in PUBLISHED[name]:
            if isinstance(ftype, str):
                sub = layout(ftype)
                size, al = sub["size"], sub["align"]
            else:
                _, size, al = ftype
            off = (off + al - 1) // al * al
            fields.append({"name": fname, "offset": off, "size": size})
            off += size
            align = max(align, al)
        out[name] = {"size": (off + align - 1) // align * align, "align": align, "fields": fields}
        return out[name]

    for n in PUBLISHED:
        layout(n)
    return out


def _run_probe(minor: int) -> dict:
    exe = native.abi_probe(minor)
    assert exe.exists(), f"ABI probe missing at {exe}: the package build must produce it"
    return json.loads(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)


@pytest.fixture(scope="module")
def probe() -> dict:
    """The header's v1.1 build (KVX_ABI_TARGET_MINOR=1): must be the published layout."""
    return _run_probe(1)


@pytest.fixture(scope="module")
def probe_v1_2() -> dict:
    """The header's default build (KVX 1.2, FP4 extension appended)."""
    return _run_probe(2)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_header_matches_published_layout(probe, name):
    assert ctypes.sizeof(ctypes.c_void_p) == 8, "the published table is for LP64 targets"
    want = _published_layout()[name]
    got = probe["structs"][name]
    assert [f["name"] for f in got["fields"]] == [f["name"] for f in want["fields"]], "field order"
    assert got["fields"] == want["fields"], f"{name}: field offsets/sizes differ from the published v1.1 layout"
    assert (got["size"], got["align"]) == (want["size"], want["align"])


def test_tensor_desc_is_112_bytes(probe):
    # kvx-abi-1.1.md: "on x86-64 a kvx_tensor_desc_t is 112 bytes"
    assert probe["structs"]["kvx_tensor_desc_t"]["size"] == 112


@pytest.mark.parametrize("name", sorted(PUBLISHED_ENUMS))
def test_header_enums_match_published(probe, name):
    e = probe["enums"][name]
    assert e["size"] == 4, "C enums are 4-byte ints"
    cls, prefix = abi.ENUMS[name]
    want = {prefix + k: v for k, v in PUBLISHED_ENUMS[name].items()}
    assert e["values"] == want


def test_header_constants(probe):
    assert probe["constants"] == {"KVX_MAX_TENSOR_DIMS": 5, "KVX_ABI_VERSION_MAJOR": 1, "KVX_ABI_VERSION_MINOR": 1}


def _check_mirror(cls, got: dict, name: str) -> None:
    assert ctypes.sizeof(cls) == got["size"]
    assert ctypes.alignment(cls) == got["align"]
    assert [f[0] for f in abi.all_fields(cls)] == [f["name"] for f in got["fields"]]
    for f in got["fields"]:
        member = getattr(cls, f["name"])
        assert (member.offset, member.size) == (f["offset"], f["size"]), f"{name}.{f['name']}"


@pytest.mark.parametrize("name", sorted(abi.STRUCTS))
def test_ctypes_mirror_matches_probe(probe, name):
    _check_mirror(abi.STRUCTS[name], probe["structs"][name], name)


@pytest.mark.parametrize("name", sorted(abi.STRUCTS_V1_2))
def test_ctypes_v1_2_mirror_matches_probe(probe_v1_2, name):
    _check_mirror(abi.STRUCTS_V1_2[name], probe_v1_2["structs"][name], name)


def test_v1_2_only_appends(probe, probe_v1_2):
    """KVX 1.2 keeps every v1.1 field where it was and appends only to top-level structs."""
    for name, old in probe["structs"].items():
        new = probe_v1_2["structs"][name]
        assert new["fields"][: len(old["fields"])] == old["fields"], name
        if new["size"] != old["size"]:
            assert name in ("kvx_cache_desc_t", "kvx_write_desc_t", "kvx_gather_desc_t"), name
            assert [f["name"] for f in new["fields"][len(old["fields"]):]] == ["fp4"], name
            assert new["fields"][len(old["fields"])]["offset"] == old["size"], name
    for name, old in probe["enums"].items():
        assert probe_v1_2["enums"][name]["values"].items() >= old["values"].items(), name
    assert probe_v1_2["constants"]["KVX_ABI_VERSION_MINOR"] == 2


@pytest.mark.parametrize("name", sorted(abi.ENUMS))
def test_ctypes_enums_match_probe(probe_v1_2, name):
    cls, prefix = abi.ENUMS[name]
    assert {prefix + n: int(m.value) for n, m in cls.__members__.items()} == probe_v1_2["enums"][name]["values"]


def test_header_compiles_as_cxx_and_c(tmp_path):
    """The header is usable from C and C++ (extern "C", no C++-only constructs)."""
    import shutil

    inc = native_header_dir()
    src = tmp_path / "use.c"
    src.write_text('#include "kvx/kvx_abi.h"\nint f(void){kvx_version_t v; v.size=sizeof v; return (int)kvx_get_version(&v);}\n')
    for compiler, std in (("cc", "-std=c99"), ("c++", "-std=c++11")):
        if shutil.which(compiler) is None:
            pytest.fail(f"{compiler} not found: the build needs a C and a C++ compiler")
        args = [compiler, std, "-Wall", "-Wextra", "-Werror", "-fsyntax-only", f"-I{inc}"]
        if compiler == "c++":
            args += ["-x", "c++"]
        subprocess.run(args + [str(src)], check=True)


def native_header_dir():
    from pathlib import Path

    return Path(__file__).resolve().parents[1] / "csrc" / "include"
