"""Several GPUs of one host: which GPUs a run uses, which worker gets which, and the binding.

Vocabulary. A *GPU index* is a CUDA ordinal as the process that starts the run sees it
(0 .. count-1, after the ``CUDA_VISIBLE_DEVICES`` it was started with): ``--gpus 0,2``
names two of them, and each test's record names the index of the GPU its worker was
bound to (``tests[].gpu``, docs/results-schema.md).

Binding. A worker is bound to its GPU by the ``CUDA_VISIBLE_DEVICES`` it sets for itself
before anything in it initializes CUDA (:func:`bind_process`, called from the worker's
``pytest_configure``): its own GPU first, then the run's other GPUs in order. The
worker's default device (``cuda:0``, also for threads the provider or a test starts)
is therefore its GPU, while the device-placement tests can still reach a second GPU as
``cuda:1``. The controller hands each worker its GPU through xdist's ``workerinput``
(:class:`Assigner`): workers are spread evenly, and a worker that replaces a crashed
one takes the GPU with the fewest live workers (the crashed worker's, as a rule).

Everything here is plain Python over a given device count: it is tested on machines
without a GPU (tests/test_scale.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

ENV = "CUDA_VISIBLE_DEVICES"
#: what a bound worker also exports: its GPU index in the controller's numbering
ENV_GPU = "KVX_CONFORM_GPU"
WORKERINPUT_KEY = "kvx_gpu"
WORKERINPUT_VISIBLE = "kvx_gpu_visible"


class GpuSpecError(ValueError):
    """A ``--gpus`` value that cannot be used; ``str(e)`` is one line."""


def visible_devices(count: int, env: dict | None = None) -> list[str]:
    """The device names behind indexes 0 .. count-1: the entries of ``CUDA_VISIBLE_DEVICES``
    when it is set (numbers or GPU UUIDs), else the ordinals themselves."""
    env = os.environ if env is None else env
    given = env.get(ENV)
    if given is None or given.strip() == "":
        return [str(i) for i in range(count)]
    names = [x.strip() for x in given.split(",") if x.strip()]
    return names[:count] if count <= len(names) else names


def parse_gpus(spec: str | None, count: int) -> list[int]:
    """``--gpus`` -> GPU indexes: ``None`` / ``"all"`` = every visible GPU; else a comma list of
    indexes and ranges (``0,1``, ``0-3,6``), each at most once, all below ``count``."""
    if spec is None or spec.strip().lower() in ("", "all"):
        return list(range(count))
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            raise GpuSpecError(f"--gpus {spec!r}: empty entry (write e.g. 0,1 or 0-3)")
        try:
            lo, hi = (int(x) for x in part.split("-", 1)) if "-" in part else (int(part), int(part))
        except ValueError:
            raise GpuSpecError(f"--gpus {spec!r}: {part!r} is not a GPU index or range "
                               f"(write e.g. 0,1 or 0-3, or 'all')") from None
        if hi < lo:
            raise GpuSpecError(f"--gpus {spec!r}: range {part} runs backwards")
        out.extend(range(lo, hi + 1))
    bad = [g for g in out if g < 0 or g >= count]
    if bad:
        have = f"GPUs 0-{count - 1}" if count > 1 else ("GPU 0" if count == 1 else "no GPU")
        raise GpuSpecError(f"--gpus {spec!r}: {', '.join(map(str, bad))} not visible here ({have} visible)")
    dups = sorted({g for g in out if out.count(g) > 1})
    if dups:
        raise GpuSpecError(f"--gpus {spec!r}: GPU {', '.join(map(str, dups))} named twice")
    return out


def binding(gpu: int, gpus: list[int], visible: list[str]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a process bound to ``gpu``: it first, then the run's other
    GPUs in order (GPUs the run does not use stay hidden)."""
    if gpu not in gpus:
        raise ValueError(f"GPU {gpu} is not one of the run's GPUs {gpus}")
    order = [gpu] + [g for g in gpus if g != gpu]
    return ",".join(visible[g] for g in order)


def spread(workers: int, gpus: list[int]) -> list[int]:
    """The GPU of each of ``workers`` workers started together: round-robin over ``gpus``."""
    if not gpus:
        return []
    return [gpus[i % len(gpus)] for i in range(workers)]


@dataclass
class Assigner:
    """Workers -> GPUs as workers come and go (xdist replaces a crashed worker with a new id)."""

    gpus: list[int]
    live: dict[str, int] = field(default_factory=dict)
    #: every assignment ever made (replaced workers keep theirs: their tests ran there)
    history: dict[str, int] = field(default_factory=dict)

    def assign(self, worker: str) -> int | None:
        if not self.gpus:
            return None
        if worker in self.live:
            return self.live[worker]
        load = {g: 0 for g in self.gpus}
        for g in self.live.values():
            load[g] = load.get(g, 0) + 1
        gpu = min(self.gpus, key=lambda g: (load[g], self.gpus.index(g)))
        self.live[worker] = gpu
        self.history[worker] = gpu
        return gpu

    def release(self, worker: str) -> None:
        self.live.pop(worker, None)

    def gpu_of(self, worker: str | None) -> int | None:
        return self.history.get(worker) if worker else None


def bind_process(gpu: int, gpus: list[int], visible: list[str], env: dict | None = None) -> list[str]:
    """Bind this process (before it initializes CUDA); returns notes (e.g. CUDA already started)."""
    env = os.environ if env is None else env
    notes = []
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                notes.append(f"CUDA was initialized before the worker was bound to GPU {gpu}: the binding "
                             "has no effect in this process")
        except Exception:  # noqa: BLE001 - a torch without CUDA
            pass
    env[ENV] = binding(gpu, gpus, visible)
    env[ENV_GPU] = str(gpu)
    return notes


def bound_gpu(env: dict | None = None) -> int | None:
    """The GPU index (controller numbering) this process was bound to, or None."""
    env = os.environ if env is None else env
    v = env.get(ENV_GPU)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def device_count_from(info_env: dict | None) -> int:
    """GPU count from a preflight ``environment`` (its subprocess asked torch; this process stays
    without a CUDA context)."""
    t = (info_env or {}).get("torch") or {}
    try:
        return int(t.get("gpu_count") or 0)
    except (TypeError, ValueError):
        return 0


def slow_gpus(figures: dict[int, float | None], tolerance_pct: float = 5.0) -> dict[int, dict]:
    """GPUs whose probe figure (a bandwidth: higher is better) is more than ``tolerance_pct``
    percent below the median of the *other* GPUs' figures. {gpu: {figure, others_median,
    below_pct}} for each flagged GPU; nothing with fewer than two figures."""
    have = {g: float(v) for g, v in figures.items() if v}
    out: dict[int, dict] = {}
    if len(have) < 2:
        return out
    for g, v in sorted(have.items()):
        others = sorted(x for h, x in have.items() if h != g)
        n = len(others)
        med = others[n // 2] if n % 2 else 0.5 * (others[n // 2 - 1] + others[n // 2])
        below = 100.0 * (med - v) / med
        if below > tolerance_pct:
            out[g] = {"figure": v, "others_median": med, "below_pct": round(below, 2)}
    return out
