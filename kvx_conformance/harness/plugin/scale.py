"""pytest hooks for runs spread over GPUs and machines (loaded by ``kvx_conformance.plugin``).

- ``--kvx-gpus 0,1`` (``kvx-conform run --gpus``): the controller gives every xdist worker
  a GPU through ``workerinput`` (:class:`~kvx_conformance.abi.gpus.Assigner`; a worker that
  replaces a crashed one gets the least-loaded GPU), and the worker binds itself in its
  ``pytest_configure``, before anything initializes CUDA (:func:`gpus.bind_process`).
  The controller's plugin asks :meth:`Scale.gpu_of` for each finished test's GPU.
- ``--kvx-shard K/N`` (``kvx-conform run --shard``): after the selection, each worker keeps
  part K of N (:mod:`~kvx_conformance.results.shards`) and leaves the ``shard`` record in the
  output directory, where the controller puts it in results.json's header.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from ...abi import gpus as _gpus
from ...results import shards as _shards

PLUGIN_NAME = "kvx-scale"
SHARD_FILE = "shard.json"


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("kvx")
    g.addoption("--kvx-gpus", default=None, help="comma list of GPU indexes the workers are spread over")
    g.addoption("--kvx-gpu-visible", default=None,
                help="comma list: the device names (CUDA_VISIBLE_DEVICES entries) behind GPU indexes 0, 1, ...")
    g.addoption("--kvx-shard", default=None, help="run only part K of N of the selection (K/N)")
    g.addoption("--kvx-shard-durations", default=None, help="results.json whose durations balance the shards")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    scale = Scale(config)
    config.pluginmanager.register(scale, PLUGIN_NAME)


def _int_list(text: str | None) -> list[int] | None:
    if text is None or text == "":
        return None
    return [int(x) for x in text.split(",") if x.strip()]


class Scale:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.is_worker = hasattr(config, "workerinput")
        self.gpus = _int_list(config.getoption("kvx_gpus"))
        vis = config.getoption("kvx_gpu_visible")
        self.visible = vis.split(",") if vis else None
        self.assigner = _gpus.Assigner(self.gpus or [])
        self.notes: list[str] = []
        self.out_dir = config.getoption("kvx_output_dir")
        if self.is_worker:
            wi = config.workerinput
            gpu = wi.get(_gpus.WORKERINPUT_KEY)
            if gpu is not None and self.gpus:
                visible = wi.get(_gpus.WORKERINPUT_VISIBLE) or self.visible or [str(i) for i in
                                                                              range(max(self.gpus) + 1)]
                self.notes = _gpus.bind_process(int(gpu), self.gpus, visible)
                for n in self.notes:
                    print(f"kvx-conform: {n}", file=sys.stderr)
        self.shard = None
        spec = config.getoption("kvx_shard")
        if spec:
            try:
                self.shard = _shards.parse_shard(spec)
            except _shards.ShardSpecError as e:
                raise pytest.UsageError(str(e)) from None
        self.durations = None
        self.durations_sha = None
        dpath = config.getoption("kvx_shard_durations")
        if dpath and self.shard:
            try:
                self.durations, self.durations_sha = _shards.load_durations(dpath)
            except _shards.ShardSpecError as e:
                raise pytest.UsageError(str(e)) from None
        self.durations_path = dpath

    # -- GPUs (controller)
    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        if not self.gpus:
            return
        wid = node.workerinput.get("workerid") or getattr(node.gateway, "id", None)
        node.workerinput[_gpus.WORKERINPUT_KEY] = self.assigner.assign(wid)
        node.workerinput[_gpus.WORKERINPUT_VISIBLE] = self.visible

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        wid = getattr(node, "workerinput", {}).get("workerid") or getattr(getattr(node, "gateway", None), "id", None)
        if wid:
            self.assigner.release(wid)

    def gpu_of(self, worker: str | None) -> int | None:
        if not self.gpus:
            return None
        if worker is None:  # a run without xdist workers: this process
            return _gpus.bound_gpu()
        return self.assigner.gpu_of(worker)

    # -- shards (workers, or the single process)
    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_collection_modifyitems(self, session, config, items):
        yield
        if self.shard is None:
            return
        tests = []
        for it in items:
            meta = json.loads(dict(it.user_properties).get("kvx.meta", "{}") or "{}")
            tests.append((meta.get("id") or it.nodeid, it.nodeid))
        k, n = self.shard
        keep, info = _shards.select(tests, k, n, self.durations, self.durations_sha,
                                    str(Path(self.durations_path).resolve()) if self.durations_path else None)
        kept = set(keep)
        drop = [it for i, it in enumerate(items) if i not in kept]
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = [it for i, it in enumerate(items) if i in kept]
        if self.out_dir:
            d = Path(self.out_dir)
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / f".{SHARD_FILE}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(info, indent=1), encoding="utf-8")
            os.replace(tmp, d / SHARD_FILE)

    def shard_info(self) -> dict | None:
        """The ``shard`` record the workers left in the output directory (None when not sharded)."""
        if self.shard is None or not self.out_dir:
            return None
        try:
            return json.loads((Path(self.out_dir) / SHARD_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
