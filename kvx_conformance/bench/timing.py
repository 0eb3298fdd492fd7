"""Timers. Device: CUDA events over back-to-back calls, CUDA-graph replay, host call cost.

Every timer takes ``fn(i, stream)`` that issues call ``i`` (rotating over input sets)
on ``stream`` (an int, the ``cudaStream_t``; the KVX ``stream`` argument) and returns
a KVX status (0 = OK; torch peers return 0).

- ``events``: warm-up, then ``repeats`` rounds of ``inner`` calls back to back between
  two CUDA events; per-call time = round time / inner. Eager launches: for small calls
  this includes the host's launch gaps.
- ``graph``: the same ``inner`` calls captured once into a CUDA graph (torch.cuda.graphs,
  the capture stream passed as the KVX stream), replayed ``replays`` times per round
  between events: the device time without host gaps.
- ``host``: the host wall time of one call (``time.perf_counter`` over ``inner`` calls,
  no synchronization inside), i.e. what a caller's thread pays per call.
- ``graph_warm`` (the decode preset): ``calls`` calls on one input set captured in one CUDA
  graph, replayed warm; per-call time = replay time / ``calls``. The floor it is held
  against is :class:`EmptyKernel`, an empty kernel launched ``calls`` times in a graph and
  replayed the same way (``DeviceTimer.floor``), in each of its launch forms the device runs
  (plain, and overlapping the launch before it): the faster.

Statistics (``stats``): median, p10, p90, mean, min, max and coefficient of variation
(stdev / mean) of the per-call times of the rounds.
"""
from __future__ import annotations

import ctypes
import math
import statistics
import time


def stats(samples_s: list[float]) -> dict:
    xs = sorted(samples_s)
    n = len(xs)

    def q(p: float) -> float:
        if n == 1:
            return xs[0]
        k = (n - 1) * p
        lo, hi = math.floor(k), math.ceil(k)
        return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

    mean = sum(xs) / n
    sd = statistics.stdev(xs) if n > 1 else 0.0
    return {"median_s": q(0.5), "p10_s": q(0.1), "p90_s": q(0.9), "mean_s": mean, "min_s": xs[0],
            "max_s": xs[-1], "cv": (sd / mean) if mean > 0 else 0.0, "rounds": n}


class CallFailed(RuntimeError):
    pass


def _check(st) -> None:
    if st not in (0, None):
        raise CallFailed(f"call returned status {st}")


class DeviceTimer:
    def __init__(self, repeats: int = 11, target_round_s: float = 2e-3, max_inner: int = 256):
        import torch

        self.torch = torch
        self.repeats = repeats
        self.target = target_round_s
        self.max_inner = max_inner
        self.stream = torch.cuda.Stream()

    def _events_round(self, fn, inner: int, offset: int = 0) -> tuple[float, float]:
        t = self.torch
        s = self.stream
        start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        with t.cuda.stream(s):
            start.record(s)
            h0 = time.perf_counter()
            for i in range(inner):
                _check(fn(offset + i, s.cuda_stream))
            h1 = time.perf_counter()
            end.record(s)
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / inner, (h1 - h0) / inner

    def plan(self, fn, nsets: int) -> tuple[int, float]:
        """Warm up and pick ``inner`` (a multiple of nsets) so a round lasts about target_round_s."""
        for i in range(max(2, nsets)):
            _check(fn(i, self.stream.cuda_stream))
        self.torch.cuda.synchronize()
        est, _ = self._events_round(fn, nsets)
        k = max(1, math.ceil(self.target / max(est * nsets, 1e-7)))
        inner = nsets * k
        if inner > self.max_inner:
            inner = max(nsets, (self.max_inner // nsets) * nsets)
        return inner, est

    def events(self, fn, inner: int, before_last=None) -> tuple[dict, dict]:
        """``repeats`` timed rounds; ``before_last()`` runs (untimed) before the last one (the bench
        poisons the verified results there, so that what it verifies is a timed round's work)."""
        dev, host = [], []
        for r in range(self.repeats):
            if before_last is not None and r == self.repeats - 1:
                before_last()
            d, h = self._events_round(fn, inner)
            dev.append(d)
            host.append(h)
        return stats(dev), stats(host)

    def _captured(self, issue, before_replay=None):
        """A CUDA graph of what ``issue(stream)`` enqueues on the timer's stream (``stream``: the int
        handle); ``before_replay()`` runs once it is captured, before any replay (the bench poisons
        the results it verifies there: what it reads afterwards is then the graph's work, not work
        a call did outside the graph while it was captured)."""
        g = self.torch.cuda.CUDAGraph()
        s = self.stream
        s.synchronize()
        with self.torch.cuda.graph(g, stream=s):
            issue(s.cuda_stream)
        if before_replay is not None:
            s.synchronize()
            before_replay()
        return g

    def graph(self, fn, nsets: int, inner: int, before_replay=None) -> dict:
        def issue(stream: int) -> None:
            for i in range(nsets):
                _check(fn(i, stream))

        g = self._captured(issue, before_replay)
        replays = max(1, inner // nsets)
        g.replay()
        self.torch.cuda.synchronize()
        out = self._replay_rounds(g, replays, nsets)
        del g
        return stats(out)

    def _replay_rounds(self, g, replays: int, calls: int) -> list[float]:
        """Seconds per call, one figure per round: ``self.repeats`` rounds of ``replays``
        back-to-back replays of ``g``, which holds ``calls`` calls, between two events."""
        t, s = self.torch, self.stream
        out = []
        for _ in range(self.repeats):
            start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            with t.cuda.stream(s):
                start.record(s)
                for _ in range(replays):
                    g.replay()
                end.record(s)
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3 / (replays * calls))
        return out

    def _warm_rounds(self, g, calls: int) -> dict:
        t = self.torch
        s = self.stream
        for _ in range(3):
            g.replay()
        s.synchronize()
        a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        with t.cuda.stream(s):
            a.record(s)
            g.replay()
            b.record(s)
        b.synchronize()
        replays = max(1, min(200, math.ceil(self.target / max(a.elapsed_time(b) / 1e3, 1e-7))))
        st = stats(self._replay_rounds(g, replays, calls))
        st["calls_per_graph"] = calls
        st["replays_per_round"] = replays
        return st

    def graph_warm(self, fn, calls: int, before_replay=None) -> dict:
        """``calls`` calls on input set 0 captured in one graph, replayed warm: device time per call."""
        def issue(stream: int) -> None:
            for _ in range(calls):
                _check(fn(0, stream))

        g = self._captured(issue, before_replay)
        st = self._warm_rounds(g, calls)
        del g
        return st

    def floor(self, calls: int) -> dict:
        """The decode floor: an empty kernel launched ``calls`` times in one graph, replayed like graph_warm.
        Each form of :class:`EmptyKernel` the device runs is timed (plain launches, and on compute
        capability 9.0 or more launches that may overlap the one before them); the floor is the faster,
        its statistics with ``what`` naming it and ``methods`` every form's median."""
        forms = [False] + ([True] if EmptyKernel.dependent_capable() else [])
        best, methods = None, {}
        for dependent in forms:
            k = EmptyKernel(dependent)

            def issue(stream: int, k=k) -> None:
                for _ in range(calls):
                    k.launch(stream)

            g = self._captured(issue)
            st = self._warm_rounds(g, calls)
            del g
            st["what"] = k.what
            methods[k.what] = st["median_s"]
            if best is None or st["median_s"] < best["median_s"]:
                best = st
        best["methods"] = methods
        return best


class EmptyKernel:
    """A kernel that does nothing (``ret``), from PTX through the CUDA driver API (libcuda, by ctypes):
    no compiler, no framework kernel, so the floor is the same whichever torch build runs it.

    ``dependent``: the form for launches that may overlap the kernel before them in the stream
    (programmatic dependent launch, compute capability 9.0 or more, as a provider's kernels may be
    launched): the kernel lets the next launch proceed at once (``griddepcontrol.launch_dependents``)
    and is launched with the programmatic stream serialization attribute (``cuLaunchKernelEx``)."""

    PTX = b".version 6.0\n.target sm_50\n.address_size 64\n.visible .entry kvx_bench_empty()\n{\n\tret;\n}\n\0"
    PTX_DEPENDENT = (b".version 7.8\n.target sm_90\n.address_size 64\n.visible .entry kvx_bench_empty()\n{\n"
                     b"\tgriddepcontrol.launch_dependents;\n\tret;\n}\n\0")
    WHAT = "empty kernel (PTX `ret`), grid 1 x 32 threads, no parameters, cuLaunchKernel"
    WHAT_DEPENDENT = ("empty kernel (PTX `griddepcontrol.launch_dependents; ret`), grid 1 x 32 threads, no parameters, "
                      "cuLaunchKernelEx with programmatic stream serialization")
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
    _fns: dict = {}
    _lib = None

    @staticmethod
    def dependent_capable() -> bool:
        import torch

        return torch.cuda.get_device_capability()[0] >= 9

    def __init__(self, dependent: bool = False):
        import torch

        torch.cuda.synchronize()  # the runtime's primary context is current on this thread
        cls = type(self)
        self.dependent = dependent
        self.what = self.WHAT_DEPENDENT if dependent else self.WHAT
        if cls._lib is None:
            cls._lib = ctypes.CDLL("libcuda.so.1")
        if dependent not in cls._fns:
            lib = cls._lib
            mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
            st = lib.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(self.PTX_DEPENDENT if dependent else self.PTX))
            if st != 0:
                raise RuntimeError(f"cuModuleLoadData of the empty kernel failed: CUresult {st}")
            st = lib.cuModuleGetFunction(ctypes.byref(fn), mod, b"kvx_bench_empty")
            if st != 0:
                raise RuntimeError(f"cuModuleGetFunction failed: CUresult {st}")
            cls._fns[dependent] = fn
        self._fn = cls._fns[dependent]

    def launch(self, stream: int) -> None:
        if self.dependent:
            cfg = _launch_config(stream, self.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
            st = self._lib.cuLaunchKernelEx(ctypes.byref(cfg), self._fn, None, None)
        else:
            st = self._lib.cuLaunchKernel(self._fn, 1, 1, 1, 32, 1, 1, 0, ctypes.c_void_p(stream), None, None)
        if st != 0:
            raise RuntimeError(f"launching the empty kernel failed: CUresult {st}")


class _CuLaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute`` (cuda.h): the id, 4 bytes of padding, a 64-byte value union (here an int)."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int), ("rest", ctypes.c_char * 60)]


class _CuLaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (cuda.h)."""
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_CuLaunchAttribute)),
                ("num_attrs", ctypes.c_uint)]


def _launch_config(stream: int, attribute: int) -> _CuLaunchConfig:
    """A launch of grid 1 x 32 threads on ``stream`` with one launch attribute set to 1."""
    attr = _CuLaunchAttribute(id=attribute, value=1)
    cfg = _CuLaunchConfig((1, 1, 1), (32, 1, 1), 0, ctypes.c_void_p(stream), ctypes.pointer(attr), 1)
    cfg._keep = attr  # the attribute lives as long as the config
    return cfg


def device_copy_roofline(nbytes: int = 1 << 30, repeats: int = 20) -> dict:
    """The best of several device-to-device copies of ``nbytes`` (:mod:`.copies`: ``copy_``,
    ``cudaMemcpyAsync``, the copy kernel's variants), measured in the same rounds on the torch
    current stream: each round times every method once between its own CUDA events, the order
    rotating from round to round; ``repeats`` rounds. Bandwidth counts bytes read plus written.
    Each method's copy is then verified (destination cleared, one copy, compared with the source).
    Returns :func:`.copies.roofline`'s record: the winner's figures and every method's."""
    import torch

    from . import copies

    gen = torch.Generator(device="cuda")  # its own generator: independent of any graph capture's RNG state
    gen.manual_seed(12345)
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda", generator=gen)
    dst = torch.empty_like(src)
    notes: list[str] = []
    lib, why = copies.load_library()
    if lib is None:
        notes.append(f"cudaMemcpyAsync and the copy kernel not measured: {why}; the roofline is copy_ alone")
    try:
        lib_methods = copies.methods(lib, dst.data_ptr())
    except RuntimeError as e:  # the library is there but cannot plan on this device
        notes.append(f"{copies.LIBRARY} could not plan its kernel ({e}): copy_ alone")
        lib_methods = []

    def torch_copy(d: int, s_: int, n: int, st: int) -> int:
        dst.copy_(src)  # on the current stream, as the library's calls
        return 0

    ms = [copies.Method("copy_", "copy_", copies.COPY_, torch_copy)] + lib_methods
    errors: dict[str, str] = {}
    stream = torch.cuda.current_stream()
    sp, dp, h = src.data_ptr(), dst.data_ptr(), stream.cuda_stream

    def call(m) -> None:
        st = m.call(dp, sp, nbytes, h)
        if st:
            raise RuntimeError(f"{lib.error(st) if lib else st} (cudaError {st})")

    live = []
    for m in ms:  # warm-up; a method that fails is recorded and left out
        try:
            for _ in range(3):
                call(m)
            torch.cuda.synchronize()
            live.append(m)
        except Exception as e:
            errors[m.id] = f"{type(e).__name__}: {e}"[:300]
            torch.cuda.synchronize()
    times: dict[str, list[float]] = {m.id: [] for m in live}
    for r in range(repeats):
        order = live[r % len(live):] + live[:r % len(live)] if live else []
        evs = []
        for m in order:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(stream)
            try:
                call(m)
            except Exception as e:  # failed after its warm-up: recorded, left out from here on
                errors[m.id] = f"{type(e).__name__}: {e}"[:300]
                live.remove(m)
                times.pop(m.id)
                continue
            b.record(stream)
            evs.append((m.id, a, b))
        torch.cuda.synchronize()
        for mid, a, b in evs:
            times[mid].append(a.elapsed_time(b) / 1e3)
    verified: dict[str, bool] = {}
    for m in live:
        dst.zero_()
        try:
            call(m)
        except Exception as e:
            errors[m.id] = f"verification copy: {type(e).__name__}: {e}"[:300]
            verified[m.id] = False
            continue
        torch.cuda.synchronize()
        verified[m.id] = bool(torch.equal(src, dst))
    del src, dst
    torch.cuda.empty_cache()
    entries = [copies.figure(m.id, m.what, nbytes, stats(times[m.id]) if times.get(m.id) else None,
                             verified.get(m.id), errors.get(m.id)) for m in ms]
    for e, m in zip(entries, ms):
        if m.variant:
            e["variant"] = m.variant
    out = [e for e, m in zip(entries, ms) if m.group != "copy_kernel"]
    variants = [e for e, m in zip(entries, ms) if m.group == "copy_kernel"]
    if variants:
        out.append(copies.group_entry("copy_kernel", variants))
    return copies.roofline(out, nbytes, notes, str(lib.path) if lib else None)
