"""Shared adapter machinery: refusals, array introspection, aliases, torch-style tensors.

Repro: python -m pytest tests/test_adapters_common.py -k <name>
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kvx_conformance.abi.header import DType, Layout, TableFormat
from kvx_conformance.adapters import AdapterError, vllm
from kvx_conformance.adapters.common import array_info, cache_dtype, flat_alias, ragged_table


def test_adapter_error_is_one_line_what_then_why():
    e = AdapterError("TGI slots with negative value -1", "KVX treats it as a no-op")
    assert str(e) == "TGI slots with negative value -1: KVX treats it as a no-op"
    assert "\n" not in str(e) and e.what.startswith("TGI") and e.why.startswith("KVX")


def test_array_info_reports_element_strides_and_pointer():
    a = np.zeros((3, 4, 5), np.float16)
    view = a[1:, :, ::2]
    info = array_info(view)
    assert info.shape == (2, 4, 3)
    assert info.stride == (20, 5, 2)
    assert info.itemsize == 2 and info.dtype_name == "float16"
    assert info.data_ptr == a.ctypes.data + 20 * 2


def test_negative_and_fractional_strides_are_refused():
    a = np.zeros((4, 4), np.float32)
    with pytest.raises(AdapterError, match="negative strides"):
        array_info(a[::-1])
    raw = np.zeros(64, np.uint8)
    odd = np.lib.stride_tricks.as_strided(raw.view(np.float16), shape=(3,), strides=(3,))
    with pytest.raises(AdapterError, match="not whole elements"):
        array_info(odd)


@pytest.mark.parametrize(
    "np_dt, want",
    [
        (np.float16, DType.F16), (np.float32, DType.F32), (ml_dtypes.bfloat16, DType.BF16),
        (ml_dtypes.float8_e4m3fn, DType.F8_E4M3), (ml_dtypes.float8_e5m2, DType.F8_E5M2),
    ],
)
def test_cache_dtype_auto_follows_the_element_type(np_dt, want):
    assert cache_dtype(array_info(np.zeros(2, np_dt))) == want


def test_cache_dtype_fp8_bytes_need_a_name():
    u8 = array_info(np.zeros(4, np.uint8))
    with pytest.raises(AdapterError, match="kv_cache_dtype='fp8_e4m3'"):
        cache_dtype(u8)
    assert cache_dtype(u8, "fp8") == DType.F8_E4M3
    assert cache_dtype(u8, "fp8_e4m3") == DType.F8_E4M3
    assert cache_dtype(u8, "fp8_e5m2") == DType.F8_E5M2
    with pytest.raises(AdapterError, match="1-byte elements"):
        cache_dtype(array_info(np.zeros(4, np.float16)), "fp8")
    with pytest.raises(AdapterError, match="cache dtypes are"):
        cache_dtype(u8, "fp8_e4m3fnuz")  # ROCm's FP8: another encoding
    with pytest.raises(AdapterError, match="not a KVX cache dtype"):
        cache_dtype(array_info(np.zeros(4, np.int8)))


def test_flat_alias_writes_through_and_is_bounded():
    a = np.zeros((4, 6), np.float32)
    view = a[1:3, 1:5]  # extent: 1 + 1*6 + 3*1 = 10 elements from a[1, 1]
    flat = flat_alias(view, 2, 8)
    flat[:] = np.arange(8)
    assert a.reshape(-1)[9:17].tolist() == list(range(8))
    with pytest.raises(ValueError, match="outside the array's extent of 10"):
        flat_alias(view, 3, 8)


def test_ragged_table_repeats_block_ids_per_token():
    t = ragged_table([np.array([7, 2]), np.array([5])], [5, 3], block_size=4)
    assert t.format == TableFormat.RAGGED
    assert t.indices.tolist() == [7, 7, 7, 7, 2, 5, 5, 5]
    assert t.indptr.tolist() == [0, 5, 8]
    assert t.max_blocks_per_seq == 2


class FakeTorchTensor:
    """The strided-memory protocol of a torch tensor over a numpy buffer (torch is not
    installed in CI; the adapters must not need it to describe a tensor)."""

    class _DType:
        def __init__(self, name):
            self.name = name

        def __str__(self):
            return f"torch.{self.name}"

    def __init__(self, buf: np.ndarray, offset: int, shape, stride):
        self.buf, self.offset, self.shape, self._stride = buf, offset, tuple(shape), tuple(stride)
        self.dtype = self._DType(buf.dtype.name)

    def stride(self):
        return self._stride

    def element_size(self):
        return self.buf.itemsize

    def data_ptr(self):
        return self.buf.ctypes.data + self.offset * self.buf.itemsize

    def storage_offset(self):
        return self.offset

    def as_strided(self, size, stride, storage_offset):
        return FakeTorchTensor(self.buf, storage_offset, size, stride)

    def numpy(self):
        it = self.buf.itemsize
        return np.lib.stride_tricks.as_strided(self.buf[self.offset:], self.shape, tuple(s * it for s in self._stride))

    def __getitem__(self, i):  # only what flash_kv_cache needs: kv[0], kv[1]
        return FakeTorchTensor(self.buf, self.offset + i * self._stride[0], self.shape[1:], self._stride[1:])


def test_torch_style_tensor_is_described_without_torch():
    nb, bs, h, d = 3, 4, 2, 8
    buf = np.arange(2 * nb * bs * h * d, dtype=np.float16)
    kv = FakeTorchTensor(buf, 0, (2, nb, bs, h, d), (nb * bs * h * d, bs * h * d, h * d, d, 1))
    a = vllm.flash_kv_cache(kv, backend="flash_attn")
    assert a.k.layout == Layout.BLOCK_NHD and a.k.dtype == DType.F16
    assert a.k_ptr == buf.ctypes.data and a.v_ptr == buf.ctypes.data + nb * bs * h * d * 2
    storage = a.v_storage()
    assert isinstance(storage, FakeTorchTensor) and storage.shape == (a.v.span_elements(),)
    assert storage.numpy()[:3].tolist() == buf[nb * bs * h * d: nb * bs * h * d + 3].tolist()


def _torch_devices(torch):
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_real_torch_hnd_view_and_raw_bit_round_trip():
    torch = pytest.importorskip("torch")
    nb, bs, h, d = 3, 4, 2, 8
    for device in _torch_devices(torch):
        phys = torch.arange(nb * h * bs * d, dtype=torch.float32, device=device).reshape(nb, h, bs, d).to(torch.bfloat16)
        a = vllm.flash_cache(phys.permute(0, 2, 1, 3), phys.permute(0, 2, 1, 3).clone())
        assert a.k.layout == Layout.BLOCK_HND and a.k.stride == (h * bs * d, bs * d, d, 1) and a.k.dtype == DType.BF16
        assert a.k_ptr == phys.data_ptr()
        case = a.cache_case()
        assert case.k_init.dtype == ml_dtypes.bfloat16
        assert case.k_init.astype(np.float32).tolist() == phys.float().reshape(-1).cpu().tolist()
        a.load({"k": np.zeros_like(case.k_init), "v": case.v_init})
        assert float(phys.float().abs().sum()) == 0.0, device


def test_real_torch_fp8_cache_dtype():
    torch = pytest.importorskip("torch")
    k = torch.zeros((2, 4, 2, 8), dtype=torch.float8_e4m3fn)
    assert vllm.flash_cache(k, k.clone()).k.dtype == DType.F8_E4M3
    u = torch.zeros((2, 4, 2, 8), dtype=torch.uint8)
    assert vllm.flash_cache(u, u.clone(), kv_cache_dtype="fp8_e5m2").k.dtype == DType.F8_E5M2


def test_real_torch_write_through_the_oracle_equals_tgi_store():
    torch = pytest.importorskip("torch")
    ref = pytest.importorskip("kvx_conformance.reference_impl", reason="the numpy oracle is not installed")
    from kvx_conformance.abi.header import Status
    from kvx_conformance.adapters import tgi

    nb, bs, h, d = 4, 4, 2, 8
    gen = torch.Generator().manual_seed(3)
    for device in _torch_devices(torch):
        k0 = torch.randn((nb, bs, h, d), generator=gen).to(torch.float16).to(device)
        key = torch.randn((5, h, d), generator=gen).to(torch.float16)
        slots = torch.tensor([3, 14, 0, 9, 7], dtype=torch.int64)
        hand = k0.clone()
        hand.view(-1, h, d)[slots.to(device)] = key.to(device)  # TGI's store
        mine = k0.clone()
        a = tgi.flash_cache(mine, mine.clone())
        res = ref.expected_write(a.write_case(key.numpy(), key.numpy(), tgi.slots(slots)))
        assert res.status == Status.OK, res
        a.load(res.arrays)
        assert torch.equal(mine, hand), device
