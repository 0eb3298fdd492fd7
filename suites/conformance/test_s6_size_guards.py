"""Spec 3, 6 (R-SIZE, R-ORDER 1): size guards of every struct, nested ones included.

- ``size`` below the v1.1 ``sizeof`` of any struct the call reads is INVALID_ARGUMENT
  and the call writes nothing (required);
- NULL struct pointers are INVALID_ARGUMENT (required);
- a top-level struct with a larger ``size`` and a zeroed tail (a newer minor's struct)
  is accepted and served as the v1.1 prefix (recommended); a non-zero tail gives the
  correct result or UNSUPPORTED (recommended; never a misread);
- an embedded struct with a larger ``size`` is accepted (recommended);
- ``cache.pool`` is read (and guarded) only for KV_OFFSETS tables (recommended);
- a provider reporting ABI minor 2 or more reads the 1.2 structs a 1.2 caller passes for every
  cache: an all-zero FP4 extension (size 0, format NONE) is a v1.1 cache, served as such
  (required).
"""
from __future__ import annotations

import ctypes

import pytest

from kvx_conformance.abi import header as abi
from kvx_conformance.abi.header import DType
from kvx_conformance.cases import build as cb
from kvx_conformance.cases import fp4 as fx
from kvx_conformance.cases.checks import verify_gather, verify_validate, verify_write
from kvx_conformance.results.outcomes import RECOMMENDED, REQUIRED, Unsupported, conformance

G = cb.GEOM
CL_SMALL = "spec 3, 6 (all public structs are size-validated); R-SIZE, R-ORDER 1"
CL_LARGE = "spec 3 (a consumer MAY accept a newer minor); R-SIZE"

STRUCT_OF = {
    "cache": abi.kvx_cache_desc_t, "cache.k": abi.kvx_tensor_desc_t, "cache.v": abi.kvx_tensor_desc_t,
    "cache.pool": abi.kvx_pool_desc_t, "desc.io": abi.kvx_kv_io_desc_t, "desc.io.key": abi.kvx_tensor_desc_t,
    "desc.io.value": abi.kvx_tensor_desc_t, "desc.slots": abi.kvx_slot_mapping_t,
    "desc.k_scale_desc": abi.kvx_scale_desc_t, "desc.v_scale_desc": abi.kvx_scale_desc_t,
    "desc.block_table": abi.kvx_block_table_t, "desc.seq_lens": abi.kvx_seq_lens_t,
}
CACHE_PATHS = ("cache", "cache.k", "cache.v")
WRITE_PATHS = CACHE_PATHS + ("desc", "desc.io", "desc.io.key", "desc.io.value", "desc.slots",
                             "desc.k_scale_desc", "desc.v_scale_desc")
GATHER_PATHS = CACHE_PATHS + ("desc", "desc.io", "desc.io.key", "desc.io.value", "desc.block_table", "desc.seq_lens")


def _sizeof(path: str, entry: str) -> int:
    if path == "desc":
        return ctypes.sizeof(abi.kvx_write_desc_t if entry == "write" else abi.kvx_gather_desc_t)
    return ctypes.sizeof(STRUCT_OF[path])


def _small_params(entry: str, paths):
    out = []
    for p in paths:
        n = _sizeof(p, entry)
        for label, size in (("zero", 0), ("half", n // 2), ("minus1", n - 1)):
            out.append(pytest.param(p, size, id=f"{p}-{label}"))
    return out


# ---------------------------------------------------------------------------- cases


def _write_case(provider, memory, overrides=None, seed=1, label="size guard probe"):
    cache = cb.simple_cache(G, cb.core_layout(provider, memory), DType.F16, seed=seed)
    return cb.write_case(cache, cb.spread_slots(G, 5, seed), seed=seed + 1, label=label, overrides=overrides)


def _gather_case(provider, memory, overrides=None, seed=3, label="size guard probe"):
    cache = cb.simple_cache(G, cb.core_layout(provider, memory), DType.F16, seed=seed)
    return cb.packed_gather(cache, cb.distinct_table(G, 2, 2, seed), [5, 8], 8, seed=seed + 1,
                            label=label, overrides=overrides)


def _kv_gather_case(provider, memory, overrides=None, seed=5):
    c = cb.kv_offsets_cache(G, DType.F16, primary_blocks=8, seed=seed)
    t = cb.layout(G, cb.core_layout(provider, memory), DType.F16)
    c = cb.replace(c, k=t, v=t, k_init=cb.finite_values(cb.rng_for(seed), DType.F16, t.span_elements()),
                   v_init=cb.finite_values(cb.rng_for(seed + 1), DType.F16, t.span_elements()))
    off = cb.rng_for(seed).integers(0, 8, size=(2, 1, 2, 2))
    return cb.kv_offsets_gather(c, off, [5, 8], 8, seed=seed + 1, label="KV_OFFSETS size guard probe",
                                overrides=overrides)


def _validate_case(provider, memory, overrides=None, seed=7, label="size guard probe"):
    return cb.validate_case(cb.simple_cache(G, cb.core_layout(provider, memory), DType.F16, seed=seed),
                            label=label, overrides=overrides)


# ---------------------------------------------------------------------------- too small


@conformance("size.validate.too_small", CL_SMALL, REQUIRED, "core", "validate")
@pytest.mark.parametrize("path,size", _small_params("validate", CACHE_PATHS))
def test_validate_too_small(kvx_provider, kvx_call_options, path, size):
    opts = kvx_call_options()
    case = _validate_case(kvx_provider, opts.memory, {f"{path}.size": size})
    verify_validate(kvx_provider, case, opts, clause=CL_SMALL)


@conformance("size.write.too_small", CL_SMALL, REQUIRED, "core", "write")
@pytest.mark.parametrize("path,size", _small_params("write", WRITE_PATHS))
def test_write_too_small(kvx_provider, kvx_call_options, path, size):
    opts = kvx_call_options()
    case = _write_case(kvx_provider, opts.memory, {f"{path}.size": size})
    verify_write(kvx_provider, case, opts, clause=CL_SMALL)


@conformance("size.gather.too_small", CL_SMALL, REQUIRED, "core", "gather")
@pytest.mark.parametrize("path,size", _small_params("gather", GATHER_PATHS))
def test_gather_too_small(kvx_provider, kvx_call_options, path, size):
    opts = kvx_call_options()
    case = _gather_case(kvx_provider, opts.memory, {f"{path}.size": size})
    verify_gather(kvx_provider, case, opts, clause=CL_SMALL)


@conformance("size.gather.pool_too_small", CL_SMALL + " (cache.pool with KV_OFFSETS)", REQUIRED, "tables", "gather",
             feature="kv_offsets")
@pytest.mark.parametrize("path,size", _small_params("gather", ("cache.pool",)))
def test_gather_pool_too_small(kvx_provider, kvx_call_options, path, size):
    opts = kvx_call_options()
    case = _kv_gather_case(kvx_provider, opts.memory, {f"{path}.size": size})
    verify_gather(kvx_provider, case, opts, clause=CL_SMALL, feature="kv_offsets")


NULL_CASES = ["validate-cache", "write-cache", "write-desc", "gather-cache", "gather-desc"]


@conformance("size.null_struct_pointer", "spec 6, 7; R-ORDER 1 (NULL descriptor pointers)", REQUIRED, "core",
             ("validate", "write", "gather"))
@pytest.mark.parametrize("which", NULL_CASES)
def test_null_struct_pointer(kvx_provider, kvx_call_options, which):
    opts = kvx_call_options()
    entry, root = which.split("-")
    ov = {root: None}
    clause = "spec 6, 7; R-ORDER 1"
    if entry == "validate":
        verify_validate(kvx_provider, _validate_case(kvx_provider, opts.memory, ov), opts, clause=clause)
    elif entry == "write":
        verify_write(kvx_provider, _write_case(kvx_provider, opts.memory, ov), opts, clause=clause)
    else:
        verify_gather(kvx_provider, _gather_case(kvx_provider, opts.memory, ov), opts, clause=clause)


@conformance("size.pool_unguarded_without_kv_offsets", "spec 6.1 (pool conditional); R-SIZE", RECOMMENDED, "core",
             ("validate", "write", "gather"))
@pytest.mark.parametrize("entry", ["validate", "write", "gather"])
def test_pool_ignored_without_kv_offsets(kvx_provider, kvx_call_options, entry):
    """A zeroed pool (size 0) is not read unless the table is KV_OFFSETS."""
    opts = kvx_call_options()
    ov = {"cache.pool.size": 0, "cache.pool.memory": 0}
    clause = "spec 6.1; R-SIZE"
    if entry == "validate":
        verify_validate(kvx_provider, _validate_case(kvx_provider, opts.memory, ov), opts, clause=clause)
    elif entry == "write":
        verify_write(kvx_provider, _write_case(kvx_provider, opts.memory, ov), opts, clause=clause)
    else:
        verify_gather(kvx_provider, _gather_case(kvx_provider, opts.memory, ov), opts, clause=clause)


# ---------------------------------------------------------------------------- larger


class GrownStructs:
    """A provider proxy handing the top-level structs ``roots`` over in buffers ``extra``
    bytes larger than v1.1's (an int, or a dict root -> bytes), the tail filled with ``fill``
    and ``size`` saying so."""

    def __init__(self, provider, roots: tuple[str, ...], extra: int | dict[str, int] = 16, fill: int = 0):
        self.provider, self.roots, self.extra, self.fill = provider, roots, extra, fill
        self.path = provider.path

    def _grow(self, name: str, obj, keep: list):
        if name not in self.roots or obj is None or isinstance(obj, int):
            return obj
        n = ctypes.sizeof(obj)
        extra = self.extra[name] if isinstance(self.extra, dict) else self.extra
        buf = (ctypes.c_uint8 * (n + extra))()
        ctypes.memmove(buf, ctypes.addressof(obj), n)
        ctypes.memset(ctypes.addressof(buf) + n, self.fill, extra)
        ctypes.c_uint32.from_buffer(buf, 0).value = n + extra
        keep.append(buf)
        return ctypes.addressof(buf)

    def validate_cache_desc(self, cache):
        keep: list = []
        return self.provider.validate_cache_desc(self._grow("cache", cache, keep))

    def write_kv(self, cache, desc, stream=None):
        keep: list = []
        return self.provider.write_kv(self._grow("cache", cache, keep), self._grow("desc", desc, keep), stream)

    def gather_kv(self, cache, desc, stream=None):
        keep: list = []
        return self.provider.gather_kv(self._grow("cache", cache, keep), self._grow("desc", desc, keep), stream)


LARGER = [
    pytest.param("validate", ("cache",), id="validate-cache"),
    pytest.param("write", ("cache",), id="write-cache"),
    pytest.param("write", ("desc",), id="write-desc"),
    pytest.param("write", ("cache", "desc"), id="write-both"),
    pytest.param("gather", ("cache",), id="gather-cache"),
    pytest.param("gather", ("desc",), id="gather-desc"),
]


def _run(entry, provider, opts, clause, feature=None, overrides=None, label="size guard probe"):
    # the core layout is the provider's own answer, not the proxy's (a refused grown struct must not
    # make "hnd" the layout of the worker's later tests)
    cb.core_layout(getattr(provider, "provider", provider), opts.memory)
    if entry == "validate":
        return verify_validate(provider, _validate_case(provider, opts.memory, overrides, label=label), opts,
                               clause=clause, feature=feature)
    if entry == "write":
        return verify_write(provider, _write_case(provider, opts.memory, overrides, label=label), opts,
                            clause=clause, feature=feature)
    return verify_gather(provider, _gather_case(provider, opts.memory, overrides, label=label), opts,
                         clause=clause, feature=feature)


@conformance("size.larger_zero_tail", CL_LARGE, RECOMMENDED, "core", ("validate", "write", "gather"))
@pytest.mark.parametrize("entry,roots", LARGER)
def test_larger_zero_tail(kvx_provider, kvx_call_options, entry, roots):
    opts = kvx_call_options()
    _run(entry, GrownStructs(kvx_provider, roots, extra=24, fill=0), opts, CL_LARGE)


@conformance("size.larger_nonzero_tail", CL_LARGE + " (unknown non-zero fields: correct or UNSUPPORTED)",
             RECOMMENDED, "core", ("validate", "write", "gather"), feature="nonzero_tail")
@pytest.mark.parametrize("entry,roots", LARGER)
def test_larger_nonzero_tail(kvx_provider, kvx_call_options, entry, roots):
    opts = kvx_call_options()
    _run(entry, GrownStructs(kvx_provider, roots, extra=24, fill=0x5A), opts, CL_LARGE, feature="nonzero_tail")


CL_V12 = ("kvx_abi.h (KVX 1.2: \"An all-zero extension (size 0, format NONE) means a v1.1 cache\"; a caller "
          "uses the 1.2 layout with a provider whose kvx_get_version reports minor >= 2); spec 3; R-SIZE-1.2")
#: bytes a 1.2 caller's top-level structs have beyond v1.1's (the appended ``fp4`` field)
V12_EXTRA = {"cache": abi.V1_2_SIZES["kvx_cache_desc_t"] - abi.V1_1_SIZES["kvx_cache_desc_t"]}
V12_EXTRA_DESC = {"write": abi.V1_2_SIZES["kvx_write_desc_t"] - abi.V1_1_SIZES["kvx_write_desc_t"],
                  "gather": abi.V1_2_SIZES["kvx_gather_desc_t"] - abi.V1_1_SIZES["kvx_gather_desc_t"]}
V12 = [
    pytest.param("validate", ("cache",), id="validate-cache"),
    pytest.param("write", ("cache", "desc"), id="write-both"),
    pytest.param("write", ("cache",), id="write-cache"),
    pytest.param("gather", ("cache", "desc"), id="gather-both"),
    pytest.param("gather", ("cache",), id="gather-cache"),
]


@conformance("size.v1_2_zero_extension", CL_V12, REQUIRED, "core", ("validate", "write", "gather"))
@pytest.mark.parametrize("entry,roots", V12)
def test_v1_2_structs_zero_extension(kvx_provider, kvx_call_options, entry, roots):
    """An F16 cache written, gathered and validated through the KVX 1.2 structs (``size`` the 1.2
    sizeof, the appended ``fp4`` field all zero), as a caller built with KVX_ABI_TARGET_MINOR=2
    passes them for every cache: a provider of minor 2 or more reads them as the v1.1 call they
    describe. A provider that size-guards the FP4 extension whenever the struct is 1.2-sized (or
    takes the FP4 path on size alone) refuses every non-FP4 cache of a 1.2 caller. A provider of
    minor 1 has no 1.2 structs: such a call is ``size.larger_zero_tail``'s (recommended)."""
    minor = fx.provider_minor(kvx_provider)
    if minor < 2:
        raise Unsupported(f"provider reports ABI minor {minor} (< 2): no 1.2 structs (a larger struct is "
                          f"size.larger_zero_tail's)", feature="fp4")
    opts = kvx_call_options()
    extra = {**V12_EXTRA, "desc": V12_EXTRA_DESC.get(entry, 0)}
    v11 = {"cache": abi.V1_1_SIZES["kvx_cache_desc_t"], "desc": abi.V1_1_SIZES.get(f"kvx_{entry}_desc_t", 0)}
    sizes = ", ".join(f"{r} size {v11[r] + extra[r]}" for r in roots)
    label = f"F16 cache, KVX 1.2 structs ({sizes}), the appended fp4 field all zero (a v1.1 cache)"
    _run(entry, GrownStructs(kvx_provider, roots, extra=extra, fill=0), opts, CL_V12, label=label)


EMBEDDED = {
    "validate": ("cache.k", "cache.v"),
    "write": ("cache.k", "desc.io", "desc.io.key", "desc.slots", "desc.k_scale_desc"),
    "gather": ("cache.v", "desc.io", "desc.io.value", "desc.block_table", "desc.seq_lens"),
}


@conformance("size.embedded_larger", "spec 6; R-SIZE (embedded structs: a larger size reads the known prefix)",
             RECOMMENDED, "core", ("validate", "write", "gather"))
@pytest.mark.parametrize("entry,path", [pytest.param(e, p, id=f"{e}-{p}") for e, ps in EMBEDDED.items() for p in ps])
def test_embedded_larger(kvx_provider, kvx_call_options, entry, path):
    opts = kvx_call_options()
    ov = {f"{path}.size": _sizeof(path, entry) + 8}
    _run(entry, kvx_provider, opts, "spec 6; R-SIZE", overrides=ov)

