"""Collection and metadata: each test's ``kvx`` marker as a record, and the command that reproduces it."""
from __future__ import annotations

import re
import shlex

import pytest

from .config import entry_function, run_config


_PYTEST_K_IDENT = re.compile(r"(:?\w|:|\+|-|\.|\[|\]|\\|/)+")


def item_meta(item: pytest.Item, default_timeout: float | None) -> dict:
    m = item.get_closest_marker("kvx")
    callspec = getattr(item, "callspec", None)
    param = f"[{callspec.id}]" if callspec is not None else ""
    if m is not None:
        kw = dict(m.kwargs)
        base = kw.get("id") or item.name
        entry = kw.get("entry") or ()
        meta = {
            "id": base + param, "clause": str(kw.get("clause", "")), "level": str(kw.get("level", "required")),
            "profile": str(kw.get("profile", "core")),
            "entry": [entry_function(e) for e in ((entry,) if isinstance(entry, str) else entry)],
            "feature": kw.get("feature"), "marked": True, "seeded": bool(kw.get("seeded")),
        }
    else:
        meta = {"id": f"unmarked:{item.nodeid}", "clause": "", "level": "informational", "profile": "(unmarked)",
                "entry": [], "feature": None, "marked": False}
    tm = item.get_closest_marker("timeout")
    timeout = tm.args[0] if tm is not None and tm.args else (tm.kwargs.get("timeout") if tm else default_timeout)
    meta.update(nodeid=item.nodeid, name=item.name, timeout=timeout,
                slow=item.get_closest_marker("slow") is not None)
    return meta


def repro_command(config: pytest.Config, meta: dict, seed: int | None) -> str:
    rc = run_config(config)
    parts = ["kvx-conform", "run"]
    if rc.provider_path is not None:
        parts.append(str(rc.provider_path))
    parts += ["--memory", rc.memory.name.lower()]
    name = meta.get("name") or meta["nodeid"].split("::")[-1]
    if _PYTEST_K_IDENT.fullmatch(name):
        parts += ["-k", name]
    else:
        parts += ["--id", meta["id"]]
    if seed is not None and meta.get("seeded"):  # other tests fix their own seeds (printed in the failure)
        parts += ["--seed", str(seed)]
    cmd = " ".join(shlex.quote(p) for p in parts)
    extra = config.getoption("kvx_repro_extra")
    return f"{cmd} {extra}".strip()
