"""The decoder's KV cache as a provider's paged cache: ``kvx_write_kv`` in, ``kvx_gather_kv`` out.

One pool per K and per V for the whole model, ``[n_layers, num_blocks, block_size, H, D]``
in the cache dtype: layer ``l`` is the NHD cache tensor at ``pool[l]`` (a layer stride),
described by one ``kvx_cache_desc_t`` per layer. The project's
:class:`~kvx_conformance.block_manager.BlockManager` hands out physical blocks (its
free queue shuffled first by default, so sequences are scattered over the pool) and
gives the slot mapping of each step's new tokens, the PACKED block table and the
sequence lengths of the step's sequences. Per layer and step, the new K/V (F32 IO) are written through the
slot mapping, then the whole context of every sequence is gathered in the padded form
(row ``s * max_seq_len + t``) and handed to attention.
"""
from __future__ import annotations


import numpy as np

from .. import abi, descriptors as d
from ..abi import DType, Layout, Memory, Status
from ..dtypes import np_dtype
from ..block_manager import BlockManager
from .kv_store import CacheFormat, LayerScales, dequantize_fp8, prepare_for_write
from .weights import LlamaConfig

BLOCK_SIZE = 16


class ProviderCallError(RuntimeError):
    """A provider call in the model loop did not return OK."""


def _status(code: int) -> str:
    try:
        return Status(code).name
    except ValueError:
        return f"<unknown status {code}>"


def scatter_free_blocks(blocks: BlockManager, seed: int) -> None:
    """Shuffle the free queue of an empty manager (take every block, give them back in a
    random order), so that sequences get scattered, non-contiguous blocks from the start."""
    if blocks.seq_ids():
        raise ValueError("scatter_free_blocks needs an empty block manager")
    n = blocks.num_free
    for i in range(n):
        blocks.allocate(("scatter", i), blocks.block_size)
    for i in np.random.default_rng(seed).permutation(n):
        blocks.free(("scatter", int(i)))


def blocks_needed(lengths: list[int], block_size: int = BLOCK_SIZE) -> int:
    return sum(-(-n // block_size) for n in lengths)


class PagedKVStore:
    """A :class:`~kvx_conformance.model.kv_store.KVStore` backed by a KVX provider (host memory)."""

    def __init__(
        self,
        provider,
        cfg: LlamaConfig,
        fmt: CacheFormat,
        num_blocks: int,
        block_size: int = BLOCK_SIZE,
        seed: int | None = 0,
        block_manager: BlockManager | None = None,
    ):
        self.provider, self.cfg, self.fmt = provider, cfg, fmt
        self.geom = d.Geometry(num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
        self.layout = d.cache_layout(self.geom, Layout.BLOCK_NHD, fmt.dtype)
        shape = (cfg.n_layers,) + self.layout.shape
        # zero-filled pools: a block never written reads back as 0, never as stale data
        self.k_pool = np.zeros(shape, dtype=np_dtype(fmt.dtype))
        self.v_pool = np.zeros(shape, dtype=np_dtype(fmt.dtype))
        if block_manager is None:
            block_manager = BlockManager(num_blocks, block_size)
            if seed is not None:
                scatter_free_blocks(block_manager, seed)
        if (block_manager.num_blocks, block_manager.block_size) != (num_blocks, block_size):
            raise ValueError("the block manager's pool differs from the cache's")
        self.blocks = block_manager
        self.scales = LayerScales(fmt)
        self._cache = [
            d.to_c_cache(self.geom, self.layout, self.k_pool[l].ctypes.data, self.layout,
                         self.v_pool[l].ctypes.data, Memory.HOST)
            for l in range(cfg.n_layers)
        ]
        st = provider.validate_cache_desc(self._cache[0])
        if st != Status.OK:
            raise ProviderCallError(f"kvx_validate_cache_desc refused the model's {fmt.name} NHD cache: {_status(st)}")
        self._step = None
        self.calls = {"write": 0, "gather": 0}

    # -- KVStore
    def begin_step(self, seq_ids: list[int], counts: list[int]) -> list[int]:
        known = set(self.blocks.seq_ids())
        starts = [self.blocks.num_tokens(s) if s in known else 0 for s in seq_ids]
        for s, c in zip(seq_ids, counts):
            if s in known:
                self.blocks.append_tokens(s, c)
            else:
                self.blocks.allocate(s, c)
        copies = self.blocks.take_copies()
        if copies:  # no fork here, so no copy-on-write either
            raise RuntimeError(f"unexpected copy-on-write {copies}")
        lengths = [self.blocks.num_tokens(s) for s in seq_ids]
        H, D = self.cfg.n_kv_heads, self.cfg.head_dim
        st = _Step(seq_ids=list(seq_ids), counts=list(counts), lengths=lengths)
        st.slots = self.blocks.slot_mapping(seq_ids, dtype=DType.S64)
        st.slots_buf = st.slots.encoded()
        table = self.blocks.packed_table(seq_ids, index_dtype=DType.S32)
        seq_lens = self.blocks.seq_lens(seq_ids, dtype=DType.S32)
        st.table_buf, st.lens_buf = table.encoded_indices(), seq_lens.encoded()
        st.max_len = max(lengths)
        gdt = self.fmt.gather_dtype
        n_out = len(seq_ids) * st.max_len
        fill = np.nan if gdt == DType.F32 else 0
        st.out_k = np.full((n_out, H, D), fill, dtype=np_dtype(gdt))
        st.out_v = np.full((n_out, H, D), fill, dtype=np_dtype(gdt))
        out_layout = d.IOLayout.dense(gdt, n_out, H, D)
        g = abi.kvx_gather_desc_t.new(max_seq_len=st.max_len)
        g.io = d.to_c_io(out_layout, st.out_k.ctypes.data, out_layout, st.out_v.ctypes.data, Memory.HOST, n_out, H, D)
        g.block_table = d.to_c_table(table, st.table_buf.ctypes.data, 0)
        g.seq_lens = d.to_c_seq_lens(seq_lens, st.lens_buf.ctypes.data)
        st.gather_desc = g
        self._step = st
        return starts

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        st = self._step
        ks, vs = self.scales.for_layer(layer, k, v)
        kin = np.ascontiguousarray(prepare_for_write(self.fmt, k, ks), dtype=np.float32)
        vin = np.ascontiguousarray(prepare_for_write(self.fmt, v, vs), dtype=np.float32)
        n, H, D = kin.shape
        io_layout = d.IOLayout.dense(DType.F32, n, H, D)
        desc = abi.kvx_write_desc_t.new()
        desc.io = d.to_c_io(io_layout, kin.ctypes.data, io_layout, vin.ctypes.data, Memory.HOST, n, H, D)
        desc.slots = d.to_c_slots(st.slots, st.slots_buf.ctypes.data)
        keep = []  # scale buffers stay alive through the call
        for side, scale in (("k", ks), ("v", vs)):
            if self.fmt.dtype in (DType.F8_E4M3, DType.F8_E5M2):
                buf = np.array([scale], dtype=np.float32)
                keep.append(buf)
                c_scale = d.to_c_scale(d.ScaleSpec(buf), buf.ctypes.data)  # PER_TENSOR F32
            else:
                c_scale = d.to_c_scale(None, 0)  # size-guarded, no scale
            setattr(desc, f"{side}_scale_desc", c_scale)
        code = self.provider.write_kv(self._cache[layer], desc)
        self.calls["write"] += 1
        if code != Status.OK:
            raise ProviderCallError(
                f"kvx_write_kv returned {_status(code)} (layer {layer}, {n} tokens, {self.fmt.name} NHD cache, "
                f"block size {self.geom.block_size}, F32 IO)"
            )

    def read(self, layer: int) -> list[tuple[np.ndarray, np.ndarray]]:
        st = self._step
        code = self.provider.gather_kv(self._cache[layer], st.gather_desc)
        self.calls["gather"] += 1
        if code != Status.OK:
            raise ProviderCallError(
                f"kvx_gather_kv returned {_status(code)} (layer {layer}, {len(st.seq_ids)} sequences, "
                f"lengths {st.lengths}, PACKED S32 table, {self.fmt.name} cache)"
            )
        fp8 = self.fmt.gather_dtype != DType.F32
        out = []
        for i, n in enumerate(st.lengths):
            rows = slice(i * st.max_len, i * st.max_len + n)
            k, v = st.out_k[rows], st.out_v[rows]
            if fp8:
                k = dequantize_fp8(k, self.scales.k[layer])
                v = dequantize_fp8(v, self.scales.v[layer])
            out.append((np.ascontiguousarray(k, dtype=np.float32), np.ascontiguousarray(v, dtype=np.float32)))
        return out

    def end_step(self) -> None:
        self._step = None

    def free(self, seq_id: int) -> None:
        self.blocks.free(seq_id)


class _Step:
    """Buffers and descriptors of one step (kept alive while the provider may read them)."""

    def __init__(self, seq_ids: list[int], counts: list[int], lengths: list[int]):
        self.seq_ids, self.counts, self.lengths = seq_ids, counts, lengths
