"""Run a list of cases in a child process that is replaced when a case leaves it unusable.

``bench``, ``accuracy`` and ``model-eval`` call the provider many times in one process.
A device fault (a sticky CUDA error, :mod:`~kvx_conformance.abi.health`) or a crash in one
case would end or poison everything after it; :func:`isolated_map` runs the cases in a
spawned child instead: after every case the child checks the device, and a case that
faults (or whose process dies) is recorded as such while a fresh child, with a fresh
CUDA context, goes on with the next case.

``fn(state, item)`` and ``setup(*setup_args)`` must be importable module-level
functions (the child is spawned, not forked: a CUDA context does not survive a fork).

:func:`wanted` says when a command isolates (device or unified memory, or the fake
checker of the tests); :func:`failure` turns a case's ``device_fault`` / ``crash`` /
``error`` result into the fields a row records.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
from typing import Any, Callable

from ..abi import health


def wanted(on_device: bool) -> bool:
    """Whether a command runs its provider calls through :func:`isolated_map`: on device or
    unified memory, and on host memory when the fake checker is set (tests of the harness,
    ``KVX_CONFORM_FAKE_DEVICE_FAULT``, :mod:`~kvx_conformance.abi.health`)."""
    return bool(on_device) or bool(os.environ.get(health.FAKE_ENV))


def failure(out) -> dict | None:
    """The fields of a row whose case did not return: ``device_fault`` (error, error_string,
    entry, case) or ``crash`` (how the process ended), and ``error``, one line
    ("device fault: cudaErrorIllegalAddress in kvx_write_kv"). None for a case that returned
    (a result that is not a dict, or one without those keys)."""
    if not isinstance(out, dict):
        return None
    if "device_fault" in out:
        f = out["device_fault"]
        where = f" in {f.get('entry')}" if f.get("entry") else ""
        return {"device_fault": {k: f.get(k) for k in ("error", "error_string", "entry", "case")},
                "error": f"device fault: {f.get('error')}{where}"}
    if "crash" in out:
        c = out["crash"]
        how = c.get("signal") if c.get("kind") == "signal" else f"exit status {c.get('exit_status')}"
        return {"crash": c, "error": f"crash: the process died ({how})"}
    if set(out) == {"error"}:
        return {"error": str(out["error"])}
    return None


def _child(conn, fn, setup, setup_args, items, start, per_call) -> None:
    current = [None]

    def on_fault(fault: health.Fault) -> None:
        conn.send(("fault", current[0], fault.to_dict()))
        conn.close()
        os._exit(health.EXIT_DEVICE_FAULT)

    # per_call: check after every provider call (exact entry point); else once per case
    health.arm(per_call, handler=on_fault)
    try:
        state = setup(*setup_args) if setup is not None else None
    except Exception as e:  # noqa: BLE001 - reported to the parent
        conn.send(("setup-error", f"{type(e).__name__}: {e}"[:500]))
        return
    for i in range(start, len(items)):
        current[0] = i
        conn.send(("start", i))
        try:
            result = fn(state, items[i])
        except health.DeviceFault as e:
            on_fault(e.fault)
        except Exception as e:  # noqa: BLE001 - a case's error, unless the device is gone
            fault = health.check()
            if fault is not None:
                on_fault(fault)
            result = {"error": f"{type(e).__name__}: {e}"[:500]}
        else:
            fault = health.check()
            if fault is not None:
                on_fault(fault)
        conn.send(("done", i, result))
    conn.send(("end",))


def _ended(code: int | None) -> dict:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return {"kind": "signal", "signal": name}
    return {"kind": "exit", "exit_status": code}


def isolated_map(fn: Callable, items: list, *, setup: Callable | None = None, setup_args: tuple = (),
                 per_call: bool = False, on_result: Callable[[int, Any], None] | None = None) -> list:
    """``[fn(state, item) for item in items]`` in child processes. The result of a case that
    left a device fault is ``{"device_fault": {...}}`` (:class:`~kvx_conformance.abi.health.Fault`
    fields), of one whose process died ``{"crash": {"kind": "signal" | "exit", ...}}``;
    ``on_result(index, result)`` is called as each case finishes."""
    ctx = mp.get_context("spawn")
    out: list = [None] * len(items)
    done = [False] * len(items)
    start = 0
    while start < len(items):
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(child, fn, setup, setup_args, items, start, per_call), daemon=True)
        proc.start()
        child.close()
        current, progressed, setup_error = None, False, None
        while True:
            try:
                msg = parent.recv()
            except (EOFError, OSError):
                break
            if msg[0] == "start":
                current, progressed = msg[1], True
            elif msg[0] == "done":
                out[msg[1]], done[msg[1]], current = msg[2], True, None
                if on_result is not None:
                    on_result(msg[1], msg[2])
            elif msg[0] == "fault":
                i = msg[1] if msg[1] is not None else current
                if i is not None:
                    out[i], done[i] = {"device_fault": msg[2]}, True
                    if on_result is not None:
                        on_result(i, out[i])
                current = None
            elif msg[0] == "setup-error":
                setup_error = msg[1]
            elif msg[0] == "end":
                break
        parent.close()
        proc.join()
        if current is not None and not done[current]:
            out[current], done[current] = {"crash": _ended(proc.exitcode)}, True
            if on_result is not None:
                on_result(current, out[current])
        if setup_error is not None or not progressed:
            why = setup_error or f"the case process ended before its first case ({_ended(proc.exitcode)})"
            for i in range(start, len(items)):
                if not done[i]:
                    out[i], done[i] = {"error": f"not run: {why}"}, True
            break
        start = next((i for i in range(start, len(items)) if not done[i]), len(items))
    return out
