"""The plugin's options, run configuration, shared state and the suites' fixtures."""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ...abi import header as abi
from ...results.claims import Claims, InputFileError, load_claims


#: marker entry names -> C entry points
ENTRY_FUNCTIONS = {
    "version": "kvx_get_version",
    "validate": "kvx_validate_cache_desc",
    "write": "kvx_write_kv",
    "gather": "kvx_gather_kv",
}
HYPOTHESIS_EXAMPLES = {"full": 100, "quick": 10}
BREAKER_FILE = "breaker.json"
COLLECTION_FILE = "collection.json"
FAULTS_DIR = "faults"
_META = pytest.StashKey[dict]()
_START_MARK = "== kvx-start "
#: characters of captured stdout / stderr kept per test phase (a chatty provider's output is cut)
CAPTURE_TAIL_CHARS = 16 * 1024


#: a JSON record the worker writes into its fault log before it ends itself
#: (kind device-fault or late-write) or at start (kind worker: its pid)
_RECORD_MARK = "== kvx-record "
CL_LIFETIME = "spec 7.2 (implementations MUST NOT retain pointers after return); R-LIFETIME"


def entry_function(name: str) -> str:
    return ENTRY_FUNCTIONS.get(name, name)


_CTL = pytest.StashKey["_Controller"]()
_STATE_DIR = pytest.StashKey[Path]()


def _uses_xdist(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def _state_dir(config: pytest.Config) -> Path | None:
    """Where controller and workers share state (breaker file, fault logs, collection).

    The output dir when there is one; a temporary dir for an xdist run without one;
    None for a single-process run without one (the breaker then lives in memory).
    """
    if _STATE_DIR in config.stash:
        return config.stash[_STATE_DIR]
    out = config.getoption("kvx_output_dir")
    if out:
        d: Path | None = Path(out)
    elif _uses_xdist(config):
        d = Path(tempfile.mkdtemp(prefix="kvx-state-"))
        config.stash[_TEMP_STATE] = d
    else:
        d = None
    if d is not None:
        d.mkdir(parents=True, exist_ok=True)
    config.stash[_STATE_DIR] = d
    return d


_TEMP_STATE = pytest.StashKey[Path]()


def _configure_hypothesis(config: pytest.Config) -> None:
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:
        return
    rc = run_config(config)
    settings.register_profile(
        "kvx", max_examples=rc.hypothesis_max_examples, deadline=None, database=None,
        derandomize=rc.seed is None, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    settings.load_profile("kvx")


@dataclass(frozen=True)
class RunConfig:
    provider_path: Path | None
    memory: abi.Memory
    quick: bool
    hypothesis_max_examples: int
    seed: int | None
    output_dir: Path | None
    claims: Claims = field(default_factory=Claims)
    timeout_s: float | None = None


_RC = pytest.StashKey[RunConfig]()


def whole_selection(config: pytest.Config) -> bool:
    """The run (or one shard of it) selects every test of its suites, not a part by ``-k`` /
    ``--id`` / ``-m``, and is not ``--quick``: a run whose verdict can certify."""
    narrowed = config.getoption("keyword") or config.getoption("kvx_id") or config.getoption("markexpr")
    return not narrowed and not config.getoption("kvx_quick")


def run_config(config: pytest.Config) -> RunConfig:
    if _RC in config.stash:
        return config.stash[_RC]
    quick = bool(config.getoption("kvx_quick"))
    budget = config.getoption("kvx_hypothesis_examples") or HYPOTHESIS_EXAMPLES["quick" if quick else "full"]
    prov = config.getoption("kvx_provider")
    if prov is None:
        try:
            from ...abi.native import reference_provider

            prov = str(reference_provider())
        except Exception:
            prov = None
    try:
        claims = load_claims(config.getoption("kvx_claims"))
    except InputFileError as e:
        raise pytest.UsageError(str(e)) from None
    selected = tuple(dict.fromkeys(config.getoption("kvx_profile") or ()))
    if selected and not claims.explicit:  # --profile P names the profiles to certify
        claims = Claims(selected, claims.features, claims.source, explicit=True)
    out = config.getoption("kvx_output_dir")
    rc = RunConfig(
        provider_path=Path(prov) if prov else None,
        memory=abi.Memory[config.getoption("kvx_memory").upper()],
        quick=quick,
        hypothesis_max_examples=int(budget),
        seed=config.getoption("kvx_seed"),
        output_dir=Path(out) if out else None,
        claims=claims,
        timeout_s=getattr(config.option, "timeout", None),
    )
    config.stash[_RC] = rc
    return rc


@pytest.fixture(scope="session")
def kvx_run_config(pytestconfig: pytest.Config) -> RunConfig:
    return run_config(pytestconfig)


def preflight_write_layout(config: pytest.Config, memory: abi.Memory) -> str | None:
    """The layout ("BLOCK_NHD" / "BLOCK_HND") of the preflight's first tiny write that answered OK,
    from the run info the CLI wrote, when the preflight probed ``memory``; else None."""
    import json

    info_path = config.getoption("kvx_run_info")
    if not info_path:
        return None
    try:
        info = json.loads(Path(info_path).read_text(encoding="utf-8"))
        requested = (info.get("config") or {}).get("memory_requested")
        probed = requested if requested in ("device", "unified") else "host"
        if probed != memory.name.lower():
            return None
        return ((info.get("provider") or {}).get("struct_sizes") or {}).get("kvx_write_kv", {}).get("layout")
    except (OSError, ValueError, AttributeError):
        return None


@pytest.fixture(scope="session")
def kvx_provider(kvx_run_config: RunConfig, pytestconfig: pytest.Config):
    from ...abi.loader import load_provider
    from ...cases.build import seed_core_layout

    if kvx_run_config.provider_path is None:
        raise RuntimeError("no provider: pass --kvx-provider (kvx-conform run PROVIDER)")
    provider = load_provider(kvx_run_config.provider_path)
    # the core layout is the one a write serves (the preflight probed NHD, then HND), not merely one
    # that validates (build.core_layout)
    seed_core_layout(provider, kvx_run_config.memory,
                     preflight_write_layout(pytestconfig, kvx_run_config.memory))
    return provider


@pytest.fixture(scope="session")
def kvx_memory(kvx_run_config: RunConfig) -> abi.Memory:
    from ...abi.buffers import memory_available

    reason = memory_available(kvx_run_config.memory)
    if reason:
        raise RuntimeError(f"memory type {kvx_run_config.memory.name.lower()} is not available here: {reason}")
    return kvx_run_config.memory


@pytest.fixture
def kvx_call_options(kvx_memory: abi.Memory):
    from ...cases.execute import CallOptions

    def make(misalign: int = 0, stream: int | None = None, after_call=None) -> CallOptions:
        return CallOptions(memory=kvx_memory, misalign=misalign, stream=stream, after_call=after_call)

    return make


@pytest.fixture(scope="session")
def kvx_claims(kvx_run_config: RunConfig) -> frozenset[str]:
    return kvx_run_config.claims.features


@pytest.fixture(scope="session")
def kvx_generator_features(kvx_provider, kvx_memory: abi.Memory, kvx_claims: frozenset[str]) -> frozenset[str]:
    """Optional features the generated / differential tests may draw: the provider's core
    layout, what it served in one probe call per feature, and what the vendor claims
    (``kvx_conformance.cases.served``)."""
    from ...cases.served import generator_features

    return generator_features(kvx_provider, kvx_memory, kvx_claims)
