"""Place a benchmark case in memory: descriptors, buffers, rotated input sets, and checks.

A :class:`Prepared` case holds the ctypes structs of the call (built with
:mod:`kvx_conformance.abi.descriptors`, the same layer the conformance suites use), the
buffers behind them, ``nsets`` input sets that the timing loops rotate through (so
small calls do not time the cache of the previous call), and ``verify()``, which
holds what the timed calls left in memory against the numpy oracle
(:mod:`kvx_conformance.reference_impl`) through :mod:`kvx_conformance.cases.case`.

Memory backends: ``host`` (numpy), ``device`` (torch CUDA tensors), ``unified``
(``cudaMallocManaged`` through :mod:`kvx_conformance.abi.buffers`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..abi import header as abi
from ..abi import descriptors as d
from ..abi.dtypes import bits_view, np_dtype
from ..abi.header import DType, Memory
from ..cases.case import CacheCase, GatherCase, PoolCase, WriteCase
from .sweep import DTYPES, LAYOUTS, BenchCase

#: NVFP4 writes: the per-tensor global scale of K and V (docs/fp4.md)
FP4_GLOBAL_SCALE = 0.01

#: Cache tensors at least this large (bytes, each of K and V) so decode-sized calls
#: scatter over a realistic cache, not a few L2-resident blocks.
MIN_CACHE_BYTES = {"host": 8 << 20, "device": 128 << 20, "unified": 128 << 20}
#: Rotated input sets: enough that one round of calls moves 2x the last-level cache, at most this many.
MAX_SETS = 64
#: Verification: sets checked, and tokens (write) / sequences' rows (gather) per set checked in full
VERIFY_ROWS = 4096

MEM = {"host": Memory.HOST, "device": Memory.DEVICE, "unified": Memory.UNIFIED}


# ----------------------------------------------------------------------------- memory backends


class HostMem:
    name = "host"

    def from_numpy(self, a: np.ndarray):
        return np.ascontiguousarray(a).copy()

    def ptr(self, a) -> int:
        return int(a.ctypes.data)

    def to_numpy(self, a, dtype) -> np.ndarray:
        return np.asarray(a).view(np.uint8).reshape(-1).copy().view(dtype)

    def random(self, n: int, dtype: DType, rng: np.random.Generator):
        # a random block of 2^20 + 7 values, repeated: cheap, and no two nearby rows alike
        base = (rng.standard_normal(min(n, (1 << 20) + 7), dtype=np.float32) * np.float32(2.0)).astype(np_dtype(dtype))
        return np.resize(base, n)

    def empty(self, n: int, dtype: DType, rng: np.random.Generator):
        """Poison: random bits."""
        return rng.integers(0, 256, size=n * abi.DTYPE_SIZE[dtype], dtype=np.uint8).view(np_dtype(dtype))

    def take(self, a, shape, ids, dtype) -> np.ndarray:
        """Rows ``ids`` of ``a`` seen as ``shape`` (first axis indexed), flat, as numpy ``dtype``."""
        return np.ascontiguousarray(np.asarray(a).reshape(shape)[np.asarray(ids)]).reshape(-1).view(dtype)

    def zero(self, a) -> None:
        np.asarray(a).reshape(-1).view(np.uint8)[:] = 0

    def sync(self):
        pass


class UnifiedMem(HostMem):
    """Managed memory, filled and read through its host mapping (buffers.UnifiedBuffer)."""

    name = "unified"

    def __init__(self):
        self.keep: list = []

    def _alloc(self, a: np.ndarray):
        from ..abi.buffers import UnifiedBuffer

        a = np.ascontiguousarray(a)
        buf = UnifiedBuffer(max(a.nbytes, 1), "bench")
        view = buf.data_view()[: a.nbytes].view(a.dtype)
        view[:] = a.reshape(-1)
        self.keep.append(buf)
        return view

    def from_numpy(self, a):
        return self._alloc(a)

    def random(self, n, dtype, rng):
        return self._alloc(super().random(n, dtype, rng))

    def empty(self, n, dtype, rng):
        return self._alloc(super().empty(n, dtype, rng))

    def to_numpy(self, a, dtype):
        self.sync()
        return super().to_numpy(a, dtype)

    def take(self, a, shape, ids, dtype):
        self.sync()
        return super().take(a, shape, ids, dtype)

    def zero(self, a) -> None:
        self.sync()
        super().zero(a)

    def sync(self):
        from ..abi.buffers import _Cudart

        _Cudart.lib().cudaDeviceSynchronize()


class DeviceMem:
    name = "device"

    def __init__(self):
        import torch

        self.torch = torch
        self.gen = torch.Generator(device="cuda")

    def tdtype(self, dtype: DType):
        t = self.torch
        return {DType.F16: t.float16, DType.BF16: t.bfloat16, DType.F32: t.float32,
                DType.F8_E4M3: t.float8_e4m3fn, DType.F8_E5M2: t.float8_e5m2,
                DType.S32: t.int32, DType.S64: t.int64, DType.U8: t.uint8}[DType(dtype)]

    def from_numpy(self, a: np.ndarray):
        a = np.ascontiguousarray(a)
        u8 = self.torch.from_numpy(a.view(np.uint8).reshape(-1).copy()).to("cuda")
        if a.dtype.kind in "iu":
            return u8.view({1: self.torch.uint8, 4: self.torch.int32, 8: self.torch.int64}[a.itemsize])
        return u8

    def ptr(self, a) -> int:
        return int(a.data_ptr())

    def to_numpy(self, a, dtype) -> np.ndarray:
        self.torch.cuda.synchronize()
        return a.view(self.torch.uint8).cpu().numpy().reshape(-1).view(dtype)

    def take(self, a, shape, ids, dtype) -> np.ndarray:
        t = self.torch
        u8 = a.view(t.uint8)
        per = u8.numel() // shape[0]
        idx = t.from_numpy(np.asarray(ids, np.int64)).to(u8.device)
        return u8.view(shape[0], per).index_select(0, idx).cpu().numpy().reshape(-1).view(dtype)

    def zero(self, a) -> None:
        a.view(self.torch.uint8).zero_()

    def random(self, n: int, dtype: DType, rng: np.random.Generator):
        self.gen.manual_seed(int(rng.integers(0, 2**62)))
        x = self.torch.randn(n, device="cuda", generator=self.gen, dtype=self.torch.float32) * 2.0
        return x.to(self.tdtype(dtype))

    def empty(self, n: int, dtype: DType, rng: np.random.Generator):
        self.gen.manual_seed(int(rng.integers(0, 2**62)))
        nbytes = n * abi.DTYPE_SIZE[dtype]
        return self.torch.randint(0, 256, (nbytes,), device="cuda", generator=self.gen,
                                  dtype=self.torch.uint8).view(self.tdtype(dtype))

    def sync(self):
        self.torch.cuda.synchronize()


def backend(memory: str):
    return {"host": HostMem, "device": DeviceMem, "unified": UnifiedMem}[memory]()


# ----------------------------------------------------------------------------- prepared case


@dataclass
class InputSet:
    desc: object  # kvx_write_desc_t | kvx_gather_desc_t
    arrays: dict  # backend arrays: key/value (write) or out_k/out_v (gather), slots / indices ...
    meta: dict  # numpy: slots (write) or table, lengths, ragged/kv_offsets data (gather)


@dataclass
class Prepared:
    case: BenchCase
    mem: object
    geom: d.Geometry
    k_layout: d.TensorLayout
    v_layout: d.TensorLayout
    cache: object  # kvx_cache_desc_t
    arrays: dict  # k_cache, v_cache (or pool)
    sets: list[InputSet]
    seed: int
    pool: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def nsets(self) -> int:
        return len(self.sets)

    def call(self, provider, i: int, stream: int | None = None) -> int:
        s = self.sets[i % len(self.sets)]
        if self.case.op == "write":
            return provider.write_kv(self.cache, s.desc, stream)
        return provider.gather_kv(self.cache, s.desc, stream)

    #: the cache arrays a write fills (16-bit / FP8 caches, the KV_OFFSETS pool, FP4 codes and block scales)
    WRITTEN = ("k_cache", "v_cache", "pool", "k_codes", "v_codes", "k_scales", "v_scales")

    def poison(self, sets: tuple[int, ...]) -> None:
        """Zero what :meth:`verify` of ``sets`` reads back: the cache a write fills, or the outputs
        of those sets' gathers. Done before the timed work whose results are checked (between the
        graph's capture and its replays, before the last eager round, or before a repeat of the
        timed calls: run.VERIFIED_AFTER), it makes the verdict speak for that work: a provider
        whose captured calls do less than its eager ones (work on a stream of its own, done while
        the graph was captured, or none while the stream is capturing), or that skips a call it
        has seen, leaves zeros."""
        if self.case.op == "write":
            targets = [self.arrays[k] for k in self.WRITTEN if k in self.arrays]
        else:
            targets = [self.sets[j].arrays[f"out_{side}"] for j in sets for side in ("k", "v")]
        for a in targets:
            self.mem.zero(a)
        self.mem.sync()

    # -- verification against the oracle -----------------------------------------------------

    def verify(self, sets: tuple[int, ...] | None = None) -> dict:
        """Hold the memory the timed calls left against the oracle; returns {ok, rows_checked, ...}.

        Only the cache blocks the checked rows touch are read back: they form a compact
        cache (same layout, fewer blocks) with the slots / table renumbered, which the
        oracle checks exactly as it would the whole cache (blocks are independent).
        """
        from ..reference_impl import expected_gather, expected_write

        c = self.case
        picks = sets if sets is not None else (self.nsets - 1,)
        if c.fp4:
            return self._verify_fp4(picks)
        kdt, iodt = np_dtype(DTYPES[c.dtype]), np_dtype(DTYPES[c.io])
        H, D, bs = c.heads, c.head_dim, c.block_size
        row = H * D
        shape = tuple(self.k_layout.shape)
        pack = c.pack if c.layout == "hnd_packed" else None
        self.mem.sync()
        checked, total, problems = 0, 0, []
        for j in picks:
            s = self.sets[j]
            rng = np.random.default_rng(self.seed + 1000 + j)
            if c.op == "write":
                slots = s.meta["slots"]
                n = len(slots)
                total += n
                sub = np.arange(n) if n <= VERIFY_ROWS else np.sort(rng.choice(n, VERIFY_ROWS, replace=False))
                uniq, inv = np.unique(slots[sub] // bs, return_inverse=True)
                geom = d.Geometry(len(uniq), bs, H, D)
                lay = d.cache_layout(geom, self.k_layout.layout, DTYPES[c.dtype], pack=pack)
                k_now = self.mem.take(self.arrays["k_cache"], shape, uniq, kdt)
                v_now = self.mem.take(self.arrays["v_cache"], shape, uniq, kdt)
                key = self.mem.take(s.arrays["key"], (n, row), sub, iodt)
                val = self.mem.take(s.arrays["value"], (n, row), sub, iodt)
                io = d.IOLayout.dense(DTYPES[c.io], len(sub), H, D)
                compact = (inv.reshape(-1) * bs + slots[sub] % bs).astype(np.int64)
                # R-WRITE is idempotent: writing the same rows again over what the timed calls left
                # must change nothing, iff those rows hold the oracle's values for these tokens.
                scale = s.meta.get("scale", 1.0) if s.meta.get("scaled") else None
                wc = WriteCase(CacheCase(geom, lay, lay, k_now, v_now), io, io, key, val, d.SlotMapping(compact),
                               len(sub), k_scale=scale, v_scale=scale, seed=self.seed, label=c.id)
                exp = expected_write(wc, MEM[c.memory])
                got = {"k": k_now, "v": v_now}
                what = "cache"
                checked += len(sub)
            else:
                seqs, sl = c.seqs, c.sl
                total += seqs * sl
                sub = np.arange(seqs) if seqs * sl <= VERIFY_ROWS else np.sort(
                    rng.choice(seqs, max(1, VERIFY_ROWS // sl), replace=False))
                m = s.meta
                if self.pool:
                    ids = m["offsets"][sub]
                    uniq, inv = np.unique(ids, return_inverse=True)
                    geom = d.Geometry(len(uniq), bs, H, D)
                    pool = self.mem.take(self.arrays["pool"], (2 * self.geom.num_blocks,) + shape[1:], uniq, kdt)
                    lay = d.cache_layout(geom, self.k_layout.layout, DTYPES[c.dtype])
                    cc = CacheCase(geom, lay, lay, pool, pool, PoolCase(self.cache.pool.bytes_per_block, pool))
                    bt = d.BlockTable.kv_offsets(inv.reshape(ids.shape))
                else:
                    tbl = m["table"][sub]
                    uniq, inv = np.unique(tbl, return_inverse=True)
                    tbl_c = inv.reshape(tbl.shape).astype(np.int64)
                    geom = d.Geometry(len(uniq), bs, H, D)
                    lay = d.cache_layout(geom, self.k_layout.layout, DTYPES[c.dtype], pack=pack)
                    cc = CacheCase(geom, lay, lay, self.mem.take(self.arrays["k_cache"], shape, uniq, kdt),
                                   self.mem.take(self.arrays["v_cache"], shape, uniq, kdt))
                    if c.table == "packed":
                        bt = d.BlockTable.packed(tbl_c)
                    else:
                        bt = d.BlockTable.ragged(list(tbl_c[:, np.arange(sl) // bs]), tbl_c.shape[1])
                got = {side: self.mem.take(s.arrays[f"out_{side}"], (seqs, sl * row), sub, iodt)
                       for side in ("k", "v")}
                out = d.IOLayout.dense(DTYPES[c.io], len(sub) * sl, H, D)
                poison = np.zeros(out.span_elements(), iodt)
                gc = GatherCase(cc, bt, d.SeqLens(m["lengths"][sub]), sl, out, len(sub) * sl, poison, poison.copy(),
                                seed=self.seed, label=c.id)
                exp = expected_gather(gc, MEM[c.memory])
                what = "gathered output"
                checked += len(sub) * sl
            if exp.status != 0:
                problems.append(f"set {j}: oracle status {exp.status} ({exp.rule})")
            for side in ("k", "v"):
                bad = np.count_nonzero(bits_view(exp.arrays[side]) != bits_view(got[side]))
                if bad:
                    problems.append(f"set {j}: {bad} {side} {what} elements differ from the oracle")
        return {"ok": not problems, "rows_checked": int(checked), "rows_total": int(total),
                "sets_checked": list(picks), "problems": problems[:5]}


    def _verify_fp4(self, picks) -> dict:
        """FP4 writes: the written rows' codes and block scales against the oracle's encoding of the IO rows."""
        from ..cases import fp4 as fx

        c = self.case
        fmt = FP4_FORMATS[c.dtype]
        H, D, bs = c.heads, c.head_dim, c.block_size
        nb = self.geom.num_blocks
        hnd = c.layout == "hnd"
        self.mem.sync()
        checked, total, problems = 0, 0, []
        for j in picks:
            s = self.sets[j]
            rng = np.random.default_rng(self.seed + 1000 + j)
            slots = s.meta["slots"]
            n = len(slots)
            total += n
            sub = np.arange(n) if n <= VERIFY_ROWS else np.sort(rng.choice(n, VERIFY_ROWS, replace=False))
            blk, off = slots[sub] // bs, slots[sub] % bs
            uniq, inv = np.unique(blk, return_inverse=True)
            inv = inv.reshape(-1)
            iodt = np_dtype(DTYPES[c.io])
            g = np.float32(s.meta["global"]) if s.meta.get("global") is not None else None
            for side, io_key in (("k", "key"), ("v", "value")):
                x = self.mem.take(s.arrays[io_key], (n, H * D), sub, iodt).astype(np.float32).reshape(len(sub), H, D)
                want_c, want_s = fx.encode_rows(fmt, x, g)
                got = {}
                for part, width in (("codes", D // 2), ("scales", D // fx.block_values(fmt))):
                    blocks = self.mem.take(self.arrays[f"{side}_{part}"], (nb, bs * H * width), uniq, np.uint8)
                    if hnd:
                        got[part] = blocks.reshape(len(uniq), H, bs, width)[inv, :, off]
                    else:
                        got[part] = blocks.reshape(len(uniq), bs, H, width)[inv, off]
                for part, want in (("codes", want_c), ("scales", want_s)):
                    bad = np.count_nonzero(got[part].reshape(want.shape) != want)
                    if bad:
                        problems.append(f"set {j}: {bad} {side} cache {part} bytes differ from the oracle's encoding")
            checked += len(sub)
        return {"ok": not problems, "rows_checked": int(checked), "rows_total": int(total),
                "sets_checked": list(picks), "problems": problems[:5]}


def _sets_for(case: BenchCase, last_level_cache: int) -> int:
    per_call = case.bytes_moved()
    return int(max(1, min(MAX_SETS, math.ceil(2 * last_level_cache / max(per_call, 1)))))


def prepare(case: BenchCase, mem=None, *, seed: int = 0, last_level_cache: int = 50 << 20,
            nsets: int | None = None) -> Prepared:
    """Build buffers and descriptors for ``case`` (raises ValueError for a dtype this harness lacks)."""
    c = case
    if c.fp4 and c.op == "write" and c.io in DTYPES:
        return _prepare_fp4(c, mem or backend(c.memory), seed)
    if c.dtype not in DTYPES or c.io not in DTYPES:
        raise ValueError(f"dtype {c.dtype}/{c.io} has no buffer builder in this harness")
    mem = mem or backend(c.memory)
    rng = np.random.default_rng(seed)
    dt, iodt = DTYPES[c.dtype], DTYPES[c.io]
    esize = abi.DTYPE_SIZE[dt]
    block_bytes = c.block_size * c.heads * c.head_dim * esize
    nsets = nsets or (1 if c.replay else _sets_for(c, last_level_cache))
    min_blocks = math.ceil(MIN_CACHE_BYTES[c.memory] / block_bytes)
    if c.op == "write":
        need = math.ceil(c.tokens / c.block_size) * nsets
    else:
        need = c.seqs * math.ceil(c.sl / c.block_size) * nsets
    num_blocks = max(need, min_blocks, 2)
    if c.cache_blocks:
        if need > c.cache_blocks:
            raise ValueError(f"{c.id}: {need} blocks needed, the case's cache has {c.cache_blocks}")
        num_blocks = c.cache_blocks
    geom = d.Geometry(num_blocks, c.block_size, c.heads, c.head_dim)
    lay = LAYOUTS[c.layout] if c.table != "kv_offsets" else LAYOUTS["hnd"]
    k_layout = d.cache_layout(geom, lay, dt, pack=c.pack if c.layout == "hnd_packed" else None)
    v_layout = k_layout
    m = MEM[c.memory]
    span = k_layout.span_elements()
    arrays: dict = {}
    pool = c.op == "gather" and c.table == "kv_offsets"
    if pool:
        # KV_OFFSETS (kvx-abi-1.1): one primary pool of HND blocks, K blocks and V blocks both in it;
        # the k/v tensor descriptors (validated, not read) cover its first num_blocks blocks.
        arrays["pool"] = mem.random(2 * span, dt, rng)
        base = mem.ptr(arrays["pool"])
        cache = d.to_c_cache(geom, k_layout, base, v_layout, base, m, pool_bytes_per_block=block_bytes,
                             pool_primary=base)
    else:
        arrays["k_cache"] = mem.random(span, dt, rng)
        arrays["v_cache"] = mem.random(span, dt, rng)
        cache = d.to_c_cache(geom, k_layout, mem.ptr(arrays["k_cache"]), v_layout, mem.ptr(arrays["v_cache"]), m)
    sets: list[InputSet] = []
    H, D = c.heads, c.head_dim
    if c.op == "write":
        if c.table == "prefill":
            nb = math.ceil(c.tokens / c.block_size)
            perm = rng.permutation(num_blocks)[: nb * nsets]
        else:
            perm = rng.permutation(geom.num_slots)[: c.tokens * nsets]
        for j in range(nsets):
            if c.table == "prefill":
                blocks = perm[j * nb:(j + 1) * nb]
                slots = (blocks[:, None] * c.block_size + np.arange(c.block_size)[None, :]).reshape(-1)[: c.tokens]
            else:
                slots = perm[j * c.tokens:(j + 1) * c.tokens]
            slots = slots.astype(np.int64)
            io = d.IOLayout.dense(iodt, c.tokens, H, D)
            key = mem.random(io.span_elements(), iodt, rng)
            val = mem.random(io.span_elements(), iodt, rng)
            sl_dev = mem.from_numpy(slots)
            desc = abi.kvx_write_desc_t.new()
            desc.io = d.to_c_io(io, mem.ptr(key), io, mem.ptr(val), m, c.tokens, H, D)
            sm = d.SlotMapping(slots)
            desc.slots = d.to_c_slots(sm, mem.ptr(sl_dev))
            desc.k_scale_desc = d.to_c_scale(None, 0)
            desc.v_scale_desc = d.to_c_scale(None, 0)
            arr = {"key": key, "value": val, "slots": sl_dev}
            scaled = dt != iodt and dt in abi.FP8_DTYPES
            if scaled:
                # per-tensor scale (spec 6.9; 1.0 unless the case names one): the quantizing path with its
                # scale read
                one = mem.from_numpy(np.array([c.scale, c.scale], np.float32))
                arr["scale"] = one
                desc.k_scale = mem.ptr(one)
                desc.v_scale = mem.ptr(one) + 4
            sets.append(InputSet(desc, arr, {"slots": slots, "scaled": scaled, "scale": float(np.float32(c.scale))}))
    else:
        seqs, sl = c.seqs, c.sl
        mb = math.ceil(sl / c.block_size)
        ids = rng.permutation(num_blocks)[: seqs * mb * nsets]
        for j in range(nsets):
            table = ids[j * seqs * mb:(j + 1) * seqs * mb].reshape(seqs, mb).astype(np.int64)
            lengths = np.full(seqs, sl, np.int64)
            meta = {"table": table, "lengths": lengths}
            arr: dict = {}
            if c.table == "packed":
                bt = d.BlockTable.packed(table)
            elif c.table == "ragged":
                tok = np.arange(sl)
                ragged = table[:, tok // c.block_size]  # [seqs, sl]: one block id per cached token
                bt = d.BlockTable.ragged(list(ragged), mb)
                meta["ragged"] = ragged.reshape(-1)
                meta["indptr"] = np.arange(seqs + 1, dtype=np.int64) * sl
            else:
                # K blocks from the first half of the pool, V blocks from the second
                offsets = np.stack([table, table + num_blocks], axis=1)[:, None, :, :]  # [seqs, 1, 2, mb]
                bt = d.BlockTable.kv_offsets(offsets)
                meta["offsets"] = offsets
            idx = mem.from_numpy(bt.encoded_indices())
            ptr_arr = bt.encoded_indptr()
            indptr = mem.from_numpy(ptr_arr) if ptr_arr is not None else None
            lens = mem.from_numpy(d.SeqLens(lengths).encoded())
            out = d.IOLayout.dense(iodt, seqs * sl, H, D)
            ok = mem.empty(out.span_elements(), iodt, rng)
            ov = mem.empty(out.span_elements(), iodt, rng)
            desc = abi.kvx_gather_desc_t.new(max_seq_len=sl)
            desc.io = d.to_c_io(out, mem.ptr(ok), out, mem.ptr(ov), m, seqs * sl, H, D)
            desc.block_table = d.to_c_table(bt, mem.ptr(idx), mem.ptr(indptr) if indptr is not None else 0)
            desc.seq_lens = d.to_c_seq_lens(d.SeqLens(lengths), mem.ptr(lens))
            arr.update(out_k=ok, out_v=ov, indices=idx, indptr=indptr, lens=lens)
            sets.append(InputSet(desc, arr, meta))
    mem.sync()
    return Prepared(c, mem, geom, k_layout, v_layout, cache, arrays, sets, seed, pool=pool)


FP4_FORMATS = {"nvfp4": abi.Fp4Format.NVFP4, "mxfp4": abi.Fp4Format.MXFP4}


def _prepare_fp4(c: BenchCase, mem, seed: int) -> Prepared:
    """A KVX 1.2 FP4 write (docs/fp4.md): code and block-scale pools of the case's layout (NHD or
    HND), IO rows of ``c.io``, random distinct slots; one input set (decode) or enough to rotate."""
    from ..cases import fp4 as fx

    if c.layout not in ("nhd", "hnd"):
        raise ValueError(f"FP4 caches are NHD or HND, not {c.layout}")
    fmt = FP4_FORMATS[c.dtype]
    rng = np.random.default_rng(seed)
    H, D, bs = c.heads, c.head_dim, c.block_size
    J = D // fx.block_values(fmt)
    nsets = 1 if c.replay else _sets_for(c, 50 << 20)
    need = math.ceil(c.tokens / bs) * nsets
    nb = c.cache_blocks or max(need, math.ceil(MIN_CACHE_BYTES[c.memory] / (bs * H * D // 2)), 2)
    if need > nb:
        raise ValueError(f"{c.id}: {need} blocks needed, the case's cache has {nb}")
    lay = LAYOUTS[c.layout]
    m = MEM[c.memory]
    geom = d.Geometry(nb, bs, H, D)
    arrays = {f"{side}_{part}": mem.empty(nb * bs * H * width, DType.U8, rng)
              for side in ("k", "v") for part, width in (("codes", D // 2), ("scales", J))}
    logical = (nb, bs, H, D) if c.layout == "nhd" else (nb, H, bs, D)
    sshape = (nb, bs, H, J) if c.layout == "nhd" else (nb, H, bs, J)
    cache = abi.kvx_cache_desc_v1_2_t.new(num_blocks=nb, block_size=bs, num_kv_heads=H, head_dim=D)
    cache.k = fx._tensor(DType.F4_E2M1, lay, m, logical, fx._dense_strides(logical), mem.ptr(arrays["k_codes"]))
    cache.v = fx._tensor(DType.F4_E2M1, lay, m, logical, fx._dense_strides(logical), mem.ptr(arrays["v_codes"]))
    cache.pool = abi.kvx_pool_desc_t.new()
    ext = abi.kvx_fp4_cache_ext_t.new(format=int(fmt))
    sdt = fx.scale_dtype(fmt)
    ext.k_scales = fx._tensor(sdt, lay, m, sshape, fx._dense_strides(sshape), mem.ptr(arrays["k_scales"]))
    ext.v_scales = fx._tensor(sdt, lay, m, sshape, fx._dense_strides(sshape), mem.ptr(arrays["v_scales"]))
    g = FP4_GLOBAL_SCALE if fmt == abi.Fp4Format.NVFP4 else None
    if g is not None:
        arrays["global"] = mem.from_numpy(np.array([g], np.float32))  # one buffer, K and V
    for side in ("k_global", "v_global"):
        sd = abi.kvx_scale_desc_t.new()
        if g is not None:
            sd.dtype, sd.granularity = int(DType.F32), int(abi.ScaleGranularity.PER_TENSOR)
            sd.data = mem.ptr(arrays["global"])
        setattr(ext, side, sd)
    cache.fp4 = ext
    perm = rng.permutation(nb * bs)[: c.tokens * nsets]
    iodt = DTYPES[c.io]
    sets = []
    for j in range(nsets):
        slots = perm[j * c.tokens:(j + 1) * c.tokens].astype(np.int64)
        key = mem.random(c.tokens * H * D, iodt, rng)
        val = mem.random(c.tokens * H * D, iodt, rng)
        sl_dev = mem.from_numpy(slots)
        w = abi.kvx_write_desc_v1_2_t.new()
        w.io = fx._io(iodt, m, mem.ptr(key), mem.ptr(val), c.tokens, H, D)
        w.slots = abi.kvx_slot_mapping_t.new(dtype=int(DType.S64), token_count=c.tokens, invalid_slot=-1)
        w.slots.slots = mem.ptr(sl_dev)
        w.k_scale_desc, w.v_scale_desc = abi.kvx_scale_desc_t.new(), abi.kvx_scale_desc_t.new()
        sets.append(InputSet(w, {"key": key, "value": val, "slots": sl_dev},
                             {"slots": slots, "global": None if g is None else float(np.float32(g))}))
    mem.sync()
    return Prepared(c, mem, geom, None, None, cache, arrays, sets, seed)
