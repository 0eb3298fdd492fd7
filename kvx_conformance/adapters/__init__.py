"""Engine adapters: engine-native KV caches and metadata described as KVX descriptors.

One module per engine (``vllm``, ``tgi``, ``trtllm``, ``flashinfer``, ``ppl``); each
returns :class:`AdaptedCache` bundles and descriptor objects of
:mod:`kvx_conformance.abi.descriptors`, and raises :class:`AdapterError` for what KVX
v1.1 cannot express. ``docs/adapters.md`` maps every engine concept.
"""
from . import flashinfer, ppl, tgi, trtllm, vllm
from .common import AdaptedCache, AdapterError, PoolRef

__all__ = ["AdaptedCache", "AdapterError", "PoolRef", "flashinfer", "ppl", "tgi", "trtllm", "vllm"]
