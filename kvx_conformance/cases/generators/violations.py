"""Cases that break exactly one rule of docs/spec-readings.md (``RULES``), with the status the readings expect."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...abi import header as abi
from ...abi.descriptors import BlockTable
from ...abi.header import BASELINE_DTYPES, CACHE_DTYPES, FP8_DTYPES, DType, Layout, Status, TableFormat
from ..case import GatherCase, ValidateCase, WriteCase
from .valid import random_gather_case, random_geometry, random_validate_case, random_write_case
from .values import CORE, INT32_MAX, INT32_MIN, NULL_INDEX, Profile, SECONDARY_BIT, _pick, _profile, using_profile


def profile_for(features) -> Profile:
    """The profile of VALID cases that use only ``features`` (``outcomes.OPTIONAL_FEATURES``
    names; the provider's core layout "nhd" or "hnd" among them) beyond required behaviour:
    F16/BF16/F32 caches, IO of the cache's dtype, dense 3-D IO, canonical strides, PACKED
    tables, S32/S64 metadata, invalid slots. Scales are always drawn: a non-FP8 cache must
    ignore them (required)."""
    f = set(features)
    canon = [k for k in ("nhd", "hnd", "hnd_packed") if k in f]
    if "custom_layout" in f:
        canon.append("custom")
    kinds = list(canon)
    if "noncanonical_strides" in f:
        kinds += [k for k, need in (("nhd_padded", {"nhd"}), ("hnd_padded", {"hnd"}), ("vllm_v", {"hnd"}),
                                    ("permuted", {"nhd", "hnd"})) if need <= f]
    if not kinds:
        raise ValueError("profile_for needs at least one of the core layouts 'nhd' / 'hnd'")
    return Profile(
        layout_kinds=tuple(kinds),
        io_kinds=("dense", "padded", "permuted") if "io_strides" in f else ("dense",),
        four_d="gather_4d" in f,
        cache_dtypes=CACHE_DTYPES if "fp8" in f else BASELINE_DTYPES,
        formats=tuple(x for x, need in ((TableFormat.PACKED, None), (TableFormat.RAGGED, "ragged"),
                                        (TableFormat.KV_OFFSETS, "kv_offsets")) if need is None or need in f),
        mixed_kv="mixed_layouts" in f,
        mixed_io="mixed_io_dtype" in f,
        noncanonical="noncanonical_strides" in f,
        secondary="secondary_pool" in f,
    )


@dataclass
class Violation:
    """A case that breaks exactly ``rule``; the provider must answer ``status``."""

    case: WriteCase | GatherCase | ValidateCase
    rule: str
    status: Status
    clause: str


@dataclass(frozen=True)
class RuleCase:
    clause: str
    status: Status
    builder: Callable[[np.random.Generator], WriteCase | GatherCase | ValidateCase]


def _with(case, mapping: dict):
    """The case with these C overrides added (``cases.COverrides`` paths)."""
    new = dict(case.c_overrides)
    new.update(mapping)
    return dataclasses.replace(case, c_overrides=new)


def _any_call(rng, *, gather_formats=(TableFormat.PACKED, TableFormat.RAGGED, TableFormat.KV_OFFSETS), write_kw=None,
              gather_kw=None, calls=("validate", "write", "gather")):
    call = _pick(rng, calls)
    if call == "validate":
        return random_validate_case(rng)
    if call == "write":
        return random_write_case(rng, **(write_kw or {}))
    gather_kw = dict(gather_kw or {})
    if "fmt" not in gather_kw:
        fmts = [f for f in gather_formats if f in _profile.get().formats] or list(gather_formats)
        gather_kw["fmt"] = _pick(rng, fmts)
    return random_gather_case(rng, **gather_kw)


_TENSOR_DIM = {  # index of each logical dimension in the shape of a layout
    Layout.BLOCK_NHD: {"b": 0, "t": 1, "h": 2, "d": 3},
    Layout.BLOCK_CUSTOM: {"b": 0, "t": 1, "h": 2, "d": 3},
    Layout.BLOCK_HND: {"b": 0, "h": 1, "t": 2, "d": 3},
    Layout.BLOCK_HND_PACKED: {"b": 0, "h": 1, "d": 2, "t": 3},
}


def _zero_geometry(field: str, dim: str):
    def build(rng):
        calls = ("validate", "write", "gather")
        case = _any_call(rng, gather_formats=(TableFormat.PACKED, TableFormat.RAGGED),
                         write_kw={"scales": "none"}, calls=calls)
        ov = {f"cache.{field}": 0}
        for side in ("k", "v"):
            t = getattr(case.cache, side)
            ov[f"cache.{side}.shape[{_TENSOR_DIM[t.layout][dim]}]"] = 0
        if dim in ("h", "d") and not isinstance(case, ValidateCase):
            io_field = "num_kv_heads" if dim == "h" else "head_dim"
            ov[f"desc.io.{io_field}"] = 0
            for t_name in ("key", "value"):
                io_t = case.key_layout if isinstance(case, WriteCase) and t_name == "key" else (
                    case.value_layout if isinstance(case, WriteCase) else case.out_layout)
                idx = (len(io_t.shape) - 2) if dim == "h" else (len(io_t.shape) - 1)
                ov[f"desc.io.{t_name}.shape[{idx}]"] = 0
        return _with(case, ov)
    return build


def _size(path: str, calls):
    def build(rng):
        if path == "cache.pool":
            case = random_gather_case(rng, fmt=TableFormat.KV_OFFSETS)
        else:
            case = _any_call(rng, calls=calls)
        struct = {
            "cache": "kvx_cache_desc_t", "cache.k": "kvx_tensor_desc_t", "cache.v": "kvx_tensor_desc_t",
            "cache.pool": "kvx_pool_desc_t", "desc.io": "kvx_kv_io_desc_t", "desc.io.key": "kvx_tensor_desc_t",
            "desc.io.value": "kvx_tensor_desc_t", "desc.slots": "kvx_slot_mapping_t",
            "desc.k_scale_desc": "kvx_scale_desc_t", "desc.v_scale_desc": "kvx_scale_desc_t",
            "desc.block_table": "kvx_block_table_t", "desc.seq_lens": "kvx_seq_lens_t",
        }.get(path) or ("kvx_write_desc_t" if isinstance(case, WriteCase) else "kvx_gather_desc_t")
        full = abi.V1_1_SIZES[struct]
        small = _pick(rng, [0, full - 1, full // 2, 4, full - 8])
        return _with(case, {f"{path}.size": int(small)})
    return build


def _tensor_rule(mutate, calls=("validate", "write", "gather"), gather_formats=None, **gen_kw):
    """A cache-tensor rule: ``mutate(rng, case, side, tensor) -> overrides`` on k or v."""
    def build(rng):
        fmts = gather_formats or (TableFormat.PACKED, TableFormat.RAGGED, TableFormat.KV_OFFSETS)
        for _ in range(100):
            case = _any_call(rng, calls=calls, gather_formats=fmts, write_kw=gen_kw.get("write_kw"),
                             gather_kw=gen_kw.get("gather_kw"))
            side = _pick(rng, ("k", "v"))
            ov = mutate(rng, case, side, getattr(case.cache, side))
            if ov is not None:
                return _with(case, ov) if isinstance(ov, dict) else ov
        raise RuntimeError("no case fits this rule")
    return build


def _m_dtype(rng, case, side, t):
    return {f"cache.{side}.dtype": int(_pick(rng, [0, 6, 7, 8, 9, 10, 99]))}


def _m_layout(rng, case, side, t):
    return {f"cache.{side}.layout": int(_pick(rng, [0, 4, 7, 14, 99]))}


def _m_ndim(rng, case, side, t):
    return {f"cache.{side}.ndim": int(_pick(rng, [n for n in range(0, 8) if n != len(t.shape)]))}


def _m_pack_zero(rng, case, side, t):
    if t.layout != Layout.BLOCK_HND_PACKED:
        return None
    return {f"cache.{side}.shape[4]": int(_pick(rng, [0, -1, -4]))}


def _m_pack_divides(rng, case, side, t):
    if t.layout != Layout.BLOCK_HND_PACKED:
        return None
    D = case.cache.geom.head_dim
    bad = int(_pick(rng, [p for p in (3, 5, 6, 7, 32, 64, D + 1) if D % p]))
    # shape[2] = D // pack as a provider skipping the divisibility rule would expect it
    return {f"cache.{side}.shape[4]": bad, f"cache.{side}.shape[2]": D // bad}


def _m_shape(rng, case, side, t):
    i = int(rng.integers(4))  # never shape[4] (the pack of HND_PACKED)
    return {f"cache.{side}.shape[{i}]": int(t.shape[i]) + int(rng.integers(1, 4))}


def _m_data_null(rng, case, side, t):
    return {f"cache.{side}.data": None}


def _m_memory_invalid(rng, case, side, t):
    bad = int(_pick(rng, [0, 4, 7, 99]))
    ov = {"cache.k.memory": bad, "cache.v.memory": bad}
    if not isinstance(case, ValidateCase):
        ov.update({"desc.io.key.memory": bad, "desc.io.value.memory": bad})
    return ov


def _m_memory_mismatch(rng, case, side, t):
    return {f"cache.{side}.memory": int(_pick(rng, [abi.Memory.DEVICE, abi.Memory.UNIFIED]))} if side == "v" else None


def _m_stride_zero(rng, case, side, t):
    dims = [i for i, n in enumerate(t.shape) if n > 1]
    if not dims:
        return None
    return {f"cache.{side}.stride[{int(_pick(rng, dims))}]": 0}


def _m_overflow(rng, case, side, t):
    dims = [i for i, n in enumerate(t.shape) if n >= 3]
    if not dims:
        return None
    return {f"cache.{side}.stride[{int(_pick(rng, dims))}]": 1 << 62}


def _m_stride_negative(rng, case, side, t):
    """The tensor walked backwards along one dimension: a negative stride and the data pointer at
    that dimension's last index, so every element stays in the buffer (a provider may serve it)."""
    dims = [i for i, x in enumerate(t.stride) if x > 0]
    if not dims:
        return None
    cache = dataclasses.replace(case.cache, **{side: t.reversed(int(_pick(rng, dims)))})
    return dataclasses.replace(case, cache=cache)


def _io_rule(mutate, calls=("write", "gather"), **gen_kw):
    """An IO-tensor rule: ``mutate(rng, case, name, layout) -> overrides`` on io.key or io.value."""
    def build(rng):
        for _ in range(100):
            call = _pick(rng, calls)
            case = random_write_case(rng, **gen_kw.get("write_kw", {})) if call == "write" else \
                random_gather_case(rng, **gen_kw.get("gather_kw", {}))
            name = _pick(rng, ("key", "value"))
            layout = (case.key_layout if name == "key" else case.value_layout) if call == "write" else case.out_layout
            ov = mutate(rng, case, name, layout)
            if ov is not None:
                return _with(case, ov) if isinstance(ov, dict) else ov
        raise RuntimeError("no case fits this rule")
    return build


def _m_io_heads(field: str, dim_from_end: int):
    def mutate(rng, case, name, layout):
        g = case.cache.geom
        new = getattr(g, field) + int(rng.integers(1, 3))
        ov = {f"desc.io.{field}": new}
        tensors = [("key", case.key_layout), ("value", case.value_layout)] if isinstance(case, WriteCase) else \
            [("key", case.out_layout), ("value", case.out_layout)]
        for nm, lay in tensors:
            ov[f"desc.io.{nm}.shape[{len(lay.shape) - dim_from_end}]"] = new
        return ov
    return mutate


def _m_io_dtype(rng, case, name, layout):
    return {f"desc.io.{name}.dtype": int(_pick(rng, [0, 6, 7, 8, 10, 77]))}


def _m_io_memory(rng, case, name, layout):
    return {f"desc.io.{name}.memory": int(_pick(rng, [0, abi.Memory.DEVICE, abi.Memory.UNIFIED, 9]))}


def _m_io_data_null(rng, case, name, layout):
    return {f"desc.io.{name}.data": None} if case.num_tokens > 0 else None


def _m_io_ndim(rng, case, name, layout):
    bad = [1, 2, 5] if isinstance(case, GatherCase) else [1, 2, 4, 5]
    return {f"desc.io.{name}.ndim": int(_pick(rng, bad))}


def _m_io_shape(rng, case, name, layout):
    i = int(rng.integers(len(layout.shape)))
    return {f"desc.io.{name}.shape[{i}]": int(layout.shape[i]) + int(rng.integers(1, 3))}


def _m_io_overflow(rng, case, name, layout):
    if min(layout.shape) <= 0:
        return None  # an empty tensor has no farthest element
    dims = [i for i, n in enumerate(layout.shape) if n >= 3]
    return {f"desc.io.{name}.stride[{int(_pick(rng, dims))}]": 1 << 62} if dims else None


def _m_io_stride_negative(rng, case, name, layout):
    """The IO tensor walked backwards along one dimension (as ``_m_stride_negative``); a gather's
    key and value outputs share one layout, so both are."""
    dims = [i for i, (n, x) in enumerate(zip(layout.shape, layout.stride)) if n > 1 and x > 0]
    if not dims:
        return None
    new = layout.reversed(int(_pick(rng, dims)))
    if isinstance(case, WriteCase):
        return dataclasses.replace(case, **{f"{name}_layout": new})
    return dataclasses.replace(case, out_layout=new)


def _write(mutate, **gen_kw):
    def build(rng):
        for _ in range(100):
            case = random_write_case(rng, **gen_kw)
            ov = mutate(rng, case)
            if ov is not None:
                return _with(case, ov) if isinstance(ov, dict) else ov
        raise RuntimeError("no case fits this rule")
    return build


def _gather(mutate, **gen_kw):
    def build(rng):
        for _ in range(100):
            kw = {k: (v(rng) if callable(v) else v) for k, v in gen_kw.items()}
            case = random_gather_case(rng, **kw)
            ov = mutate(rng, case)
            if ov is not None:
                return _with(case, ov) if isinstance(ov, dict) else ov
        raise RuntimeError("no case fits this rule")
    return build


def _fp8_write(rng, scales):
    fp8 = _pick(rng, FP8_DTYPES)
    return random_write_case(rng, k_dtype=fp8, v_dtype=fp8, key_dtype=_pick(rng, BASELINE_DTYPES),
                             value_dtype=_pick(rng, BASELINE_DTYPES), scales=scales)


def _scale_rule(scales, mutate):
    def build(rng):
        case = _fp8_write(rng, scales)
        side = _pick(rng, ("k", "v"))
        return _with(case, mutate(rng, case, side))
    return build


def _scale_stride(rng):
    """A PER_HEAD scale whose values lie 2, 3 or 5 elements apart (placed so: the served result
    is defined), in a cache of more than one head (R-FP8.scale_stride)."""
    for _ in range(64):
        case = _fp8_write(rng, "per_head")
        if case.cache.geom.num_kv_heads > 1:
            break
    else:
        raise RuntimeError("no FP8 write case with more than one head in 64 draws")
    side = _pick(rng, ("k", "v"))
    spec = getattr(case, f"{side}_scale_desc")
    return dataclasses.replace(case, **{f"{side}_scale_desc": dataclasses.replace(spec, stride=int(_pick(rng, [2, 3, 5])))})


def _slot_oor(rng, case):
    if case.num_tokens == 0:
        return None
    g = case.cache.geom
    slots = np.array(case.slots.slots, np.int64).copy()
    hi = INT32_MAX if case.slots.dtype == DType.S32 else (1 << 40)
    choices = [g.num_slots, g.num_slots + int(rng.integers(1, 100)), hi]
    bad = [c for c in choices if c != case.slots.invalid_slot]
    slots[int(rng.integers(len(slots)))] = int(_pick(rng, bad))
    return dataclasses.replace(case, slots=dataclasses.replace(case.slots, slots=slots))


def _used_entry(rng, case):
    """(s, j) of a logical block some sequence uses."""
    n = np.minimum(np.asarray(case.seq_lens.lengths, np.int64), case.max_seq_len)
    need = -(-n // case.cache.geom.block_size)
    s = int(_pick(rng, np.nonzero(need > 0)[0]))
    return s, int(rng.integers(need[s]))


def _packed_bad_id(rng, case):
    s, j = _used_entry(rng, case)
    t = case.table
    idx = np.array(t.indices, np.int64).copy()
    nb = case.cache.geom.num_blocks
    idx[s * t.max_blocks_per_seq + j] = int(_pick(rng, [-1, nb, nb + 7, INT32_MAX]))
    return dataclasses.replace(case, table=dataclasses.replace(t, indices=idx))


def _ragged_lists(t: BlockTable) -> list[np.ndarray]:
    ip = np.asarray(t.indptr, np.int64)
    return [np.asarray(t.indices[ip[s]:ip[s + 1]], np.int64) for s in range(t.seq_count)]


def _ragged_bad_id(rng, case):
    n = np.minimum(np.asarray(case.seq_lens.lengths, np.int64), case.max_seq_len)
    s = int(_pick(rng, np.nonzero(n > 0)[0]))
    t = case.table
    idx = np.array(t.indices, np.int64).copy()
    nb = case.cache.geom.num_blocks
    idx[int(t.indptr[s]) + int(rng.integers(n[s]))] = int(_pick(rng, [-1, nb, nb + 3, INT32_MAX]))
    return dataclasses.replace(case, table=dataclasses.replace(t, indices=idx))


def _ragged_short_range(rng, case):
    n = np.minimum(np.asarray(case.seq_lens.lengths, np.int64), case.max_seq_len)
    s = int(_pick(rng, np.nonzero(n > 0)[0]))
    t = case.table
    lists = _ragged_lists(t)
    lists[s] = lists[s][: int(n[s]) - 1]
    bt = BlockTable.ragged(lists, t.max_blocks_per_seq, index_dtype=t.index_dtype, indptr_dtype=t.indptr_dtype)
    return dataclasses.replace(case, table=bt)


def _ragged_indptr(kind):
    def mutate(rng, case):
        t = case.table
        ip = np.array(t.indptr, np.int64).copy()
        idx = np.asarray(t.indices, np.int64)
        if kind == "first":
            ip[0] = int(_pick(rng, [-1, -5, INT32_MIN]))
        elif kind == "monotonic":
            k = int(rng.integers(t.seq_count))
            ip[k] = ip[k + 1] + int(rng.integers(1, 4))
        else:  # last: the buffer holds one more (or one fewer) index than indptr[seq_count] says
            if rng.random() < 0.5 or len(idx) == 0 or ip[-1] == ip[-2]:
                idx = np.concatenate([idx, [0]])
            else:
                idx = idx[:-1]
        return dataclasses.replace(case, table=dataclasses.replace(t, indptr=ip, indices=idx))
    return mutate


def _negative_length(rng, case):
    lens = np.array(case.seq_lens.lengths, np.int64).copy()
    lo = INT32_MIN if case.seq_lens.dtype == DType.S32 else -(1 << 40)
    lens[int(rng.integers(len(lens)))] = int(_pick(rng, [-1, -2, lo]))
    return dataclasses.replace(case, seq_lens=dataclasses.replace(case.seq_lens, lengths=lens))


def _max_blocks(rng):
    fmt = _pick(rng, (TableFormat.PACKED, TableFormat.RAGGED, TableFormat.KV_OFFSETS))
    bs = int(_pick(rng, (1, 2, 4) if fmt == TableFormat.KV_OFFSETS else (1, 2, 3, 4)))
    mb = int(rng.integers(0, 4))
    msl = mb * bs + int(rng.integers(1, 6))
    S = int(rng.integers(1, 4))
    lens = [int(rng.integers(0, mb * bs + 1)) for _ in range(S)]
    lens[int(rng.integers(S))] = int(rng.integers(mb * bs + 1, msl + 50))
    geom = random_geometry(rng, block_size=bs)
    case = random_gather_case(rng, fmt=fmt, geom=geom, max_seq_len=msl, lengths=lens, max_blocks_per_seq=mb,
                              seq_count=S)
    return case


def _kvo_entry(rng, case, value):
    s, j = _used_entry(rng, case)
    t = case.table
    beam, kv = int(rng.integers(t.beam_width)), int(rng.integers(2))
    idx = np.array(t.indices, np.int64).copy()
    idx[((s * t.beam_width + beam) * 2 + kv) * t.max_blocks_per_seq + j] = value
    return dataclasses.replace(case, table=dataclasses.replace(t, indices=idx))


def _kvo_secondary_null(rng, case):
    case = _kvo_entry(rng, case, SECONDARY_BIT | int(rng.integers(0, 2)))
    pool = case.cache.pool
    pool = dataclasses.replace(pool, secondary_null=True) if pool.secondary is not None and rng.random() < 0.5 else \
        dataclasses.replace(pool, secondary=None)
    return dataclasses.replace(case, cache=dataclasses.replace(case.cache, pool=pool))


def _kvo_pow2(rng):
    geom = random_geometry(rng, block_size=int(_pick(rng, (3, 5, 6, 7, 12))))
    return random_gather_case(rng, fmt=TableFormat.KV_OFFSETS, geom=geom)


def _kv_dtype_mismatch(rng):
    k, v = rng.permutation(np.array([int(x) for x in BASELINE_DTYPES]))[:2]
    return random_gather_case(rng, fmt=TableFormat.KV_OFFSETS, k_dtype=DType(int(k)), v_dtype=DType(int(v)))


def _fp8_io_case(rng):
    if rng.random() < 0.5:
        k = _pick(rng, BASELINE_DTYPES)
        return random_write_case(rng, k_dtype=k, key_dtype=_pick(rng, FP8_DTYPES), value_dtype=None,
                                 v_dtype=_pick(rng, BASELINE_DTYPES))
    return random_gather_case(rng, k_dtype=_pick(rng, BASELINE_DTYPES), v_dtype=None, out_dtype=_pick(rng, FP8_DTYPES))


def _fp8_cache_gather(rng):
    fp8 = _pick(rng, FP8_DTYPES)
    return random_gather_case(rng, k_dtype=fp8, v_dtype=fp8, out_dtype=_pick(rng, BASELINE_DTYPES))


_ANY = ("validate", "write", "gather")
_CALL = ("write", "gather")
_PACKED = {"fmt": TableFormat.PACKED}
_RAGGED = {"fmt": TableFormat.RAGGED}
_KVO = {"fmt": TableFormat.KV_OFFSETS}
_INV, _UNS, _OOR = Status.INVALID_ARGUMENT, Status.UNSUPPORTED, Status.OUT_OF_RANGE

#: rule id -> (clause, expected status, builder). The statuses restate docs/spec-readings.md
#: independently of the oracle's catalog (tests hold the two against each other).
RULES: dict[str, RuleCase] = {
    # step 1
    "R-SIZE.null_cache": RuleCase("spec 7; R-ORDER", _INV, lambda rng: _with(_any_call(rng), {"cache": None})),
    "R-SIZE.null_desc": RuleCase("spec 7; R-ORDER", _INV, lambda rng: _with(_any_call(rng, calls=_CALL), {"desc": None})),
    **{
        f"R-SIZE.{p}": RuleCase("spec 3, 6; R-SIZE", _INV, _size(p, calls))
        for p, calls in (
            ("cache", _ANY), ("cache.k", _ANY), ("cache.v", _ANY), ("cache.pool", ("gather",)), ("desc", _CALL),
            ("desc.io", _CALL), ("desc.io.key", _CALL), ("desc.io.value", _CALL), ("desc.slots", ("write",)),
            ("desc.k_scale_desc", ("write",)), ("desc.v_scale_desc", ("write",)), ("desc.block_table", ("gather",)),
            ("desc.seq_lens", ("gather",)),
        )
    },
    # step 2
    "7.1.num_blocks_zero": RuleCase("spec 7.1", _INV, _zero_geometry("num_blocks", "b")),
    "7.1.block_size_zero": RuleCase("spec 7.1", _INV, _zero_geometry("block_size", "t")),
    "7.1.num_kv_heads_zero": RuleCase("spec 7.1", _INV, _zero_geometry("num_kv_heads", "h")),
    "7.1.head_dim_zero": RuleCase("spec 7.1", _INV, _zero_geometry("head_dim", "d")),
    "R-CACHE.dtype": RuleCase("spec 4.3; R-CACHE", _INV,
                              _tensor_rule(_m_dtype, gather_formats=(TableFormat.PACKED, TableFormat.RAGGED),
                                           write_kw={"scales": "none"})),
    "R-CACHE.layout": RuleCase("spec 4.2; R-CACHE", _INV, _tensor_rule(_m_layout)),
    "R-CACHE.ndim": RuleCase("spec 4.2; R-CACHE", _INV, _tensor_rule(_m_ndim)),
    "R-CACHE.pack_zero": RuleCase("spec 4.2; R-CACHE", _INV, _tensor_rule(
        _m_pack_zero, write_kw={"k_kind": "hnd_packed", "v_kind": "hnd_packed"},
        gather_kw={"k_kind": "hnd_packed", "v_kind": "hnd_packed"})),
    "7.1.hnd_packed_pack_divides": RuleCase("spec 7.1", _INV, _tensor_rule(
        _m_pack_divides, write_kw={"k_kind": "hnd_packed", "v_kind": "hnd_packed"},
        gather_kw={"k_kind": "hnd_packed", "v_kind": "hnd_packed"})),
    "R-CACHE.shape": RuleCase("spec 4.2; R-CACHE", _INV, _tensor_rule(_m_shape)),
    "R-CACHE.data_null": RuleCase("spec 6.2; R-CACHE", _INV, _tensor_rule(_m_data_null)),
    "R-CACHE.memory_invalid": RuleCase("spec 6.2; R-CACHE", _INV, _tensor_rule(_m_memory_invalid)),
    "R-CACHE.memory_mismatch": RuleCase("spec 6.2; R-CACHE", _INV, _tensor_rule(_m_memory_mismatch)),
    "R-CACHE.stride_zero": RuleCase("spec 4.2; R-CACHE", _INV, _tensor_rule(_m_stride_zero)),
    "R-CACHE.offset_overflow": RuleCase("spec 4.2; R-CACHE", _INV, _tensor_rule(_m_overflow)),
    "R-CACHE.stride_negative": RuleCase("spec 4.2; R-STRIDE-NEG", _UNS, _tensor_rule(_m_stride_negative)),
    # step 3: io
    "R-IO.num_kv_heads": RuleCase("spec 6.8, 7; R-IO", _INV, _io_rule(
        _m_io_heads("num_kv_heads", 2), write_kw={"scales": "none"}, gather_kw={"fmt": TableFormat.PACKED})),
    "R-IO.head_dim": RuleCase("spec 6.8, 7; R-IO", _INV, _io_rule(_m_io_heads("head_dim", 1))),
    "R-IO.dtype": RuleCase("spec 6.8; R-IO", _INV, _io_rule(_m_io_dtype)),
    "R-IO.memory": RuleCase("spec 6.8; R-IO", _INV, _io_rule(_m_io_memory)),
    "R-IO.data_null": RuleCase("spec 6.8; R-IO", _INV, _io_rule(_m_io_data_null)),
    "R-IO.ndim": RuleCase("spec 6.8; R-IO", _INV, _io_rule(_m_io_ndim)),
    "R-IO.shape": RuleCase("spec 6.8; R-IO", _INV, _io_rule(_m_io_shape)),
    "R-IO.offset_overflow": RuleCase("spec 6.8; R-IO", _INV, _io_rule(_m_io_overflow)),
    "R-IO.stride_negative": RuleCase("spec 6.8; R-IO", _UNS, _io_rule(_m_io_stride_negative)),
    "R-CONVERT.fp8_io": RuleCase("spec 4.3; R-CONVERT", _UNS, _fp8_io_case),
    "R-CONVERT.fp8_cache_gather": RuleCase("spec 4.3; R-CONVERT", _UNS, _fp8_cache_gather),
    # step 3: write
    "R-WRITE.token_count": RuleCase("spec 5.2, 7; R-WRITE", _INV, _write(
        lambda rng, c: {"desc.slots.token_count": c.num_tokens + 1 if c.num_tokens == 0 or rng.random() < 0.5
                        else c.num_tokens - 1})),
    "R-WRITE.slot_dtype": RuleCase("spec 5.2; R-WRITE", _INV, _write(
        lambda rng, c: {"desc.slots.dtype": int(_pick(rng, [0, 1, 3, 8, 9, 10, 42]))})),
    "R-WRITE.slots_null": RuleCase("spec 6.4; R-WRITE", _INV, _write(
        lambda rng, c: {"desc.slots.slots": None} if c.num_tokens else None)),
    "R-FP8.scale_dtype": RuleCase("spec 6.9; R-FP8", _INV, _scale_rule(
        "per_tensor", lambda rng, c, s: {f"desc.{s}_scale_desc.dtype": int(_pick(rng, [0, 1, 2, 6, 7]))})),
    "R-FP8.scale_granularity": RuleCase("spec 6.6; R-FP8", _INV, _scale_rule(
        "per_tensor", lambda rng, c, s: {f"desc.{s}_scale_desc.granularity": int(_pick(rng, [0, 5, 99]))})),
    "R-FP8.per_head_shape": RuleCase("spec 6.6; R-FP8", _INV, _scale_rule(
        "per_head", lambda rng, c, s: _pick(rng, [
            {f"desc.{s}_scale_desc.shape[0]": c.cache.geom.num_kv_heads + 1},
            {f"desc.{s}_scale_desc.ndim": 2, f"desc.{s}_scale_desc.shape[1]": 1},
            {f"desc.{s}_scale_desc.ndim": 0}]))),
    "R-FP8.per_block_unsupported": RuleCase("spec 6.6; R-FP8", _UNS, _scale_rule(
        "per_tensor",
        lambda rng, c, s: {f"desc.{s}_scale_desc.granularity": int(_pick(rng, [2, 4]))})),
    "R-FP8.scale_stride": RuleCase("spec 6.6, 4.2; R-FP8", _UNS, _scale_stride),
    # step 3: gather
    "R-GATHER.format": RuleCase("spec 5.1; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.block_table.format": int(_pick(rng, [0, 4, 99]))})),
    "R-GATHER.num_tokens": RuleCase("spec 6.10; R-GATHER", _INV, _gather(
        lambda rng, c: _num_tokens_off(rng, c))),
    "R-GATHER.seq_count_match": RuleCase("spec 5.3, 7", _INV, _gather(
        lambda rng, c: {"desc.seq_lens.seq_count": c.table.seq_count + int(rng.integers(1, 3))},
        seq_count=lambda rng: int(rng.integers(1, 4)))),
    "R-GATHER.seq_lens_dtype": RuleCase("spec 5.3; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.seq_lens.dtype": int(_pick(rng, [0, 1, 3, 8, 9, 10]))})),
    "R-GATHER.lengths_null": RuleCase("spec 6.5; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.seq_lens.lengths": None}, seq_count=lambda rng: int(rng.integers(1, 4)))),
    "R-GATHER.indices_null": RuleCase("spec 6.3; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.block_table.indices": None} if c.table.n_indices else None)),
    "7.1.index_dtype": RuleCase("spec 7.1", _INV, _gather(
        lambda rng, c: {"desc.block_table.index_dtype": int(_pick(rng, [0, 1, 3, 8, 9, 10]))},
        fmt=lambda rng: _pick(rng, (TableFormat.PACKED, TableFormat.RAGGED)))),
    "7.1.packed_indices_count": RuleCase("spec 5.1, 7.1", _INV, _gather(
        lambda rng, c: {"desc.block_table.indices_count": c.table.n_indices + int(_pick(rng, [1, 2, -1]))}
        if c.table.n_indices else None, **_PACKED)),
    "R-GATHER.packed_indptr_count": RuleCase("spec 5.1, 7.1", _INV, _gather(
        lambda rng, c: {"desc.block_table.indptr_count": c.table.seq_count + 1}, **_PACKED)),
    "R-GATHER.packed_beam_width": RuleCase("spec 5.1; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.block_table.beam_width": int(_pick(rng, [0, 2, 4]))}, **_PACKED)),
    "R-GATHER.ragged_indptr_dtype": RuleCase("spec 6.3; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.block_table.indptr_dtype": int(_pick(rng, [0, 1, 3, 8, 9]))}, **_RAGGED)),
    "R-GATHER.ragged_indptr_null": RuleCase("spec 5.1; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.block_table.indptr": None}, **_RAGGED)),
    "R-GATHER.ragged_indptr_count": RuleCase("spec 5.1, 7.1", _INV, _gather(
        lambda rng, c: {"desc.block_table.indptr_count": int(_pick(rng, [0, c.table.seq_count, c.table.seq_count + 2]))},
        **_RAGGED)),
    "R-GATHER.ragged_beam_width": RuleCase("spec 5.1; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.block_table.beam_width": int(_pick(rng, [0, 2, 3]))}, **_RAGGED)),
    "7.1.kv_offsets_index_dtype": RuleCase("spec 5.1, 7.1", _INV, _gather(
        lambda rng, c: {"desc.block_table.index_dtype": int(_pick(rng, [0, 7, 8, 9]))}, **_KVO)),
    "R-GATHER.kv_offsets_flag": RuleCase("spec 5.1; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.block_table.flags": int(_pick(rng, [0, 2, 6]))}, **_KVO)),
    "7.1.kv_offsets_pow2": RuleCase("spec 5.1, 7.1", _INV, _kvo_pow2),
    "R-GATHER.kv_offsets_beam_width": RuleCase("spec 5.1; R-GATHER", _INV, _gather(
        lambda rng, c: {"desc.block_table.beam_width": 0}, seq_count=0, **_KVO)),
    "7.1.kv_offsets_indices_count": RuleCase("spec 5.1, 7.1", _INV, _gather(
        lambda rng, c: {"desc.block_table.indices_count": c.table.n_indices + int(_pick(rng, [1, 2, -1]))}
        if c.table.n_indices else None, **_KVO)),
    "R-GATHER.kv_offsets_indptr_count": RuleCase("spec 5.1, 7.1", _INV, _gather(
        lambda rng, c: {"desc.block_table.indptr_count": int(_pick(rng, [1, c.table.seq_count + 1]))}, **_KVO)),
    "R-GATHER.pool_primary_null": RuleCase("spec 6.7; R-GATHER", _INV, _gather(
        lambda rng, c: {"cache.pool.primary": None}, **_KVO)),
    "R-GATHER.pool_bytes_per_block": RuleCase("spec 6.7; R-GATHER", _INV, _gather(
        lambda rng, c: {"cache.pool.bytes_per_block": int(_pick(rng, [0, c.cache.pool.bytes_per_block + 1,
                                                                      2 * c.cache.pool.bytes_per_block]))}, **_KVO)),
    "R-GATHER.kv_offsets_kv_dtype": RuleCase("spec 5.1; R-GATHER", _UNS, _kv_dtype_mismatch),
    # step 5
    "R-WRITE.slot_out_of_range": RuleCase("spec 5.2, 8; R-WRITE", _OOR, _write(_slot_oor)),
    "R-DATA.ragged_indptr_first": RuleCase("spec 5.1; R-DATA", _INV, _gather(
        _ragged_indptr("first"), seq_count=lambda rng: int(rng.integers(1, 4)), **_RAGGED)),
    "R-DATA.ragged_indptr_monotonic": RuleCase("spec 5.1; R-DATA", _INV, _gather(
        _ragged_indptr("monotonic"), seq_count=lambda rng: int(rng.integers(1, 4)), **_RAGGED)),
    "R-DATA.ragged_indptr_last": RuleCase("spec 5.1, 7.1; R-DATA", _INV, _gather(
        _ragged_indptr("last"), seq_count=lambda rng: int(rng.integers(1, 4)), **_RAGGED)),
    "R-DATA.negative_length": RuleCase("spec 5.3; R-DATA", _INV, _gather(
        _negative_length, seq_count=lambda rng: int(rng.integers(1, 4)))),
    "R-DATA.max_blocks": RuleCase("spec 5.1, 6.10; R-DATA", _OOR, _max_blocks),
    "R-DATA.packed_block_id": RuleCase("spec 5.1, 8; R-DATA", _OOR, _gather(_packed_bad_id, min_tokens=1, **_PACKED)),
    "R-DATA.ragged_seq_range": RuleCase("spec 5.1; R-DATA", _OOR, _gather(_ragged_short_range, min_tokens=1, **_RAGGED)),
    "R-DATA.ragged_block_id": RuleCase("spec 5.1, 8; R-DATA", _OOR, _gather(_ragged_bad_id, min_tokens=1, **_RAGGED)),
    "R-DATA.kv_offsets_null_index": RuleCase("spec 5.1; R-DATA", _OOR, _gather(
        lambda rng, c: _kvo_entry(rng, c, NULL_INDEX), min_tokens=1, **_KVO)),
    "R-DATA.kv_offsets_secondary_null": RuleCase("spec 5.1, 10; R-DATA", _OOR, _gather(
        _kvo_secondary_null, min_tokens=1, **_KVO)),
}


def _num_tokens_off(rng, case: GatherCase) -> dict:
    new = case.num_tokens + int(rng.integers(1, 4))
    ov = {"desc.io.num_tokens": new}
    if len(case.out_layout.shape) == 3:
        ov["desc.io.key.shape[0]"] = new
        ov["desc.io.value.shape[0]"] = new
    return ov


def random_invalid_case(
    rng: np.random.Generator, rule: str, *, seed: int | None = None, profile: Profile = CORE
) -> Violation:
    """A case breaking exactly ``rule`` (a key of ``RULES``), with its expected status.

    The case is built from ``profile`` (default: the core features) plus whatever the
    rule itself needs (an FP8 cache for the scale rules, a KV_OFFSETS table, ...).
    """
    rc = RULES[rule]
    with using_profile(profile):
        case = rc.builder(rng)
    case = dataclasses.replace(case, seed=seed, label=f"violates {rule}")
    return Violation(case, rule, rc.status, rc.clause)
