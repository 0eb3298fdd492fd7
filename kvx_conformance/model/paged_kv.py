"""The decoder's KV cache as a provider's paged cache: ``kvx_write_kv`` in, ``kvx_gather_kv`` out.

One pool per K and per V for the whole model, ``[n_layers, num_blocks, block_size, H, D]``
in the cache dtype: layer ``l`` is the NHD cache tensor at ``pool[l]`` (a layer stride),
described by one ``kvx_cache_desc_t`` per layer. The project's
:class:`~kvx_conformance.adapters.block_manager.BlockManager` hands out physical blocks (its
free queue shuffled first by default, so sequences are scattered over the pool) and
gives the slot mapping of each step's new tokens, the PACKED block table and the
sequence lengths of the step's sequences. Per layer and step, the new K/V (F32 IO) are
written through the slot mapping, then the whole context of every sequence is gathered
in the padded form (row ``s * max_seq_len + t``) and handed to attention.

Every buffer the provider sees (pools, IO, slots, table, lengths, scales) is a guarded
buffer of :mod:`kvx_conformance.abi.buffers` in one memory type: host (numpy) or device
(torch CUDA tensors, readings R-META-MEMORY: metadata lives with the cache). Guard
bytes of the per-step buffers are checked after every step, those of the pools by
:meth:`PagedKVStore.check_guards`.

The store takes and gives numpy arrays (the numpy decoder) or, with ``tensors="torch"``,
torch tensors (the torch decoder): on device memory the new K/V are copied from the
decoder's tensors into the guarded IO buffers and the gathered context is read as
tensors, GPU to GPU (only the guard bytes and each layer's first write, for the scale
calibration, cross to the host); on host memory the tensors are CPU tensors over the
same bytes.

FP4 caches (NVFP4, MXFP4) take one of two paths, recorded in :attr:`PagedKVStore.path`:

* ``provider-fp4``: the provider's KVX 1.2 FP4 cache (F4_E2M1 data pools plus a scale
  pool indexed by the same block ids, NVFP4's FP32 global scale per layer); the write
  quantizes the F32 rows, the gather dequantizes them to F32;
* ``oracle-fp4``: a provider without the extension (or refusing this cache): the
  reference codec's round trip is applied to the rows before an F32 write.
"""
from __future__ import annotations

import numpy as np

from ..abi import header as abi, buffers, descriptors as d
from ..abi.dtypes import np_dtype
from ..abi.header import DType, Layout, Memory, Status
from ..adapters.block_manager import BlockManager
from .kv_store import CacheFormat, LayerScales, dequantize_fp8, is_tensor, like, prepare_for_write, to_numpy
from .weights import LlamaConfig

BLOCK_SIZE = 16
FP4_BLOCK = 16  # values per scale byte (NVFP4 and the KV flavour of MXFP4)


class ProviderCallError(RuntimeError):
    """A provider call in the model loop did not return OK (or wrote outside its buffers)."""


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


def _dense_strides(shape) -> list[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= int(n)
    return out[::-1]


def _tensor(dtype: DType, layout: Layout, memory: Memory, shape, ptr: int) -> abi.kvx_tensor_desc_t:
    t = abi.kvx_tensor_desc_t.new(dtype=int(dtype), layout=int(layout), memory=int(memory), ndim=len(shape))
    for i, (n, s) in enumerate(zip(shape, _dense_strides(shape))):
        t.shape[i], t.stride[i] = int(n), int(s)
    t.data = ptr or None
    return t


class _Buf:
    """A guarded buffer holding one numpy array's bytes (host or device)."""

    def __init__(self, memory: Memory, name: str, shape, dtype, fill=None):
        self.shape, self.dtype = tuple(int(n) for n in shape), np.dtype(dtype)
        nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.buf = buffers.allocate(nbytes, memory, name)
        self.memory = memory
        if fill is not None and memory == Memory.DEVICE:
            self._fill_device(fill)
        elif fill is not None:
            self.set(np.full(self.shape, fill, dtype=self.dtype))

    def _fill_device(self, fill) -> None:
        """Fill on the GPU (a pool of gigabytes is not built on the host first)."""
        import torch

        raw = np.full(1, fill, dtype=self.dtype).view(np.uint8)
        data = self.buf.data_tensor()
        if np.all(raw == raw[0]):
            data.fill_(int(raw[0]))
        elif raw.size == 4:
            data.view(torch.int32).fill_(int(raw.view(np.int32)[0]))
        else:
            self.set(np.full(self.shape, fill, dtype=self.dtype))

    @classmethod
    def of(cls, memory: Memory, name: str, a: np.ndarray) -> "_Buf":
        b = cls(memory, name, a.shape, a.dtype)
        b.set(a)
        return b

    @property
    def ptr(self) -> int:
        return self.buf.ptr

    def set(self, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a, dtype=self.dtype)
        if self.memory == Memory.HOST:
            self.buf.data_view()[:] = a.view(np.uint8).reshape(-1)
        else:
            self.buf.upload(a)

    def get(self) -> np.ndarray:
        raw = self.buf.data_view() if self.memory == Memory.HOST else self.buf.download()
        return raw.view(self.dtype).reshape(self.shape)

    def tensor(self):
        """The data as a torch tensor over the buffer's bytes (a view: CUDA for device memory,
        CPU for host memory); float32 buffers as float32, one-byte buffers (FP8 codes) as uint8."""
        import torch

        tdt = torch.float32 if self.dtype == np.dtype(np.float32) else torch.uint8
        if self.dtype.itemsize != tdt.itemsize:
            raise ValueError(f"no tensor view of a {self.dtype} buffer")
        if self.memory == Memory.DEVICE:
            raw = self.buf.data_tensor()
        elif self.memory == Memory.HOST:
            raw = torch.from_numpy(self.buf.data_view())
        else:
            raise ValueError(f"no tensor view of {self.memory.name} memory")
        return raw.view(tdt).view(self.shape)

    def violations(self) -> list[str]:
        return self.buf.violations()


def fp4_format_of(fmt: CacheFormat) -> "abi.Fp4Format | None":
    if fmt.fp4 is None:
        return None
    return {"nvfp4": abi.Fp4Format.NVFP4, "mxfp4": abi.Fp4Format.MXFP4}[fmt.fp4]


def provider_minor(provider) -> int:
    try:
        return int(provider.version().minor)
    except Exception:
        return 0


class PagedKVStore:
    """A :class:`~kvx_conformance.model.kv_store.KVStore` backed by a KVX provider.

    ``memory``: where every buffer lives (HOST or DEVICE). ``fp4_path``: for FP4 formats,
    ``"auto"`` (the provider's FP4 cache when it validates one, else the oracle codec),
    ``"provider"`` (required) or ``"oracle"``. ``tensors``: ``"numpy"`` (arrays in and out) or
    ``"torch"`` (tensors in and out, on the buffers' device).
    """

    def __init__(
        self,
        provider,
        cfg: LlamaConfig,
        fmt: CacheFormat,
        num_blocks: int,
        block_size: int = BLOCK_SIZE,
        seed: int | None = 0,
        block_manager: BlockManager | None = None,
        memory: Memory = Memory.HOST,
        fp4_path: str = "auto",
        tensors: str = "numpy",
    ):
        if fp4_path not in ("auto", "provider", "oracle"):
            raise ValueError(f"fp4_path must be auto, provider or oracle, not {fp4_path!r}")
        if tensors not in ("numpy", "torch"):
            raise ValueError(f"tensors must be numpy or torch, not {tensors!r}")
        self.tensors = tensors
        if fmt.int_bits is not None:
            raise ValueError(f"{fmt.name} is the harness's quantization around a BF16 cache: IntKVStore(PagedKVStore(BF16))")
        self.provider, self.cfg, self.fmt, self.memory = provider, cfg, fmt, Memory(memory)
        why = buffers.memory_available(self.memory)
        if why:
            raise RuntimeError(why)
        self.geom = d.Geometry(num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
        if block_manager is None:
            block_manager = BlockManager(num_blocks, block_size)
            if seed is not None:
                scatter_free_blocks(block_manager, seed)
        if (block_manager.num_blocks, block_manager.block_size) != (num_blocks, block_size):
            raise ValueError("the block manager's pool differs from the cache's")
        self.blocks = block_manager
        self.scales = LayerScales(fmt)
        self._fp8_scale_bufs: dict[int, tuple[_Buf, _Buf]] = {}
        self._step = None
        self.calls = {"write": 0, "gather": 0}
        self.fp4_refusal: str | None = None

        self.path = "provider" if fmt.fp4 is None else None
        if fmt.fp4 is not None and fp4_path != "oracle":
            self._build_fp4()
            if self.path is None and fp4_path == "provider":
                raise ProviderCallError(f"the provider has no usable {fmt.name} cache: {self.fp4_refusal}")
        if self.path is None:
            self.path = "oracle-fp4"
        if self.path in ("provider", "oracle-fp4"):
            self._build_plain()
        self._check_pools_early()

    # -- construction
    def _pool(self, name: str, per_layer_shape, dtype) -> _Buf:
        return _Buf(self.memory, name, (self.cfg.n_layers,) + tuple(per_layer_shape), dtype, fill=0)

    def _layer_ptr(self, buf: _Buf, layer: int) -> int:
        return buf.ptr + layer * (buf.buf.nbytes // self.cfg.n_layers)

    def _build_plain(self) -> None:
        dt = self.fmt.dtype
        self.layout = d.cache_layout(self.geom, Layout.BLOCK_NHD, dt)
        # zero-filled pools: a block never written reads back as 0, never as stale data
        self.k_pool = self._pool("k pool", self.layout.shape, np_dtype(dt))
        self.v_pool = self._pool("v pool", self.layout.shape, np_dtype(dt))
        self.pools = [self.k_pool, self.v_pool]
        self._cache = [
            d.to_c_cache(self.geom, self.layout, self._layer_ptr(self.k_pool, l), self.layout,
                         self._layer_ptr(self.v_pool, l), self.memory)
            for l in range(self.cfg.n_layers)
        ]
        st = self.provider.validate_cache_desc(self._cache[0])
        if st != Status.OK:
            raise ProviderCallError(
                f"kvx_validate_cache_desc refused the model's {dt.name} NHD cache in {self.memory.name} memory: {_status(st)}"
            )

    def _build_fp4(self) -> None:
        """The KVX 1.2 FP4 cache; sets ``self.path = "provider-fp4"`` when the provider validates it."""
        if provider_minor(self.provider) < 2 or not hasattr(abi, "kvx_cache_desc_v1_2_t"):
            self.fp4_refusal = f"provider reports ABI minor {provider_minor(self.provider)} (the FP4 extension is 1.2)"
            return
        fmt4 = fp4_format_of(self.fmt)
        nb, bs, H, D = self.geom.num_blocks, self.geom.block_size, self.geom.num_kv_heads, self.geom.head_dim
        sdt = DType.F8_E4M3 if fmt4 == abi.Fp4Format.NVFP4 else DType.UE8M0
        self.k_pool = self._pool("k fp4 pool", (nb, bs, H, D // 2), np.uint8)
        self.v_pool = self._pool("v fp4 pool", (nb, bs, H, D // 2), np.uint8)
        self.k_scale_pool = self._pool("k scale pool", (nb, bs, H, D // FP4_BLOCK), np.uint8)
        self.v_scale_pool = self._pool("v scale pool", (nb, bs, H, D // FP4_BLOCK), np.uint8)
        self.pools = [self.k_pool, self.v_pool, self.k_scale_pool, self.v_scale_pool]
        self._globals = None
        if fmt4 == abi.Fp4Format.NVFP4:  # per layer, K then V; set on each layer's first write
            self._globals = _Buf(self.memory, "nvfp4 global scales", (self.cfg.n_layers, 2), np.float32, fill=1.0)
        logical, sshape = (nb, bs, H, D), (nb, bs, H, D // FP4_BLOCK)
        caches = []
        for l in range(self.cfg.n_layers):
            c = abi.kvx_cache_desc_v1_2_t.new(num_blocks=nb, block_size=bs, num_kv_heads=H, head_dim=D)
            c.k = _tensor(DType.F4_E2M1, Layout.BLOCK_NHD, self.memory, logical, self._layer_ptr(self.k_pool, l))
            c.v = _tensor(DType.F4_E2M1, Layout.BLOCK_NHD, self.memory, logical, self._layer_ptr(self.v_pool, l))
            c.pool = abi.kvx_pool_desc_t.new()
            x = abi.kvx_fp4_cache_ext_t.new(format=int(fmt4))
            x.k_scales = _tensor(sdt, Layout.BLOCK_NHD, self.memory, sshape, self._layer_ptr(self.k_scale_pool, l))
            x.v_scales = _tensor(sdt, Layout.BLOCK_NHD, self.memory, sshape, self._layer_ptr(self.v_scale_pool, l))
            if self._globals is not None:
                for side, j in (("k_global", 0), ("v_global", 1)):
                    g = abi.kvx_scale_desc_t.new(dtype=int(DType.F32), granularity=int(abi.ScaleGranularity.PER_TENSOR))
                    g.data = self._globals.ptr + 4 * (2 * l + j)
                    setattr(x, side, g)
            c.fp4 = x
            caches.append(c)
        st = self.provider.validate_cache_desc(caches[0])
        if st != Status.OK:
            self.fp4_refusal = f"kvx_validate_cache_desc answered {_status(st)} for a {self.fmt.name} NHD cache in {self.memory.name} memory"
            del self.k_pool, self.v_pool, self.k_scale_pool, self.v_scale_pool, self.pools, self._globals
            return
        self._cache = caches
        self.path = "provider-fp4"

    def _check_pools_early(self) -> None:
        bad = [v for b in self.pools for v in b.violations()]
        if bad:
            raise ProviderCallError("; ".join(bad))

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
        mem = self.memory
        st = _Step(seq_ids=list(seq_ids), counts=list(counts), lengths=lengths)
        st.slots = self.blocks.slot_mapping(seq_ids, dtype=DType.S64)
        table = self.blocks.packed_table(seq_ids, index_dtype=DType.S32)
        seq_lens = self.blocks.seq_lens(seq_ids, dtype=DType.S32)
        st.slots_buf = _Buf.of(mem, "slots", st.slots.encoded())
        st.table_buf = _Buf.of(mem, "block table", table.encoded_indices())
        st.lens_buf = _Buf.of(mem, "seq lens", seq_lens.encoded())
        st.max_len = max(lengths)
        gdt = self.gather_dtype
        n_out = len(seq_ids) * st.max_len
        fill = np.nan if gdt == DType.F32 else 0
        st.out_k = _Buf(mem, "gathered k", (n_out, H, D), np_dtype(gdt), fill=fill)
        st.out_v = _Buf(mem, "gathered v", (n_out, H, D), np_dtype(gdt), fill=fill)
        out_layout = d.IOLayout.dense(gdt, n_out, H, D)
        g = abi.kvx_gather_desc_t.new(max_seq_len=st.max_len)
        g.io = d.to_c_io(out_layout, st.out_k.ptr, out_layout, st.out_v.ptr, mem, n_out, H, D)
        g.block_table = d.to_c_table(table, st.table_buf.ptr, 0)
        g.seq_lens = d.to_c_seq_lens(seq_lens, st.lens_buf.ptr)
        st.gather_desc = g
        n_new = int(sum(counts))  # the step's new K/V rows, written by every layer in turn
        st.k_rows = _Buf(mem, "k rows", (n_new, H, D), np.float32)
        st.v_rows = _Buf(mem, "v rows", (n_new, H, D), np.float32)
        st.bufs = [st.slots_buf, st.table_buf, st.lens_buf, st.out_k, st.out_v, st.k_rows, st.v_rows]
        self._step = st
        return starts

    @property
    def gather_dtype(self) -> DType:
        """FP8 caches gather raw codes (v1.1), every other cache dequantizes to F32."""
        return self.fmt.gather_dtype if self.path == "provider" else DType.F32

    def _layer_scales(self, layer: int, k, v):
        first = layer not in self.scales.k
        ks, vs = self.scales.for_layer(layer, to_numpy(k), to_numpy(v)) if first else self.scales.for_layer(layer, k, v)
        if first and self.path == "provider-fp4" and self._globals is not None:
            g = self._globals.get().copy()
            g[layer] = (ks, vs)
            self._globals.set(g)
        if first and self.fmt.dtype in (DType.F8_E4M3, DType.F8_E5M2) and self.path == "provider":
            self._fp8_scale_bufs[layer] = (
                _Buf.of(self.memory, f"k scale layer {layer}", np.array([ks], np.float32)),
                _Buf.of(self.memory, f"v scale layer {layer}", np.array([vs], np.float32)),
            )
        return ks, vs

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        st = self._step
        ks, vs = self._layer_scales(layer, k, v)
        if self.path == "oracle-fp4":
            k = like(prepare_for_write(self.fmt, to_numpy(k), ks), k)
            v = like(prepare_for_write(self.fmt, to_numpy(v), vs), v)
        kin, vin = st.k_rows, st.v_rows
        if tuple(k.shape) != kin.shape or tuple(v.shape) != vin.shape:
            raise ValueError(f"layer {layer}: K/V rows {tuple(k.shape)} / {tuple(v.shape)}, the step has {kin.shape}")
        if is_tensor(k):  # tensor to buffer, on the device for device memory
            kin.tensor().copy_(k)
            vin.tensor().copy_(v)
        else:
            kin.set(k)
            vin.set(v)
        n, H, D = kin.shape
        io_layout = d.IOLayout.dense(DType.F32, n, H, D)
        desc = abi.kvx_write_desc_t.new()
        desc.io = d.to_c_io(io_layout, kin.ptr, io_layout, vin.ptr, self.memory, n, H, D)
        desc.slots = d.to_c_slots(st.slots, st.slots_buf.ptr)
        for side, pair_index, value in (("k", 0, ks), ("v", 1, vs)):
            if layer in self._fp8_scale_bufs:
                buf = self._fp8_scale_bufs[layer][pair_index]  # the value, in the cache's memory type
                c_scale = d.to_c_scale(d.ScaleSpec(np.array([value], np.float32)), buf.ptr)  # PER_TENSOR F32
            else:
                c_scale = d.to_c_scale(None, 0)  # size-guarded, no scale
            setattr(desc, f"{side}_scale_desc", c_scale)
        buffers.synchronize(self.memory)  # the tensor copies (and fills) are done before the provider reads
        code = self.provider.write_kv(self._cache[layer], desc)
        buffers.synchronize(self.memory)
        self.calls["write"] += 1
        if code != Status.OK:
            raise ProviderCallError(
                f"kvx_write_kv returned {_status(code)} (layer {layer}, {n} tokens, {self.fmt.name} NHD cache "
                f"({self.path}), block size {self.geom.block_size}, F32 IO, {self.memory.name} memory)"
            )
        self._guards([kin, vin, st.slots_buf], f"kvx_write_kv (layer {layer})")

    def read(self, layer: int) -> list[tuple[np.ndarray, np.ndarray]]:
        st = self._step
        buffers.synchronize(self.memory)
        code = self.provider.gather_kv(self._cache[layer], st.gather_desc)
        buffers.synchronize(self.memory)
        self.calls["gather"] += 1
        if code != Status.OK:
            raise ProviderCallError(
                f"kvx_gather_kv returned {_status(code)} (layer {layer}, {len(st.seq_ids)} sequences, "
                f"lengths {st.lengths}, PACKED S32 table, {self.fmt.name} cache ({self.path}), {self.memory.name} memory)"
            )
        fp8 = self.gather_dtype != DType.F32
        if self.tensors == "torch":
            return self._read_tensors(layer, st, fp8)
        all_k, all_v = st.out_k.get(), st.out_v.get()
        out = []
        for i, n in enumerate(st.lengths):
            rows = slice(i * st.max_len, i * st.max_len + n)
            k, v = all_k[rows], all_v[rows]
            if fp8:
                k = dequantize_fp8(k, self.scales.k[layer])
                v = dequantize_fp8(v, self.scales.v[layer])
            out.append((np.array(k, dtype=np.float32), np.array(v, dtype=np.float32)))
        return out

    def _read_tensors(self, layer: int, st, fp8: bool) -> list:
        import torch

        all_k, all_v = st.out_k.tensor(), st.out_v.tensor()
        out = []
        for i, n in enumerate(st.lengths):
            rows = slice(i * st.max_len, i * st.max_len + n)
            k, v = all_k[rows], all_v[rows]
            if fp8:  # raw E4M3 codes (v1.1) times the layer's scale, as dequantize_fp8
                k = k.view(torch.float8_e4m3fn).to(torch.float32) * torch.tensor(
                    float(self.scales.k[layer]), dtype=torch.float32, device=k.device)
                v = v.view(torch.float8_e4m3fn).to(torch.float32) * torch.tensor(
                    float(self.scales.v[layer]), dtype=torch.float32, device=v.device)
            else:  # a copy: the gather buffers are reused by the next layer
                k, v = k.clone(), v.clone()
            out.append((k, v))
        return out

    def end_step(self) -> None:
        st, self._step = self._step, None
        if st is not None:
            self._guards(st.bufs, "this step's calls")

    def free(self, seq_id: int) -> None:
        self.blocks.free(seq_id)

    # -- checks
    def _guards(self, bufs: list[_Buf], what: str) -> None:
        bad = [v for b in bufs for v in b.violations()]
        if bad:
            raise ProviderCallError(f"{what} wrote outside its buffers [spec 7.2]: " + "; ".join(bad))

    def check_guards(self) -> None:
        """Raise when any guard byte around the pools changed (a write outside the cache)."""
        self._guards(self.pools, f"the {self.fmt.name} pools")

    def pool_arrays(self) -> list[np.ndarray]:
        """Copies of the pools (K, V, and for an FP4 cache the K and V scale pools)."""
        return [np.array(b.get()) for b in self.pools]


class _Step:
    """Buffers and descriptors of one step (kept alive while the provider may read them)."""

    def __init__(self, seq_ids: list[int], counts: list[int], lengths: list[int]):
        self.seq_ids, self.counts, self.lengths = seq_ids, counts, lengths
