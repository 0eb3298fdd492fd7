"""All-pairs designs of engine-sized calls over what a provider serves (``pairwise.*`` tests).

A provider's path may be broken for one combination of two parameters of a call only past some
size: HND caches of BF16 converted from F32 rows, RAGGED tables with S64 lengths, FP8 pools
through KV_OFFSETS tables, misaligned HND caches. The explicit tests fix all but the parameter
they are about, and random draws meet a given pair rarely. An all-pairs design (a covering array
of strength 2, built by ``allpairspy``) holds every value pair of every two axes in some row: a
few dozen calls instead of the product of the axes. Each row is built by the seeded generators
(``generators.random_write_case`` / ``random_gather_case``) with its knobs, at a size past the
tiles engines use (writes of 260 tokens and more, gathers of 260 sequences).

Axes come from the provider's served or claimed features (``generators.profile_for``), so every
row is a call it serves; a value pair the oracle does not answer OK for (K and V pools of two dtypes
in a KV_OFFSETS gather) is left out of the design.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from allpairspy import AllPairs

from .. import reference_impl
from ..abi.descriptors import Geometry
from ..abi.header import BASELINE_DTYPES, FP8_DTYPES, INDEX_DTYPES, Status, TableFormat
from . import generators as gen

#: the caches of the rows (an axis of the design): head dims no power of two (80, 72) and one that no
#: 16-byte vector of 2- or 4-byte values divides (12), blocks of a power of two tokens (as KV_OFFSETS
#: needs), at least 1280 slots
GEOMS = {
    "h4_d80_bs16": Geometry(num_blocks=96, block_size=16, num_kv_heads=4, head_dim=80),
    "h3_d72_bs8": Geometry(num_blocks=160, block_size=8, num_kv_heads=3, head_dim=72),
    "h8_d12_bs32": Geometry(num_blocks=48, block_size=32, num_kv_heads=8, head_dim=12),
}
#: row i of a write design writes WRITE_TOKENS + 13 i tokens; a gather reads GATHER_SEQS sequences
WRITE_TOKENS, GATHER_SEQS, MAX_SEQ_LEN = 260, 260, 24
#: an IO / output dtype equal to the cache's (for FP8: raw bytes)
SAME = "same"
#: misalignments drawn where the provider serves ``misaligned`` (bytes past a 256-byte boundary)
MISALIGNS = (2, 8)


@dataclass(frozen=True)
class Row:
    """One row of a design: its knobs (axis name -> value), its index and seed."""

    op: str
    index: int
    seed: int
    knobs: tuple[tuple[str, object], ...]

    def get(self, name: str, default=None):
        return dict(self.knobs).get(name, default)

    def describe(self) -> str:
        kv = ", ".join(f"{k}={getattr(v, 'name', v)}" for k, v in self.knobs)
        return f"pairwise {self.op} row {self.index} (seed {self.seed}): {kv}"


def write_axes(prof: gen.Profile, features) -> dict[str, tuple]:
    """The axes of a write design under ``prof`` (``generators.profile_for(features)``)."""
    io = (SAME,) + (BASELINE_DTYPES if prof.mixed_io or any(d in FP8_DTYPES for d in prof.cache_dtypes) else ())
    axes = {
        "geom": tuple(GEOMS), "k_kind": prof.layout_kinds, "v_kind": prof.layout_kinds if prof.mixed_kv else None,
        "k_dtype": prof.cache_dtypes, "v_dtype": prof.cache_dtypes if prof.mixed_kv else None,
        "key_dtype": io, "value_dtype": io, "io_kind": prof.io_kinds, "scales": prof.scales,
        "slot_dtype": INDEX_DTYPES, "value_mode": gen.VALUE_MODES,
        "misalign": (0,) + MISALIGNS if "misaligned" in set(features) else None,
    }
    return {k: tuple(v) for k, v in axes.items() if v is not None and len(v) > 1}


def gather_axes(prof: gen.Profile, features) -> dict[str, tuple]:
    """The axes of a gather design under ``prof``."""
    out = (SAME,) + (BASELINE_DTYPES if prof.mixed_io else ())
    axes = {
        "geom": tuple(GEOMS), "fmt": prof.formats, "k_kind": prof.layout_kinds, "v_kind": prof.layout_kinds if prof.mixed_kv else None,
        "k_dtype": prof.cache_dtypes, "v_dtype": prof.cache_dtypes if prof.mixed_kv else None,
        # the output's strides and rank in one axis: a 4-D output of non-dense strides is the pair of two
        # optional features that providers refuse together (the reference does), so it is left out
        "out_shape": tuple(f"3d-{k}" for k in prof.io_kinds) + (("4d-dense",) if prof.four_d else ()),
        "out_dtype": out,
        "index_dtype": INDEX_DTYPES, "lens_dtype": INDEX_DTYPES,
        "misalign": (0,) + MISALIGNS if "misaligned" in set(features) else None,
    }
    return {k: tuple(v) for k, v in axes.items() if v is not None and len(v) > 1}


def _resolve(op: str, knobs: dict, prof: gen.Profile) -> dict:
    """Generator keyword arguments of a row's knobs: SAME resolved, V's layout and dtype K's where the
    design has no axis for them, the IO dtype the cache's where mixed IO is not served (a baseline
    IO dtype into an FP8 cache quantizes: the FP8 feature itself)."""
    kw = {k: v for k, v in knobs.items() if k not in ("misalign", "geom")}
    kw.setdefault("k_kind", prof.layout_kinds[0])
    kw.setdefault("v_kind", kw["k_kind"])
    kw.setdefault("k_dtype", prof.cache_dtypes[0])
    kw.setdefault("v_dtype", kw["k_dtype"])
    if op == "write":
        for io, cache in (("key_dtype", "k_dtype"), ("value_dtype", "v_dtype")):
            v = kw.get(io, SAME)
            if v == SAME or (not prof.mixed_io and kw[cache] not in FP8_DTYPES):
                v = kw[cache]
            kw[io] = v
        kw.setdefault("io_kind", prof.io_kinds[0])
    else:
        o = kw.get("out_dtype", SAME)
        kw["out_dtype"] = kw["k_dtype"] if o == SAME else o
        rank, kind = kw.pop("out_shape", "3d-" + prof.io_kinds[0]).split("-")
        kw.update(io_kind=kind, four_d=rank == "4d")
        kw.setdefault("fmt", TableFormat.PACKED)
    return kw


def build(row: Row, prof: gen.Profile, size: bool = True):
    """The case of ``row``: at engine size, or (``size`` False) at a few tokens, to ask the oracle
    whether the row's structure is a valid call."""
    kw = _resolve(row.op, dict(row.knobs), prof)
    geom = GEOMS[row.get("geom", "h4_d80_bs16")]
    rng = np.random.default_rng(row.seed)
    with gen.using_profile(prof):
        if row.op == "write":
            return gen.random_write_case(rng, seed=row.seed, geom=geom,
                                         num_tokens=WRITE_TOKENS + 13 * row.index if size else 3, **kw)
        return gen.random_gather_case(rng, seed=row.seed, geom=geom, seq_count=GATHER_SEQS if size else 2,
                                      max_seq_len=MAX_SEQ_LEN, min_tokens=MAX_SEQ_LEN, **kw)


def _allowed(op: str, knobs: dict) -> bool:
    """Whether a (partial) row can be a valid call (R-GATHER): a gather from an FP8 cache has K and V of
    one dtype and outputs of it (raw bytes), and a KV_OFFSETS gather K and V pools of one dtype."""
    if op != "gather":
        return True
    k, v = knobs.get("k_dtype"), knobs.get("v_dtype")
    if k is not None and v is not None and k != v and (
            k in FP8_DTYPES or v in FP8_DTYPES or knobs.get("fmt") == TableFormat.KV_OFFSETS):
        return False
    fp8 = k in FP8_DTYPES or v in FP8_DTYPES
    return not (fp8 and knobs.get("out_dtype", SAME) != SAME)


def design(op: str, prof: gen.Profile, features, base_seed: int = 7000) -> list[Row]:
    """The rows of an all-pairs design of ``op`` ("write" or "gather") over what ``prof`` and
    ``features`` allow; rows the oracle does not answer OK for are left out."""
    axes = write_axes(prof, features) if op == "write" else gather_axes(prof, features)
    names = list(axes)

    def valid(partial: list) -> bool:
        if not _allowed(op, dict(zip(names, partial))):
            return False
        if len(partial) < len(names):
            return True
        row = Row(op, 0, base_seed, tuple(zip(names, partial)))
        return int(reference_impl.expected(build(row, prof, size=False)).status) == int(Status.OK)

    rows = []
    for i, values in enumerate(AllPairs([list(axes[n]) for n in names], filter_func=valid)):
        rows.append(Row(op, i, base_seed + 101 * i, tuple(zip(names, values))))
    return rows


def misalign_of(row: Row) -> int:
    return int(row.get("misalign", 0))
