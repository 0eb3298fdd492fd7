"""Benchmark cases and presets: what is timed, and the bytes each call must move.

A :class:`BenchCase` names one KVX call shape (operation, cache layout, dtypes, token
count, heads, head_dim, block size, table format or slot pattern, memory type). The
presets ``quick`` / ``standard`` / ``full`` are lists of cases built by sweeps over
one axis at a time around a baseline (8 KV heads, head_dim 128, block_size 16, F16),
so every plot varies one thing.

Bytes moved (docs/benchmarks.md): the fewest bytes a call must move through memory,
each input read once and each output written once, K and V both:

- write:  ``2 * T * H * D * (io_size + cache_size) + T * slot_size`` (+ 8 bytes of
  FP8 scales); ``T`` tokens, every slot valid and distinct;
- gather: ``2 * R * H * D * (cache_size + io_size) + index bytes``; ``R`` gathered
  rows (every sequence full, so ``R = seqs * seq_len``), index bytes: PACKED
  ``seqs * ceil(seq_len / block_size) * 4``, RAGGED ``R * 4 + (seqs + 1) * 4``,
  KV_OFFSETS ``seqs * 2 * ceil(seq_len / block_size) * 4``; plus ``seqs * 4`` of
  sequence lengths.

This is the convention of the device-to-device copy roofline (bytes read plus bytes
written), so ``bandwidth / roofline`` is a fraction of what the memory can do.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..abi.header import DTYPE_SIZE, DType, Layout

DTYPES: dict[str, DType] = {
    "f16": DType.F16, "bf16": DType.BF16, "f32": DType.F32,
    "fp8_e4m3": DType.F8_E4M3, "fp8_e5m2": DType.F8_E5M2,
}
#: Cache dtypes contributed by other modules (FP4 packed formats). A hook registers
#: ``name -> (element bits, build function)``; cases naming a dtype absent here and
#: absent from :data:`DTYPES` are reported as unsupported by the harness, not run.
EXTRA_DTYPES: dict[str, dict] = {}
#: KVX 1.2 FP4 caches the harness builds itself (write only): packed E2M1 codes plus one scale
#: byte per ``block`` values (NVFP4: E4M3 block scales and a per-tensor FP32 global scale;
#: MXFP4: UE8M0 block scales).
FP4_DTYPES: dict[str, dict] = {"nvfp4": {"bits": 4, "block": 16}, "mxfp4": {"bits": 4, "block": 16}}

LAYOUTS: dict[str, Layout] = {"nhd": Layout.BLOCK_NHD, "hnd": Layout.BLOCK_HND, "hnd_packed": Layout.BLOCK_HND_PACKED}
TABLES = ("packed", "ragged", "kv_offsets")
SLOT_PATTERNS = ("random", "prefill")
OPS = ("write", "gather")
MEMORIES = ("host", "device", "unified")
#: DRAM moves 32-byte sectors: a cache-side piece smaller than this costs a whole sector.
SECTOR = 32


def dtype_size(name: str) -> float:
    if name in DTYPES:
        return DTYPE_SIZE[DTYPES[name]]
    if name in FP4_DTYPES:  # codes plus the block scales, per element
        return FP4_DTYPES[name]["bits"] / 8.0 + 1.0 / FP4_DTYPES[name]["block"]
    if name in EXTRA_DTYPES:
        return EXTRA_DTYPES[name]["bits"] / 8.0
    raise KeyError(f"unknown benchmark dtype {name!r}")


@dataclass(frozen=True)
class BenchCase:
    op: str  # write | gather
    layout: str = "nhd"
    dtype: str = "f16"  # cache dtype
    io_dtype: str = ""  # write source / gather destination; "" = same as dtype
    tokens: int = 4096  # write: tokens written; gather: rows gathered (seqs * seq_len)
    heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    table: str = "random"  # write: slot pattern (random | prefill); gather: table format
    seq_len: int = 2048  # gather: tokens per sequence (capped at tokens)
    memory: str = "device"
    #: the sweep this case belongs to (a plot / table group)
    sweep: str = "tokens"
    #: cache blocks (0: sized by the harness, docs/benchmarks.md "Working sets")
    cache_blocks: int = 0
    #: decode timing: one input set, this many calls captured in one CUDA graph and replayed
    #: warm (0: the rotating input sets of the other presets)
    replay: int = 0
    #: FP8 quantizing writes: the per-tensor scale of K and V
    scale: float = 1.0

    @property
    def io(self) -> str:
        return self.io_dtype or self.dtype

    @property
    def seqs(self) -> int:
        return max(1, self.tokens // self.sl)

    @property
    def sl(self) -> int:
        return max(1, min(self.seq_len, self.tokens))

    @property
    def rows(self) -> int:
        """Rows moved: tokens written, or rows gathered (a whole number of full sequences)."""
        return self.tokens if self.op == "write" else self.seqs * self.sl

    @property
    def pack(self) -> int:
        """HND_PACKED innermost pack: 16 bytes of the cache dtype (vLLM's x)."""
        return max(1, min(self.head_dim, int(16 // dtype_size(self.dtype))))

    def features(self) -> tuple[str, ...]:
        """The optional features (outcomes.OPTIONAL_FEATURES) this case exercises: a provider
        that does not claim one of them may refuse the case (docs/benchmarks.md)."""
        out = []
        if self.layout in ("hnd_packed", "nhd", "hnd"):
            out.append(self.layout)  # core needs one of NHD / HND
        if self.op == "gather" and self.table in ("ragged", "kv_offsets"):
            out.append(self.table)
        if self.dtype.startswith("fp8") or self.io.startswith("fp8"):
            out.append("fp8")
        if self.io != self.dtype:
            out.append("mixed_io_dtype")
        if self.memory in ("device", "unified", "host"):
            out.append(f"{self.memory}_memory")
        return tuple(out)

    @property
    def id(self) -> str:
        io = "" if self.io == self.dtype else f"-io{self.io}"
        extra = f"-sl{self.sl}" if self.op == "gather" else ""
        if self.scale != 1.0:
            extra += f"-s{self.scale:g}"
        if self.cache_blocks:
            extra += f"-nb{self.cache_blocks}"
        if self.replay:
            extra += f"-warm{self.replay}"
        return (f"{self.op}-{self.layout}-{self.dtype}{io}-t{self.tokens}-h{self.heads}-d{self.head_dim}"
                f"-bs{self.block_size}-{self.table}{extra}-{self.memory}")

    @property
    def fp4(self) -> bool:
        return self.dtype in FP4_DTYPES

    @property
    def scaled(self) -> bool:
        """A quantizing write with per-tensor scales (FP8 from a wider IO dtype; NVFP4's global scale)."""
        return self.op == "write" and self.io != self.dtype and (self.dtype.startswith("fp8") or self.dtype == "nvfp4")

    def num_blocks(self) -> int:
        """Cache blocks: room for every row (write) or every gathered block, at least 2."""
        if self.cache_blocks:
            return self.cache_blocks
        per_seq = math.ceil(self.sl / self.block_size)
        need = math.ceil(self.tokens / self.block_size) if self.op == "write" else self.seqs * per_seq
        return max(2, need)

    def bytes_moved(self) -> int:
        """The fewest bytes the call moves (module docstring)."""
        elems = self.rows * self.heads * self.head_dim
        payload = 2 * elems * (dtype_size(self.io) + dtype_size(self.dtype))
        if self.op == "write":
            idx = self.tokens * 8  # S64 slots
            if self.scaled:
                idx += 8
        else:
            blocks = math.ceil(self.sl / self.block_size)
            if self.table == "packed":
                idx = self.seqs * blocks * 4
            elif self.table == "ragged":
                idx = self.rows * 4 + (self.seqs + 1) * 4
            else:
                idx = self.seqs * 2 * blocks * 4
            idx += self.seqs * 4
        return int(payload + idx)

    def bytes_sector(self) -> int | None:
        """Bytes when every cache-side piece costs a 32-byte DRAM sector read and written back.

        Only for a random-slot write into HND_PACKED, whose pieces are ``pack * dtype_size``
        (16) bytes, below the sector: the IO read plus, per piece, one sector read and one
        written (the bound the targets hold such writes to, docs/benchmarks.md; docs/cuda-reference.md counts the same).
        """
        if self.op != "write" or self.layout != "hnd_packed" or self.table != "random":
            return None
        piece = self.pack * dtype_size(self.dtype)
        if piece >= SECTOR:
            return None
        elems = self.rows * self.heads * self.head_dim
        cache_side = 2 * (elems / self.pack) * 2 * SECTOR
        return int(2 * elems * dtype_size(self.io) + cache_side + self.tokens * 8)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(id=self.id, io_dtype=self.io, rows=self.rows, seqs=self.seqs if self.op == "gather" else None,
                 seq_len=self.sl if self.op == "gather" else None, bytes_moved=self.bytes_moved(),
                 bytes_sector=self.bytes_sector(), pack=self.pack if self.layout == "hnd_packed" else None)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "BenchCase":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names and v is not None})


# ----------------------------------------------------------------------------- presets


def _dedupe(cases: list[BenchCase]) -> list[BenchCase]:
    seen, out = set(), []
    for c in cases:
        if c.id not in seen:
            seen.add(c.id)
            out.append(c)
    return out


def _token_sweep(tokens, layouts, dtypes, memory, ops=OPS) -> list[BenchCase]:
    out = []
    for op in ops:
        for lay in layouts:
            for dt in dtypes:
                if op == "gather" and dt.startswith("fp8"):
                    io = dt  # FP8 caches gather raw (no dequantizing conversion in v1)
                else:
                    io = "f16" if dt.startswith("fp8") else dt
                for t in tokens:
                    table = "packed" if op == "gather" else ("prefill" if lay == "hnd_packed" else "random")
                    out.append(BenchCase(op, lay, dt, io, t, table=table, memory=memory, sweep="tokens"))
                    if op == "write" and lay == "hnd_packed":
                        out.append(BenchCase(op, lay, dt, io, t, table="random", memory=memory, sweep="tokens"))
    return out


def _shape_sweep(tokens, heads, head_dims, memory, dtype="f16", layout="nhd") -> list[BenchCase]:
    return [BenchCase(op, layout, dtype, dtype, tokens, h, d, table="packed" if op == "gather" else "random",
                      memory=memory, sweep="shape")
            for op in OPS for h in heads for d in head_dims]


def _block_sweep(tokens, block_sizes, memory, layouts=("nhd", "hnd")) -> list[BenchCase]:
    return [BenchCase(op, lay, "f16", "f16", tokens, block_size=bs, table="packed" if op == "gather" else "random",
                      memory=memory, sweep="block_size")
            for op in OPS for lay in layouts for bs in block_sizes]


def _table_sweep(tokens, memory, seq_len=2048) -> list[BenchCase]:
    return [BenchCase("gather", "hnd", "f16", "f16", t, table=tb, seq_len=seq_len, memory=memory, sweep="tables")
            for t in tokens for tb in TABLES]


#: The decode case set: what a serving engine's decode step writes, the shape engines' own KV
#: write kernels are compared on (8 KV heads, head_dim 128, blocks of 16 tokens, random
#: distinct slots in a cache of 8192 blocks, K and V), each call replayed DECODE_REPLAY times
#: in one CUDA graph, warm, beside an empty kernel replayed the same way (the floor).
DECODE_TOKENS = (1, 4, 16, 64, 256)
DECODE_BLOCKS = 8192
DECODE_REPLAY = 50
DECODE_SEQS = 4  # gathers: the rows come from up to this many sequences
#: FP8 quantizing writes of the decode set: BF16 IO, one per-tensor scale (not 1: the division runs)
DECODE_FP8_SCALE = 0.0173


def _fp8_io_sweep(tokens, memory: str) -> list[BenchCase]:
    """FP8 quantizing writes from BF16 and F32 rows with one per-tensor scale that is not 1 (the
    division runs): the engines' usual FP8 cache behind a BF16 model, every layout."""
    out = []
    for lay in LAYOUTS:
        for dt in ("fp8_e4m3", "fp8_e5m2"):
            for io in ("bf16", "f32"):
                for t in tokens:
                    for table in (("prefill", "random") if lay == "hnd_packed" else ("random",)):
                        out.append(BenchCase("write", lay, dt, io, t, table=table, memory=memory, sweep="tokens",
                                             scale=DECODE_FP8_SCALE))
    return out


def _decode_sweep(memory: str) -> list[BenchCase]:
    common = dict(heads=8, head_dim=128, block_size=16, memory=memory, cache_blocks=DECODE_BLOCKS,
                  replay=DECODE_REPLAY)
    out = []
    for lay in LAYOUTS:
        for dt, io, sc in (("f16", "f16", 1.0), ("bf16", "bf16", 1.0), ("f32", "f32", 1.0),
                           ("fp8_e4m3", "bf16", DECODE_FP8_SCALE), ("fp8_e5m2", "bf16", DECODE_FP8_SCALE),
                           ("nvfp4", "bf16", 1.0), ("mxfp4", "bf16", 1.0)):
            if dt in FP4_DTYPES and lay == "hnd_packed":
                continue  # FP4 caches are NHD or HND (docs/fp4.md)
            for t in DECODE_TOKENS:
                out.append(BenchCase("write", lay, dt, io, t, table="random", scale=sc, sweep="decode", **common))
    for lay in LAYOUTS:
        for dt in ("f16", "bf16", "f32"):
            for t in DECODE_TOKENS:
                sl = max(1, t // DECODE_SEQS)
                out.append(BenchCase("gather", lay, dt, dt, t, table="packed", seq_len=sl, sweep="decode", **common))
    return out


def preset(name: str, memory: str = "device", extra_dtypes: tuple[str, ...] = ()) -> list[BenchCase]:
    """The cases of a preset for one memory type. ``extra_dtypes`` (e.g. FP4 formats a provider
    claims) are added to the token sweep of the standard and full presets."""
    layouts = tuple(LAYOUTS)
    if name == "quick":
        cases = _token_sweep((16, 512), layouts, ("f16",), memory)
        cases += _token_sweep((512,), ("nhd",), ("bf16", "f32", "fp8_e4m3"), memory)
        cases += _table_sweep((512,), memory, seq_len=256)
        cases += _shape_sweep(256, (1, 32), (64, 256), memory)[:4]
    elif name == "standard":
        big = (1, 16, 256, 4096, 65536, 262144)
        cases = _token_sweep(big, layouts, ("f16", "bf16", "f32") + tuple(extra_dtypes), memory)
        cases += _token_sweep((16, 4096, 262144), layouts, ("fp8_e4m3",), memory, ops=("write",))
        cases += _shape_sweep(65536, (1, 8, 32), (64, 128, 256), memory)
        cases += _block_sweep(65536, (16, 32, 64, 128), memory)
        cases += _table_sweep((256, 65536), memory)
    elif name == "full":
        toks = tuple(2 ** i for i in range(0, 19))
        cases = _token_sweep(toks, layouts, ("f16", "bf16", "f32", "fp8_e4m3", "fp8_e5m2") + tuple(extra_dtypes),
                             memory)
        cases += _shape_sweep(65536, (1, 8, 32), (64, 128, 256), memory)
        for lay in layouts:
            cases += _block_sweep(65536, (16, 32, 64, 128), memory, layouts=(lay,))
        cases += _table_sweep((1, 16, 256, 4096, 65536, 262144), memory)
        cases += _fp8_io_sweep((4096, 65536, 262144), memory)
    elif name == "decode":
        cases = _decode_sweep(memory)
    else:
        raise ValueError(f"unknown preset {name!r} (quick, standard, full, decode)")
    if memory == "host" and name != "quick":
        # host providers: the largest sizes take seconds per call; cap at 64k rows
        cases = [c for c in cases if c.tokens <= 65536]
    return _dedupe(cases)


PRESETS = ("quick", "standard", "full", "decode")
