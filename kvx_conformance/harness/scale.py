"""``kvx-conform run`` options for GPUs and shards: checked and planned before pytest starts.

The run's process never initializes CUDA: the GPU count comes from the preflight
subprocess (``environment.torch.gpu_count``). The plan is handed to the plugin as
``--kvx-gpus`` / ``--kvx-gpu-visible`` (kvx_conformance/harness/plugin/scale.py binds each worker).
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from ..abi import gpus as _gpus
from ..results.shards import ShardSpecError, parse_shard


def check_run_options(args: argparse.Namespace) -> str | None:
    """One line when --shard / --durations-from / --gpus are malformed, else None."""
    shard = getattr(args, "shard", None)
    if shard:
        try:
            parse_shard(shard)
        except ShardSpecError as e:
            return str(e)
    dur = getattr(args, "durations_from", None)
    if dur and not shard:
        return "--durations-from balances shards: give --shard K/N with it"
    if dur and not os.path.isfile(dur):
        return f"--durations-from {dur}: file not found"
    return None


@dataclass
class GpuPlan:
    gpus: list[int] | None = None
    visible: list[str] = field(default_factory=list)
    workers: int = 1
    notes: list[str] = field(default_factory=list)

    def pytest_args(self) -> list[str]:
        if not self.gpus:
            return []
        return ["--kvx-gpus", ",".join(map(str, self.gpus)), "--kvx-gpu-visible", ",".join(self.visible)]


def plan_gpus(args: argparse.Namespace, memory: str, preflight_env: dict | None, workers: int,
              env: dict | None = None) -> GpuPlan:
    """Which GPUs the workers use. Raises ValueError (one line) for an unusable --gpus."""
    spec = getattr(args, "gpus", None)
    plan = GpuPlan(workers=workers)
    if memory == "host":
        if spec:
            plan.notes.append("--gpus is ignored on host memory (no test touches a GPU)")
        return plan
    count = _gpus.device_count_from(preflight_env)
    if count == 0:
        if spec:
            raise ValueError(f"--gpus {spec}: no GPU is visible here (torch reports none)")
        return plan
    chosen = _gpus.parse_gpus(spec, count)
    plan.gpus = chosen
    plan.visible = _gpus.visible_devices(count, env)
    if getattr(args, "workers", None) is None and len(chosen) > workers:
        plan.workers = len(chosen)
    if len(chosen) > 1 or spec:
        per = _gpus.spread(plan.workers, chosen)
        idle = [g for g in chosen if g not in per]
        plan.notes.append(f"GPUs {','.join(map(str, chosen))}: {plan.workers} worker(s), each bound to one "
                          f"(CUDA_VISIBLE_DEVICES: its GPU first)"
                          + (f"; GPU(s) {','.join(map(str, idle))} get no worker (raise -n)" if idle else ""))
    return plan
