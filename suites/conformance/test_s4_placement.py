"""Spec 4.3, 7 (R-PLACEMENT): buffers on a GPU other than the current one.

Under tensor parallelism one process often drives several GPUs: the cache and IO of a
call may live on GPU 1 while the calling thread's current device is GPU 0 (or was GPU 0
for the provider's previous calls). The spec's descriptors carry no device index: a
DEVICE pointer names its device by itself (4.3: ``memory`` describes buffer location),
and a NULL stream is "the default stream for the implementation" (7). Reading
(docs/spec-readings.md, R-PLACEMENT): a provider either does the work on the buffers'
device, so that synchronizing that device shows the result, or refuses the call
(UNSUPPORTED or INVALID_ARGUMENT: the optional feature ``multi_device``), and in no case
writes through another device's context: no CUDA error on either GPU, no byte outside
the described tensors changed on either GPU, the result bit-exact.

Each test first makes the same kind of call on GPU 0 (so a provider that keeps state
per device has some for GPU 0), keeps a twin of the cache on GPU 0 as a bystander, then
calls with the buffers on GPU 1 and the current device set to GPU 0 (``other``) or to
GPU 1 (``buffers``). Runs on DEVICE memory (unified memory has no owning device) with
at least two GPUs visible to the worker (``kvx-conform run --memory device --gpus 0,1``:
each worker sees its own GPU as device 0 and the next one as device 1); with fewer the
tests skip, naming why.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvx_conformance.abi import buffers
from kvx_conformance.abi.header import DType, Memory, Status
from kvx_conformance.cases import build as cb
from kvx_conformance.cases.checks import verify_gather, verify_write
from kvx_conformance.cases.execute import CallOptions
from kvx_conformance.results.outcomes import RECOMMENDED, ConformanceFailure, Unsupported, conformance

CL_PLACEMENT = "spec 4.3 (memory describes buffer location), 7 (NULL stream); R-PLACEMENT"
HOME, AWAY = 0, 1
REFUSALS = (Status.UNSUPPORTED, Status.INVALID_ARGUMENT)


def _two_gpus():
    import torch

    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip(f"device placement needs 2 GPUs visible to this worker, {n} visible: it runs on a host with "
                    f"2 or more GPUs (kvx-conform run --memory device --gpus 0,1)")
    return torch


def _sync_both(torch, case) -> None:
    for dev in (HOME, AWAY):
        try:
            torch.cuda.synchronize(dev)
        except RuntimeError as e:  # a sticky CUDA error: the call faulted on this device
            raise ConformanceFailure(
                f"a CUDA error on GPU {dev} after the call with buffers on GPU {AWAY}",
                expected="the call runs on the buffers' device (or refuses) and leaves no CUDA error",
                got=str(e).splitlines()[0][:300], clause=CL_PLACEMENT, case=case.describe(), seed=case.seed,
            ) from None


class Bystander:
    """A twin of the cache on GPU 0: the call on GPU 1 must leave it and its guards alone."""

    def __init__(self, cache):
        self.init = {"k": np.ascontiguousarray(cache.k_init), "v": np.ascontiguousarray(cache.v_init)}
        self.bufs = {}
        for i, (side, a) in enumerate(self.init.items()):
            b = buffers.allocate(a.nbytes, Memory.DEVICE, f"GPU {HOME} twin {side} cache", device=HOME, salt=7 + i)
            b.upload(a)
            self.bufs[side] = b

    def check(self, case) -> None:
        bad = []
        for side, b in self.bufs.items():
            bad += b.violations()
            if b.download().tobytes() != self.init[side].view(np.uint8).tobytes():
                bad.append(f"GPU {HOME} twin {side} cache: contents changed")
        if bad:
            raise ConformanceFailure(
                f"memory on GPU {HOME} changed by a call whose buffers are on GPU {AWAY}",
                expected=f"nothing on GPU {HOME} changes", got="; ".join(bad), clause=CL_PLACEMENT,
                case=case.describe(), seed=case.seed)


def _refused(status: int, case) -> None:
    raise Unsupported(f"refused buffers on a GPU other than the current one / the first one used "
                      f"(status {Status(status).name}): {case.describe()}", feature="multi_device")


@conformance("placement.other_gpu", CL_PLACEMENT, RECOMMENDED, "concurrency", ("write", "gather"),
             feature="multi_device")
@pytest.mark.kvx_memory_types("device")  # unified memory has no owning device; host memory none at all
@pytest.mark.parametrize("current", ["other", "buffers"])
@pytest.mark.parametrize("op", ["write", "gather"])
def test_buffers_on_another_gpu(kvx_provider, kvx_call_options, op, current):
    torch = _two_gpus()
    base = kvx_call_options()
    home = CallOptions(memory=base.memory, device=HOME)
    away = CallOptions(memory=base.memory, device=AWAY)
    kind = cb.core_layout(kvx_provider, base.memory)
    cache = cb.simple_cache(cb.GEOM, kind, DType.F16, seed=800)
    if op == "write":
        warm = cb.write_case(cache, cb.spread_slots(cb.GEOM, 10, 801), seed=802, label=f"GPU {HOME} first")
        case = cb.write_case(cache, cb.spread_slots(cb.GEOM, 12, 803), seed=804,
                             label=f"buffers on GPU {AWAY}, current device GPU {AWAY if current == 'buffers' else HOME}")
        verify = verify_write
    else:
        warm = cb.packed_gather(cache, cb.distinct_table(cb.GEOM, 2, 3, 805), [9, 12], 12, seed=806,
                                label=f"GPU {HOME} first")
        case = cb.packed_gather(cache, cb.distinct_table(cb.GEOM, 2, 3, 807), [7, 12], 12, seed=808,
                                label=f"buffers on GPU {AWAY}, current device GPU {AWAY if current == 'buffers' else HOME}")
        verify = verify_gather
    with torch.cuda.device(HOME):
        verify(kvx_provider, warm, home, clause=CL_PLACEMENT)  # the provider's ordinary call on the first GPU
    twin = Bystander(cache)
    with torch.cuda.device(AWAY if current == "buffers" else HOME):
        got = verify(kvx_provider, case, away, clause=CL_PLACEMENT, feature="multi_device",
                     statuses=(Status.OK, Status.INVALID_ARGUMENT))
    _sync_both(torch, case)
    twin.check(case)
    if got.status in REFUSALS:
        _refused(got.status, case)
