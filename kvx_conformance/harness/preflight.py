"""Preflight: load a provider in a throw-away process and describe it.

``python -m kvx_conformance.harness.preflight PATH [--memory-check] [--jsonl]`` loads PATH with
ctypes, asks its version, lists its entry points, probes the struct sizes it accepts
(the smallest ``size`` each entry point takes, found by bisection over a valid minimal
call) and which memory types it serves, and prints one JSON object (or, with
``--jsonl``, one object per stage as it goes, so that a provider which crashes half-way
still leaves the stages before the crash).

The CLI always runs this in a subprocess (:func:`run_preflight`): a provider that
crashes or hangs in ``dlopen`` or ``kvx_get_version`` gives a one-line error and
``EXIT_PROVIDER_CRASHED``, never a dead CLI.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from .. import __version__
from ..abi import header as abi
from ..abi.loader import (
    ENTRY_POINTS,
    EXIT_PROVIDER_CRASHED,
    Provider,
    ProviderLoadError,
    load_provider,
    sha256_of,
    status_name,
)

# ----------------------------------------------------------------------------- environment


def environment(with_torch: bool = True) -> dict:
    """Python, platform, CPU and (when importable) torch/GPU of this machine."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    env = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch": None,
    }
    if with_torch and importlib.util.find_spec("torch") is not None:
        try:
            import torch

            t = {"version": torch.__version__, "cuda": torch.version.cuda, "gpu": None}
            if torch.cuda.is_available():
                t["gpu"] = torch.cuda.get_device_name(0)
                t["gpu_count"] = torch.cuda.device_count()
            env["torch"] = t
        except Exception as e:  # a broken torch install must not stop a run
            env["torch"] = {"error": f"{type(e).__name__}: {e}"}
    return env


# ----------------------------------------------------------------------------- struct size probes


#: (entry point, override path, struct type) probed for each entry point
PROBES: dict[str, list[tuple[str, str]]] = {
    "kvx_get_version": [("version", "kvx_version_t")],
    "kvx_validate_cache_desc": [("cache", "kvx_cache_desc_t"), ("cache.k", "kvx_tensor_desc_t"),
                                ("cache.v", "kvx_tensor_desc_t")],
    "kvx_write_kv": [("desc", "kvx_write_desc_t"), ("desc.io", "kvx_kv_io_desc_t"),
                     ("desc.io.key", "kvx_tensor_desc_t"), ("desc.io.value", "kvx_tensor_desc_t"),
                     ("desc.slots", "kvx_slot_mapping_t"), ("desc.k_scale_desc", "kvx_scale_desc_t"),
                     ("cache", "kvx_cache_desc_t")],
    "kvx_gather_kv": [("desc", "kvx_gather_desc_t"), ("desc.io", "kvx_kv_io_desc_t"),
                      ("desc.io.key", "kvx_tensor_desc_t"), ("desc.block_table", "kvx_block_table_t"),
                      ("desc.seq_lens", "kvx_seq_lens_t")],
}


def smallest_accepted(accepts: Callable[[int], bool], full: int) -> int | None:
    """The smallest ``size`` in [0, full] that ``accepts`` (bisection; None if ``full`` is refused)."""
    if not accepts(full):
        return None
    lo, hi = 0, full
    while lo < hi:
        mid = (lo + hi) // 2
        if accepts(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def probe_entry(provider: Provider, entry: str, memory: abi.Memory = abi.Memory.HOST) -> dict:
    """Probe the sizes ``entry`` accepts; returns {"baseline": status, "layout", "fields": [...]}."""
    from ..cases import build as cb
    from ..cases import execute

    if entry == "kvx_get_version":
        def accepts_version(size: int) -> bool:
            v = abi.kvx_version_t.new()
            v.size = size
            return provider.get_version_raw(v) == abi.Status.OK

        full = abi.V1_1_SIZES["kvx_version_t"]
        return {"baseline": "OK", "layout": None, "fields": [
            {"field": "version", "struct": "kvx_version_t", "accepts_from": smallest_accepted(accepts_version, full),
             "header": full}]}

    opts = execute.CallOptions(memory=memory)
    run = {"kvx_validate_cache_desc": execute.run_validate, "kvx_write_kv": execute.run_write,
           "kvx_gather_kv": execute.run_gather}[entry]
    pick = {"kvx_validate_cache_desc": 0, "kvx_write_kv": 1, "kvx_gather_kv": 2}[entry]
    baseline, chosen = None, None
    for layout in (abi.Layout.BLOCK_NHD, abi.Layout.BLOCK_HND):
        case = cb.tiny_calls(layout, abi.DType.F32, seed=80, label="preflight")[pick]
        st = run(provider, case, opts).status
        baseline = st
        if st == abi.Status.OK:
            chosen = case
            break
    result = {"baseline": status_name(baseline), "layout": None if chosen is None else
              ("BLOCK_NHD" if chosen.cache.k.layout == abi.Layout.BLOCK_NHD else "BLOCK_HND"), "fields": []}
    for path, struct in PROBES[entry]:
        full = abi.V1_1_SIZES[struct]
        row = {"field": path, "struct": struct, "accepts_from": None, "header": full}
        if chosen is not None:
            def accepts(size: int, path=path) -> bool:
                chosen.c_overrides = {f"{path}.size": size}
                try:
                    return run(provider, chosen, opts).status == abi.Status.OK
                finally:
                    chosen.c_overrides = {}
            row["accepts_from"] = smallest_accepted(accepts, full)
        result["fields"].append(row)
    return result


def memory_support(provider: Provider) -> dict[str, str]:
    """For each memory type: whether the provider serves it (``served.memory_answer``: "OK" where a tiny
    valid validate and write on it are both answered OK, else the answer that was not, as
    ``"UNSUPPORTED (write; validate OK)"``), or why it cannot be tried here. A host-only provider may
    validate a device-memory cache OK; a run on device memory (``--memory auto`` on a GPU machine) would
    then read every valid call's refusal as a failure."""
    from ..abi import buffers
    from ..cases.served import memory_answer

    out: dict[str, str] = {}
    for mem in (abi.Memory.HOST, abi.Memory.DEVICE, abi.Memory.UNIFIED):
        reason = buffers.memory_available(mem)
        if reason:
            out[mem.name.lower()] = f"unavailable here: {reason}"
            continue
        try:
            out[mem.name.lower()] = memory_answer(provider, mem)
        except Exception as e:  # buffer allocation failures are facts about the machine
            out[mem.name.lower()] = f"unavailable here: {type(e).__name__}: {e}"
    return out


# ----------------------------------------------------------------------------- stages


def stages(path: str, *, probe: bool = True, memory_check: bool = False, memory: str = "host",
           skip: tuple[str, ...] = (), with_environment: bool = True) -> Iterator[dict]:
    """Yield one dict per stage; a load error yields ``{"stage": "error", ...}`` and stops.

    ``skip`` names entry points not to probe (they crashed or hung in an earlier attempt).
    """
    yield {"stage": "start", "path": os.path.abspath(path), "harness_version": __version__}
    if with_environment:
        yield {"stage": "environment", "environment": environment()}
    yield {"stage": "loading"}
    try:
        provider = load_provider(path, negotiate=False)
    except ProviderLoadError as e:
        yield {"stage": "error", "error": str(e), "exit_code": e.exit_code}
        return
    yield {"stage": "load", "sha256": provider.sha256,
           "symbols": {name: hasattr(provider.lib, name) for name in ENTRY_POINTS}}
    v = abi.kvx_version_t.new()
    st = provider.get_version_raw(v)
    yield {"stage": "version_raw", "status": status_name(st), "size_set": int(v.size)}
    try:
        ver = provider.negotiate()
    except ProviderLoadError as e:
        yield {"stage": "error", "error": str(e), "exit_code": e.exit_code}
        return
    yield {"stage": "version", "abi_version": str(ver), "abi": [ver.major, ver.minor, ver.patch]}
    mem = abi.Memory[memory.upper()]
    if probe:
        for entry in ENTRY_POINTS:
            if entry in skip:
                continue
            yield {"stage": "probing", "entry": entry}
            try:
                yield {"stage": "probe", "entry": entry, **probe_entry(provider, entry, mem)}
            except Exception as e:  # a harness-side failure to build the case: report, keep going
                yield {"stage": "probe", "entry": entry, "error": f"{type(e).__name__}: {e}", "fields": []}
    if memory_check and "memory types" not in skip:
        yield {"stage": "probing", "entry": "memory types"}
        yield {"stage": "memory", "memory_support": memory_support(provider)}
    yield {"stage": "done"}


# ----------------------------------------------------------------------------- the parent side


@dataclass
class PreflightInfo:
    path: str
    sha256: str = ""
    abi_version: str = ""
    abi: list[int] = field(default_factory=list)
    symbols: dict[str, bool] = field(default_factory=dict)
    version_size_set: int | None = None
    struct_sizes: dict[str, dict] = field(default_factory=dict)  # entry -> probe result
    header_sizes: dict[str, int] = field(default_factory=lambda: dict(abi.V1_1_SIZES))
    memory_support: dict[str, str] = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def size_findings(self) -> list[str]:
        """Entry points that accept a struct smaller than its v1.1 sizeof."""
        out = []
        for entry, res in self.struct_sizes.items():
            for row in res.get("fields", []):
                got = row.get("accepts_from")
                if got is not None and got < row["header"]:
                    out.append(f"{entry} accepts {row['field']}.size = {got} < sizeof({row['struct']}) = {row['header']}")
        return out


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


#: bytes of the child's stderr kept for messages (the rest is read and dropped)
STDERR_TAIL_BYTES = 64 * 1024


def _run_stages(cmd: list[str], deadline_for: Callable[[str], float]) -> tuple[list[dict], str, str]:
    """Run the preflight subprocess, stopping it when one stage takes longer than its deadline.

    Both pipes are drained while the child runs (a provider that prints megabytes never
    blocks on a full pipe, and its output never counts as an answer); only the last
    :data:`STDERR_TAIL_BYTES` of stderr are kept. Returns (stages, how it ended: "ok" /
    "crashed (SIGSEGV)" / "crashed (exited with status N)" / "hung (no answer in N s)",
    last stderr line). "ok" needs exit status 0 *and* the final stage: a child that
    exits, even with status 0, before it has answered everything has crashed.
    """
    import selectors

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    got: list[dict] = []
    buf = b""
    err = bytearray()
    stage = "start"
    limit = deadline_for(stage)
    t_stage = time.monotonic()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")
    ended = None
    try:
        while sel.get_map():
            left = limit - (time.monotonic() - t_stage)
            if left <= 0:
                proc.kill()
                ended = f"hung (no answer in {limit:.0f} s)"
                break
            for key, _ in sel.select(timeout=min(left, 0.5)):  # (EOF, when the process ends, is readable)
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                if key.data == "err":
                    err += chunk
                    if len(err) > 2 * STDERR_TAIL_BYTES:
                        del err[:-STDERR_TAIL_BYTES]
                    continue
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    try:
                        st = json.loads(line)
                    except ValueError:
                        continue
                    got.append(st)
                    stage = st.get("stage", stage)
                    limit, t_stage = deadline_for(stage), time.monotonic()
    finally:
        sel.close()
    try:
        rc = proc.wait(timeout=max(1.0, limit - (time.monotonic() - t_stage)))
    except subprocess.TimeoutExpired:  # pipes closed, process still there
        proc.kill()
        rc = proc.wait()
        ended = ended or f"hung (no answer in {limit:.0f} s)"
    for f in (proc.stdout, proc.stderr):
        if f:
            f.close()
    finished = bool(got) and got[-1].get("stage") == "done"
    if ended is None:
        if rc < 0:
            ended = f"crashed ({_signal_name(rc)})"
        elif rc != 0 or not finished:
            ended = f"crashed (exited with status {rc})"
        else:
            ended = "ok"
    text = bytes(err[-STDERR_TAIL_BYTES:]).decode("utf-8", "replace").strip()
    tail = text.splitlines()[-1][:200] if text else ""
    return got, ended, tail


def run_preflight(path: str, *, timeout: float = 30.0, probe: bool = True, memory_check: bool = False,
                  memory: str = "host", python: str | None = None) -> PreflightInfo:
    """Run the preflight in a subprocess; raise ProviderLoadError (one line, exit code) when unusable.

    ``timeout`` bounds loading + kvx_get_version (at least 5 s) and each entry point's probe
    (at most 10 s). A provider that crashes or hangs while an entry point is probed is
    noted in ``warnings`` and the probe goes on, in a fresh process, without that entry point.
    """
    load_limit = max(5.0, float(timeout))
    probe_limit = min(10.0, max(2.0, float(timeout)))

    def deadline_for(stage: str) -> float:
        if stage == "start":
            return 120.0  # importing numpy (and torch, when installed) for the environment
        if stage in ("environment", "loading", "load", "version_raw"):
            return load_limit
        return probe_limit

    info = PreflightInfo(path=os.path.abspath(path))
    t0 = time.monotonic()
    skip: list[str] = []
    name = os.path.basename(str(path))
    for _attempt in range(len(ENTRY_POINTS) + 2):
        cmd = [python or sys.executable, "-m", "kvx_conformance.harness.preflight", str(path), "--jsonl", "--memory", memory]
        if not probe:
            cmd.append("--no-probe")
        if memory_check:
            cmd.append("--memory-check")
        if skip:
            cmd += ["--skip", ",".join(skip), "--no-environment"]
        got, ended, err_tail = _run_stages(cmd, deadline_for)
        last_stage, in_flight = "start", None
        for st in got:
            last_stage = st.get("stage", last_stage)
            if last_stage == "error":
                raise ProviderLoadError(st["error"], st["exit_code"])
            if last_stage == "environment":
                info.environment = st["environment"]
            elif last_stage == "load":
                info.sha256, info.symbols = st["sha256"], st["symbols"]
            elif last_stage == "version_raw":
                info.version_size_set = st["size_set"]
            elif last_stage == "version":
                info.abi_version, info.abi = st["abi_version"], st["abi"]
            elif last_stage == "probing":
                in_flight = st["entry"]
            elif last_stage == "probe":
                info.struct_sizes[st["entry"]] = {k: v for k, v in st.items() if k not in ("stage", "entry")}
                in_flight = None
            elif last_stage == "memory":
                info.memory_support = st["memory_support"]
                in_flight = None
        if last_stage == "done" and ended == "ok":
            break
        if last_stage in ("start", "environment"):
            if ended.startswith("hung"):
                raise ProviderLoadError(f"preflight of {name} did not start ({ended})", EXIT_PROVIDER_CRASHED)
            raise ProviderLoadError(f"preflight of {name} failed before loading it ({ended}"
                                    f"{': ' + err_tail if err_tail else ''})", EXIT_PROVIDER_CRASHED)
        if last_stage in ("loading", "load", "version_raw"):
            where = "while being loaded" if last_stage == "loading" else "in kvx_get_version"
            tail = f": {err_tail}" if err_tail and "exited" in ended else ""
            raise ProviderLoadError(f"provider {name} {ended} {where}{tail}", EXIT_PROVIDER_CRASHED)
        # loaded and negotiated: a crash or hang while probing is a finding, not a load failure
        culprit = in_flight or "struct sizes"
        info.warnings.append(f"preflight: provider {ended} while probing {culprit}")
        if in_flight is None or in_flight in skip:
            break
        if in_flight in ENTRY_POINTS:
            info.struct_sizes[in_flight] = {"baseline": None, "layout": None, "fields": [], "error": ended}
        elif in_flight == "memory types":
            info.memory_support = {"host": f"not probed: provider {ended}"}
        skip.append(in_flight)
    info.seconds = round(time.monotonic() - t0, 3)
    return info


# ----------------------------------------------------------------------------- module entry point


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvx_conformance.harness.preflight",
                                 description="Load a KVX provider and describe it as JSON (run me in a subprocess).")
    ap.add_argument("provider")
    ap.add_argument("--jsonl", action="store_true", help="one JSON object per stage, flushed as it goes")
    ap.add_argument("--no-probe", action="store_true", help="skip struct size probing")
    ap.add_argument("--memory-check", action="store_true", help="also try each memory type")
    ap.add_argument("--memory", default="host", choices=["host", "device", "unified"],
                    help="memory type of the probing calls (default host)")
    ap.add_argument("--skip", default="", help="comma-separated entry points not to probe")
    ap.add_argument("--no-environment", action="store_true", help="do not describe the machine")
    a = ap.parse_args(argv)
    out = sys.stdout
    if a.jsonl:
        # The stages travel on a private copy of stdout; whatever else writes to fd 1 (the
        # provider's printf, a library's banner) goes to stderr, which the parent drains.
        out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
        sys.stdout.flush()
        os.dup2(2, 1)
    merged: dict = {}
    skip = tuple(x for x in a.skip.split(",") if x)
    for st in stages(a.provider, probe=not a.no_probe, memory_check=a.memory_check, memory=a.memory, skip=skip,
                     with_environment=not a.no_environment):
        if a.jsonl:
            print(json.dumps(st), file=out, flush=True)
        else:
            kind = st.pop("stage")
            if kind == "probe":
                merged.setdefault("struct_sizes", {})[st.pop("entry")] = st
            elif kind not in ("probing", "loading"):
                merged.update(st)
    if not a.jsonl:
        merged["header_sizes"] = dict(abi.V1_1_SIZES)
        print(json.dumps(merged, indent=1))
        return int(merged.get("exit_code", 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ----------------------------------------------------------------------------- console form


def format_info(info: PreflightInfo) -> list[str]:
    """Human lines: version, entry points, struct sizes (provider vs header), memory support."""
    lines = [
        f"provider     {info.path}",
        f"sha256       {info.sha256}",
        f"ABI version  {info.abi_version}   (kvx_get_version set size = {info.version_size_set})",
        "entry points " + "  ".join(f"{n} {'ok' if ok else 'MISSING'}" for n, ok in info.symbols.items()),
    ]
    if info.struct_sizes:
        lines.append("struct sizes (smallest `size` the provider accepts / v1.1 header sizeof):")
        for entry, res in info.struct_sizes.items():
            if res.get("error"):
                lines.append(f"  {entry:<24} not probed: {res['error']}")
                continue
            for row in res.get("fields", []):
                got, hdr = row.get("accepts_from"), row["header"]
                if got is None:
                    verdict = f"not probed (a valid call answered {res.get('baseline')})"
                    got_s = "-"
                else:
                    got_s = str(got)
                    verdict = "ok" if got == hdr else ("ACCEPTS SMALLER" if got < hdr else "needs larger")
                lines.append(f"  {entry:<24} {row['field']:<18} {row['struct']:<20} {got_s:>5} / {hdr:<5} {verdict}")
    if info.memory_support:
        lines.append("memory types " + "  ".join(f"{k}: {v}" for k, v in info.memory_support.items()))
    lines += [f"warning: {w}" for w in info.warnings]
    return lines
