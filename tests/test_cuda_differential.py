"""The CUDA face of the bundled reference: its CUDA backend against the numpy oracle
and against its own host backend, on DEVICE and UNIFIED memory.

Randomized valid write / gather cases over every layout, dtype, index dtype and
table format (the generators of ``test_oracle_differential``) run three ways: on
HOST memory (host backend), on DEVICE memory and on UNIFIED memory (CUDA
backend). Each result must equal the oracle's bit for bit, status included, and
no guard byte may change. Every data-dependent rule violation (R-ORDER step 5)
runs on both GPU memory types: UNIFIED must answer exactly the host's status and
write nothing; DEVICE may answer OK instead (R-DEVICE-STATUS) but then every
element must hold its initial value or the value of the call's valid part, and
the guards must hold.

Runs where the reference was built with CUDA and torch sees a GPU (the device
machine); skips elsewhere. Repro of a failing seed: the message names the
generator call; run it with ``CallOptions(memory=Memory.DEVICE)``.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvx_conformance.abi import buffers
from kvx_conformance.abi.dtypes import bits_view
from kvx_conformance.abi.header import DType, Memory, Status
from kvx_conformance.abi.loader import status_name
from kvx_conformance.cases import checks, generators
from kvx_conformance.cases.case import GatherCase, Result, WriteCase
from kvx_conformance.cases.execute import CallOptions, run_gather, run_write
from kvx_conformance.reference_impl import RULES, expected

from difftools import compare  # tests/difftools.py

CASES = {"write": 240, "gather": 240}
CHUNKS = 4
GEN = {"write": generators.random_write_case, "gather": generators.random_gather_case}
RUN = {"write": run_write, "gather": run_gather}
STREAM = {"write": 4101, "gather": 4202}
DATA_RULES = sorted(r for r, rc in RULES.items() if rc.step == 5 and r in generators.RULES)
MEMORIES = {"device": Memory.DEVICE, "unified": Memory.UNIFIED}


@pytest.fixture(scope="module")
def provider():
    from kvx_conformance.abi.loader import load_provider
    from kvx_conformance.abi.native import NativeBuildMissing, have_cuda, reference_provider

    try:
        path = reference_provider()
    except NativeBuildMissing as e:
        pytest.skip(str(e))
    if not path.exists():
        pytest.skip(f"reference provider not built: {path}")
    if not have_cuda():
        pytest.skip("the reference provider was built without its CUDA backend (no nvcc)")
    why = buffers.memory_available(Memory.DEVICE)
    if why:
        pytest.skip(why)
    return load_provider(path)


_STREAMS: list = []


def _stream() -> int:
    """A non-default CUDA stream (R-STREAM: the call must honor it; the read-back waits for the device)."""
    if not _STREAMS:
        import torch

        _STREAMS.append(torch.cuda.Stream())
    return _STREAMS[0].cuda_stream


@pytest.mark.parametrize("chunk", range(CHUNKS))
@pytest.mark.parametrize("kind", ["write", "gather"])
@pytest.mark.parametrize("mem", sorted(MEMORIES))
def test_cuda_matches_oracle_and_host(provider, mem, kind, chunk):
    """Valid random cases: CUDA on `mem` == oracle == host backend (R-WRITE, R-GATHER, R-CONVERT)."""
    memory = MEMORIES[mem]
    mismatches, compared = [], 0
    seeds = range(chunk, CASES[kind], CHUNKS)
    for seed in seeds:
        case = GEN[kind](np.random.default_rng([seed, STREAM[kind]]), seed=seed)
        exp = expected(case, memory)
        host = RUN[kind](provider, case)
        got = RUN[kind](provider, case, CallOptions(memory=memory, stream=_stream() if seed % 2 else None))
        if exp.status == Status.UNSUPPORTED or got.status == Status.UNSUPPORTED:
            # R-IO: an unfoldable 4-D output may be refused; it must then write nothing.
            if got.status == Status.UNSUPPORTED and host.status == Status.UNSUPPORTED:
                diff = compare(checks.untouched(case), Result(int(Status.OK), got.arrays, got.guard_violations))
                if diff:
                    mismatches.append((seed, case, "UNSUPPORTED but memory changed: " + diff))
                continue
        compared += 1
        diff = compare(exp, got)
        hdiff = compare(host, got)
        if diff or hdiff:
            mismatches.append((seed, case, f"vs oracle: {diff or 'same'}; vs host backend: {hdiff or 'same'}"))
    report = "\n".join(
        f"- seed {seed}: {diff}\n    case: {case.describe()}\n    repro: generators.{GEN[kind].__name__}("
        f"np.random.default_rng([{seed}, {STREAM[kind]}]), seed={seed}) with CallOptions(memory=Memory.{memory.name})"
        for seed, case, diff in mismatches[:8]
    )
    assert not mismatches, (
        f"{len(mismatches)} of {len(seeds)} {kind} cases on {memory.name} memory differ (clause R-WRITE/R-GATHER; "
        f"expected the oracle's bits):\n{report}"
    )
    assert compared >= 0.75 * len(seeds), f"only {compared} of {len(seeds)} compared"


def _partial(case):
    if isinstance(case, WriteCase):
        return checks.partial_write(case)()
    return checks.partial_gather(case)()


@pytest.mark.parametrize("rule_id", DATA_RULES)
@pytest.mark.parametrize("mem", sorted(MEMORIES))
def test_data_rule_violations(provider, mem, rule_id):
    """Data-dependent errors: UNIFIED answers the host's status and writes nothing; DEVICE
    may answer OK with only the valid part written (R-DEVICE-STATUS); never a guard byte."""
    memory = MEMORIES[mem]
    rc = generators.RULES[rule_id]
    failures = []
    for seed, profile in [(s, "CORE") for s in range(4)] + [(s, "FULL") for s in range(2)]:
        v = generators.random_invalid_case(np.random.default_rng([seed, 4313]), rule_id, seed=seed,
                                           profile=getattr(generators, profile))
        case = v.case
        run = run_write if isinstance(case, WriteCase) else run_gather
        exp = expected(case, memory)
        got = run(provider, case, CallOptions(memory=memory))
        host = run(provider, case)
        where = (f"- {profile} seed {seed}: case {case.describe()}\n    repro: generators.random_invalid_case("
                 f"np.random.default_rng([{seed}, 4313]), {rule_id!r}, profile=generators.{profile})")
        if host.status == Status.UNSUPPORTED and got.status == Status.UNSUPPORTED:
            # R-IO / R-ORDER: an unfoldable 4-D output is refused (step 3) before data checks
            diff = compare(checks.untouched(case), Result(int(Status.OK), got.arrays, got.guard_violations))
            if diff:
                failures.append(f"{where}\n    UNSUPPORTED but memory changed: {diff}")
            continue
        if host.status != exp.status:
            failures.append(f"{where}\n    host backend answered {status_name(host.status)}, oracle {status_name(exp.status)}")
        if got.guard_violations:
            failures.append(f"{where}\n    guards: {'; '.join(got.guard_violations)}")
            continue
        if memory == Memory.DEVICE and got.status == Status.OK and exp.status != Status.OK:
            part = _partial(case)
            init = checks.untouched(case)
            for key, g in got.arrays.items():
                ok = (bits_view(g) == bits_view(init.arrays[key])) | (bits_view(g) == bits_view(part.arrays[key]))
                if not ok.all():
                    failures.append(f"{where}\n    {key}: {int((~ok).sum())} element(s) neither initial nor the "
                                    "valid part's value (R-DEVICE-STATUS)")
            continue
        diff = compare(exp, got)
        if diff:
            failures.append(f"{where}\n    {diff}")
    assert not failures, (
        f"rule {rule_id} ({rc.clause}) on {memory.name} memory: expected {status_name(rc.status)}"
        f"{' or OK with the valid part' if memory == Memory.DEVICE else ''} and no write outside:\n"
        + "\n".join(failures)
    )


@pytest.mark.parametrize("op", ["write", "gather"])
def test_unified_call_inside_graph_capture_is_refused_cleanly(provider, op):
    """A UNIFIED call answers the host's statuses, which needs one wait on the stream; a
    stream being captured into a CUDA graph cannot be waited on. The call must answer
    UNSUPPORTED there, leave no CUDA error behind, and the same call made eagerly
    afterwards must succeed (R-STREAM)."""
    import torch

    from kvx_conformance.bench.prepare import backend, prepare
    from kvx_conformance.bench.sweep import BenchCase

    case = BenchCase(op=op, tokens=256, heads=2, head_dim=64, seq_len=64, memory="unified",
                     table="packed" if op == "gather" else "random")
    prep = prepare(case, backend("unified"), seed=7, nsets=1)
    s = torch.cuda.Stream()
    s.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        inside = prep.call(provider, 0, s.cuda_stream)
    torch.cuda.synchronize()
    after = prep.call(provider, 0, s.cuda_stream)
    s.synchronize()
    assert (inside, after) == (Status.UNSUPPORTED, Status.OK), (
        f"unified {op}: expected UNSUPPORTED inside the capture then OK eagerly, "
        f"got {status_name(inside)} then {status_name(after)} (R-STREAM; csrc/reference/cuda/cuda_backend.cu)")


# Large calls take planner paths that the random cases above (mostly small) never reach
# (docs/cuda-reference.md, "Mid-size calls and narrow rows"): 2 to 8 rows per task when a
# row's K and V have fewer than 256 chunks (up to 32 in the lean kernel), one task per warp for gathers below 262144
# rows, four from there on; on a device of memory depth 2 or more (an H200) the PACKED gathers of NHD rows of
# 8 x 128 take two rows per task in the lean kernel ("Twentieth round"), odd sequence lengths leaving half a pair.
# Each case below takes one of them; the result must be the oracle's, bit for bit.
LARGE = {
    # id: (op, heads, head_dim, sequences or tokens, mixed lengths)
    "gather-d64x8-262144rows-2rows-per-task-4-tasks-per-warp": ("gather", 8, 64, 128, False),
    "gather-d64x8-65536rows-mixed-lengths-2rows-per-task": ("gather", 8, 64, 32, True),
    "gather-d128x1-32768rows-8rows-per-task": ("gather", 1, 128, 16, False),
    "gather-d64x1-65536rows-mixed-lengths-8-or-more-rows-per-task": ("gather", 1, 64, 32, True),
    "gather-d128x8-65536rows-2rows-per-task-at-memory-depth-2": ("gather", 8, 128, 32, False),
    "gather-d128x8-65536rows-mixed-lengths-2rows-per-task-at-memory-depth-2": ("gather", 8, 128, 32, True),
    "write-d64x8-65536tokens-2rows-per-task": ("write", 8, 64, 65536, False),
    "write-d64x1-65533tokens-8-or-more-rows-per-task-partial-last-task": ("write", 1, 64, 65533, False),
}


@pytest.mark.parametrize("name", sorted(LARGE))
def test_large_call_planner_paths(provider, name):
    """Large DEVICE calls through the multi-row tasks and the tasks-per-warp choice == the oracle (R-WRITE, R-GATHER)."""
    from kvx_conformance.cases import build as cb
    from kvx_conformance.abi.descriptors import Geometry

    op, heads, dim, n, mixed = LARGE[name]
    geom = Geometry(num_blocks=8192, block_size=16, num_kv_heads=heads, head_dim=dim)
    cache = cb.simple_cache(geom, "nhd", DType.F16, seed=11)
    if op == "write":
        case = cb.write_case(cache, cb.spread_slots(geom, n, 12), seed=13)
        got = run_write(provider, case, CallOptions(memory=Memory.DEVICE))
    else:
        msl = 2048
        lens = np.random.default_rng(14).integers(1, msl + 1, n) if mixed else np.full(n, msl)
        table = cb.distinct_table(geom, n, msl // geom.block_size, 15)
        case = cb.packed_gather(cache, table, lens.tolist(), msl, seed=16)
        got = run_gather(provider, case, CallOptions(memory=Memory.DEVICE))
    diff = compare(expected(case, Memory.DEVICE), got)
    assert not diff, (f"{name}: the CUDA backend differs from the oracle (expected its bits): {diff}\n"
                      f"repro: pytest tests/test_cuda_differential.py -k '{name}' on a GPU machine")


# Small (decode-sized) calls whose lanes would each take more than 4 chunks of a row split
# each row over 2, 4, ... warps (docs/cuda-reference.md, "Decode-sized calls": F32 rows of
# 8 heads x 128 are 8 chunks per lane, x 256 are 16). Every warp must move exactly its slice.
SMALL_SPLIT = {
    # id: (op, cache dtype, io dtype, layout, heads, head_dim, tokens or sequence lengths)
    "write-f32-nhd-d128x8-1token-2-warps-per-row": ("write", DType.F32, DType.F32, "nhd", 8, 128, 1),
    "write-f32-hnd-d128x8-37tokens-2-warps-per-row": ("write", DType.F32, DType.F32, "hnd", 8, 128, 37),
    "write-f32-nhd-d256x8-5tokens-4-warps-per-row": ("write", DType.F32, DType.F32, "nhd", 8, 256, 5),
    "write-f32-to-f16-nhd-d128x8-9tokens-convert-2-warps": ("write", DType.F16, DType.F32, "nhd", 8, 128, 9),
    "write-f32-nhd-d160x5-3tokens-2-warps-uneven-slices": ("write", DType.F32, DType.F32, "nhd", 5, 160, 3),
    "gather-f32-nhd-d128x8-lengths-1-16-255-2-warps": ("gather", DType.F32, DType.F32, "nhd", 8, 128, (1, 16, 255)),
    "gather-f32-hnd-d256x8-lengths-3-40-4-warps": ("gather", DType.F32, DType.F32, "hnd", 8, 256, (3, 40)),
}


@pytest.mark.parametrize("name", sorted(SMALL_SPLIT))
def test_small_call_split_rows(provider, name):
    """Decode-sized DEVICE calls whose rows are split over several warps == the oracle (R-WRITE, R-GATHER)."""
    from kvx_conformance.cases import build as cb
    from kvx_conformance.abi.descriptors import Geometry

    op, cdt, iodt, kind, heads, dim, n = SMALL_SPLIT[name]
    geom = Geometry(num_blocks=64, block_size=16, num_kv_heads=heads, head_dim=dim)
    cache = cb.simple_cache(geom, kind, cdt, seed=21)
    if op == "write":
        case = cb.write_case(cache, cb.spread_slots(geom, n, 22), seed=23, io_dtype=iodt)
        got = run_write(provider, case, CallOptions(memory=Memory.DEVICE))
    else:
        msl = 256
        table = cb.distinct_table(geom, len(n), msl // geom.block_size, 25)
        case = cb.packed_gather(cache, table, list(n), msl, seed=26)
        got = run_gather(provider, case, CallOptions(memory=Memory.DEVICE))
    diff = compare(expected(case, Memory.DEVICE), got)
    assert not diff, (f"{name}: the CUDA backend differs from the oracle (expected its bits): {diff}\n"
                      f"repro: pytest tests/test_cuda_differential.py -k '{name}' on a GPU machine")


# Quantizing writes into an FP8 HND_PACKED cache with 16-element pack groups take the tile
# kernel, which stores whole 16-byte pieces; padded strides that are multiples of the fast
# path's 4- or 8-byte chunks but not of 16 bytes must take the generic path instead
# (kvx_cuda_vs_host --seed 4 found the first: a misaligned 16-byte store, a CUDA error).
PADDED_FP8_TILE = {
    # id: (io dtype, cache dtype, blocks, block size, heads, strides of [block][head][D/16][token][16])
    "f32-to-e5m2-dgroup-stride-20": (DType.F32, DType.F8_E5M2, 7, 1, 3, (480, 160, 20, 17, 1)),
    "f16-to-e4m3-token-stride-24": (DType.F16, DType.F8_E4M3, 6, 4, 2, (1664, 832, 104, 24, 1)),
}


@pytest.mark.parametrize("name", sorted(PADDED_FP8_TILE))
def test_fp8_packed_write_padded_strides(provider, name):
    """FP8 HND_PACKED writes with padded, not 16-byte aligned strides == the oracle, no fault (R-WRITE, R-FP8)."""
    from kvx_conformance.cases import build as cb
    from kvx_conformance.abi.descriptors import Geometry

    io, cdt, nb, bs, heads, stride = PADDED_FP8_TILE[name]
    geom = Geometry(num_blocks=nb, block_size=bs, num_kv_heads=heads, head_dim=128)
    t = cb.layout(geom, "hnd_packed", cdt, pack=16, stride=stride)
    cache = cb.make_cache(geom, t, t, seed=31)
    case = cb.write_case(cache, cb.spread_slots(geom, nb * bs, 32), seed=33, io_dtype=io)
    got = run_write(provider, case, CallOptions(memory=Memory.DEVICE))
    diff = compare(expected(case, Memory.DEVICE), got)
    assert not diff, (f"{name}: the CUDA backend differs from the oracle (expected its bits): {diff}\n"
                      f"repro: pytest tests/test_cuda_differential.py -k '{name}' on a GPU machine")


# Large writes that cover a good part of the cache go over the cache's slots instead of the IO
# rows (docs/cuda-reference.md, "Random-slot writes into HND_PACKED" and "Thirteenth round"): the
# slots are first inverted into a scratch array, then whole tiles (HND_PACKED) or whole cache rows
# in slot order (NHD/HND: the lean kernel on a device of memory depth 2 or more, for calls of at
# least KVX_CUDA_ROWS_INVERT_MIN_BYTES of rows; the NHD/HND cases below are smaller, so they go
# over the slots in a build with that knob lowered, and check the row-ordered kernels in a
# default build) are stored. Unwritten slots, invalid slots (-1, never
# stored), partial tiles, S32 slots and per-head FP8 scales must come out exactly as the oracle's;
# the "row-ordered" cases cover too little of the cache or take two rows per task (8 heads of 64)
# and keep the kernels over the IO rows, and F32 rows into an F16 cache take a kernel that never
# goes over the slots.
INVERTED = {
    # id: (layout, cache dtype, io dtype, blocks, block size, tokens, every k-th slot invalid,
    #      permutation of the whole cache, head_dim, {"heads": H (4), "per_head": FP8 scales, write_case arguments})
    "f16-16384-of-32768-slots-every-97th-invalid": ("hnd_packed", DType.F16, DType.F16, 2048, 16, 16384, 97, False, 128, {}),
    "bf16-whole-cache-permutation": ("hnd_packed", DType.BF16, DType.BF16, 2048, 16, 32768, 0, False, 128, {}),
    "f32-block-size-32-20000-of-65536-slots": ("hnd_packed", DType.F32, DType.F32, 2048, 32, 20000, 0, False, 128, {}),
    "f16-to-e4m3-16384-of-32768-slots-every-89th-invalid": ("hnd_packed", DType.F8_E4M3, DType.F16, 2048, 16, 16384, 89, False, 128, {}),
    "bf16-to-e5m2-whole-cache-prefill-order": ("hnd_packed", DType.F8_E5M2, DType.BF16, 1024, 16, 16384, 0, True, 128, {}),
    "f16-16384-of-131072-slots-row-ordered-tiles": ("hnd_packed", DType.F16, DType.F16, 8192, 16, 16384, 0, False, 128, {}),
    "nhd-f16-16384-of-32768-slots-every-97th-invalid": ("nhd", DType.F16, DType.F16, 2048, 16, 16384, 97, False, 128, {"heads": 8}),
    "hnd-bf16-whole-cache-permutation-s32-slots": ("hnd", DType.BF16, DType.BF16, 2048, 16, 32768, 0, False, 128,
                                                   {"slot_dtype": DType.S32, "heads": 8}),
    "nhd-f16-head-dim-64-two-rows-per-task-row-ordered": ("nhd", DType.F16, DType.F16, 4096, 16, 32768, 0, False, 64,
                                                          {"heads": 8}),
    "nhd-bf16-io-into-f16-cache-block-size-32": ("nhd", DType.F16, DType.BF16, 1024, 32, 16384, 0, False, 128, {"heads": 8}),
    "hnd-f16-to-e4m3-per-head-scales-every-89th-invalid": ("hnd", DType.F8_E4M3, DType.F16, 2048, 16, 16384, 89, False, 128,
                                                            {"per_head": True, "heads": 8}),
    "nhd-f32-to-e5m2-20000-of-65536-slots": ("nhd", DType.F8_E5M2, DType.F32, 4096, 16, 20000, 0, False, 128, {"heads": 8}),
    "hnd-f32-io-into-f16-cache-16384-of-32768-slots": ("hnd", DType.F16, DType.F32, 2048, 16, 16384, 0, False, 128, {"heads": 8}),
    "nhd-f16-16384-of-131072-slots-row-ordered": ("nhd", DType.F16, DType.F16, 8192, 16, 16384, 0, False, 128, {"heads": 8}),
}


@pytest.mark.parametrize("name", sorted(INVERTED))
def test_write_over_cache_slots(provider, name):
    """Large random-slot writes (over the cache's slots where the backend inverts them) == the oracle
    (R-WRITE, R-INVALID-SLOT, R-FP8)."""
    from kvx_conformance.abi.header import ScaleGranularity
    from kvx_conformance.cases import build as cb
    from kvx_conformance.abi.descriptors import Geometry

    kind, cdt, iodt, nb, bs, n, every, prefill, dim, extra = INVERTED[name]
    extra = dict(extra)
    heads = extra.pop("heads", 4)
    geom = Geometry(num_blocks=nb, block_size=bs, num_kv_heads=heads, head_dim=dim)
    fp8 = cdt in (DType.F8_E4M3, DType.F8_E5M2)
    pack = 16 if fp8 and kind == "hnd_packed" else None
    cache = cb.simple_cache(geom, kind, cdt, seed=41, **({"pack": pack} if pack else {}))
    if prefill:
        blocks = np.random.default_rng(42).permutation(nb)[: n // bs]
        slots = (blocks[:, None] * bs + np.arange(bs)[None, :]).reshape(-1).astype(np.int64)
    else:
        slots = cb.spread_slots(geom, n, 43)
    if every:
        slots[::every] = -1
    if extra.pop("per_head", False):
        extra["k_scale_desc"] = cb.scale_spec([0.5, 2.0, 0.75, 3.0, 1.25, 0.125, 6.0, 1.0][:heads], ScaleGranularity.PER_HEAD)
        extra["v_scale_desc"] = cb.scale_spec([1.5, 0.25, 4.0, 1.0, 0.625, 8.0, 0.5, 2.5][:heads], ScaleGranularity.PER_HEAD)
    case = cb.write_case(cache, slots, seed=44, io_dtype=iodt, **extra)
    got = run_write(provider, case, CallOptions(memory=Memory.DEVICE))
    diff = compare(expected(case, Memory.DEVICE), got)
    assert not diff, (f"{name}: the CUDA backend differs from the oracle (expected its bits): {diff}\n"
                      f"repro: pytest tests/test_cuda_differential.py -k '{name}' on a GPU machine")


# DEVICE calls must capture into a CUDA graph (R-STREAM: the call enqueues its work on the stream
# and never waits): on a host with several GPUs too, where the backend looks up the buffers' GPU
# (R-PLACEMENT) but must ask the driver nothing on a stream being captured; and the large
# HND_PACKED and NHD writes whose scratch memory becomes a graph memory node (NHD: 512 MiB of
# rows, on a device whose memory depth inverts such writes; the verification samples rows).
CAPTURED = {
    # id: (op, layout, tokens, heads, head_dim, table or slots)
    "write-nhd-16-tokens": ("write", "nhd", 16, 8, 128, "random"),
    "gather-nhd-64-tokens": ("gather", "nhd", 64, 8, 128, "packed"),
    "write-hnd_packed-16384-tokens-over-cache-slots": ("write", "hnd_packed", 16384, 2, 128, "random"),
    "write-nhd-131072-tokens-over-cache-slots": ("write", "nhd", 131072, 8, 128, "random"),
}


@pytest.mark.parametrize("name", sorted(CAPTURED))
def test_device_call_captures_into_a_cuda_graph(provider, name):
    """A DEVICE call made inside torch.cuda.graph capture answers OK, the capture succeeds, and the
    replayed graph leaves the oracle's result (R-STREAM; R-PLACEMENT with several GPUs visible)."""
    import torch

    from kvx_conformance.bench.prepare import backend, prepare
    from kvx_conformance.bench.sweep import BenchCase

    op, layout, tokens, heads, dim, table = CAPTURED[name]
    case = BenchCase(op=op, layout=layout, tokens=tokens, heads=heads, head_dim=dim, seq_len=64 if op == "gather" else 2048,
                     memory="device", table=table, cache_blocks=tokens // 16 if tokens >= 16384 else 0)
    prep = prepare(case, backend("device"), seed=9, nsets=1)
    s = torch.cuda.Stream()
    s.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        inside = prep.call(provider, 0, s.cuda_stream)
    g.replay()
    torch.cuda.synchronize()
    assert inside == Status.OK, (f"{name}: the call inside the capture answered {status_name(inside)}, expected OK "
                                 f"({torch.cuda.device_count()} GPUs visible; R-STREAM)")
    ver = prep.verify()
    assert ver["ok"], (f"{name}: after the graph's replay the memory differs from the oracle: {ver}\n"
                       f"repro: pytest tests/test_cuda_differential.py -k '{name}' on a GPU machine")


# Calls made back to back on one stream, with no wait between them, must see each other's memory in
# stream order (R-STREAM): a gather reads what the write before it stored, and a write leaves alone
# what the gather before it has yet to read. The CUDA reference launches its kernels so that each may
# be scheduled while the kernel before it finishes (programmatic dependent launch, docs/cuda-reference.md,
# "Twenty-first round"); each kernel waits for its predecessor before it touches memory. Every round
# writes fresh rows into the same slots and gathers them into an output of its own, the blocks in the
# reverse order, so that the gather's first rows are the write's last and the next write's first rows
# the gather's last: each output must hold its own round's rows (a gather that ran early reads the
# round before; a write that ran early, the round after).
CHAINED = {
    # id: (layout, tokens per call, rounds)
    "nhd-256-tokens-decode-kernels": ("nhd", 256, 48),
    "hnd_packed-256-tokens-tile-kernels": ("hnd_packed", 256, 48),
    "nhd-4096-tokens": ("nhd", 4096, 24),
    "nhd-16384-tokens-large-call-kernels": ("nhd", 16384, 8),
    "hnd_packed-16384-tokens-tile-kernels": ("hnd_packed", 16384, 8),
}


@pytest.mark.parametrize("name", sorted(CHAINED))
def test_back_to_back_calls_keep_stream_order(provider, name):
    """Write then gather the same slots, round after round on one stream with no wait: each gather
    returns its round's rows (R-STREAM, R-WRITE, R-GATHER)."""
    import torch

    from kvx_conformance.abi import descriptors as d
    from kvx_conformance.abi import header as abi
    from kvx_conformance.bench.prepare import DeviceMem
    from kvx_conformance.bench.sweep import LAYOUTS

    layout, tokens, rounds = CHAINED[name]
    bs, heads, dim, sl = 16, 8, 128, 256
    nblk = tokens // bs
    mem, rng = DeviceMem(), np.random.default_rng(61)
    geom = d.Geometry(num_blocks=2 * nblk, block_size=bs, num_kv_heads=heads, head_dim=dim)
    lay = d.cache_layout(geom, LAYOUTS[layout], DType.F16, pack=8 if layout == "hnd_packed" else None)  # 16 bytes
    k_cache, v_cache = (mem.random(lay.span_elements(), DType.F16, rng) for _ in range(2))
    cache = d.to_c_cache(geom, lay, mem.ptr(k_cache), lay, mem.ptr(v_cache), Memory.DEVICE)
    # written row i goes to block blocks[i // bs]; sequences of `sl` tokens read the blocks in the
    # reverse order, so gathered row r is written row (nblk - 1 - r // bs) * bs + r % bs
    blocks = rng.permutation(geom.num_blocks)[:nblk].astype(np.int64)
    slots = (blocks[:, None] * bs + np.arange(bs)).reshape(-1)
    bt = d.BlockTable.packed(np.ascontiguousarray(blocks[::-1]).reshape(tokens // sl, sl // bs))
    lens = d.SeqLens(np.full(tokens // sl, sl, np.int64))
    keep = [mem.from_numpy(slots), mem.from_numpy(bt.encoded_indices()), mem.from_numpy(lens.encoded())]
    io = d.IOLayout.dense(DType.F16, tokens, heads, dim)
    rows_in = [[mem.random(io.span_elements(), DType.F16, rng) for _ in range(2)] for _ in range(rounds)]
    rows_out = [[mem.empty(io.span_elements(), DType.F16, rng) for _ in range(2)] for _ in range(rounds)]
    writes, gathers = [], []
    for (k, v), (ok, ov) in zip(rows_in, rows_out):
        w = abi.kvx_write_desc_t.new()
        w.io = d.to_c_io(io, mem.ptr(k), io, mem.ptr(v), Memory.DEVICE, tokens, heads, dim)
        w.slots = d.to_c_slots(d.SlotMapping(slots), mem.ptr(keep[0]))
        w.k_scale_desc, w.v_scale_desc = d.to_c_scale(None, 0), d.to_c_scale(None, 0)
        g = abi.kvx_gather_desc_t.new(max_seq_len=sl)
        g.io = d.to_c_io(io, mem.ptr(ok), io, mem.ptr(ov), Memory.DEVICE, tokens, heads, dim)
        g.block_table = d.to_c_table(bt, mem.ptr(keep[1]), 0)
        g.seq_lens = d.to_c_seq_lens(lens, mem.ptr(keep[2]))
        writes.append(w)
        gathers.append(g)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    statuses = []
    for w, g in zip(writes, gathers):
        statuses += [provider.write_kv(cache, w, s.cuda_stream), provider.gather_kv(cache, g, s.cuda_stream)]
    s.synchronize()
    assert all(st == Status.OK for st in statuses), f"{name}: statuses {[status_name(st) for st in statuses]}"

    def reversed_blocks(x):
        return x.view(torch.int16).view(nblk, bs, heads * dim).flip(0)

    wrong = [f"round {r} {'KV'[j]}" for r in range(rounds) for j in range(2)
             if not torch.equal(rows_out[r][j].view(torch.int16).view(nblk, bs, heads * dim),
                                reversed_blocks(rows_in[r][j]))]
    assert not wrong, (f"{name}: {len(wrong)} of {2 * rounds} gathered outputs differ from the rows their round wrote "
                       f"(expected each round's own rows, stream order): {wrong[:8]}\n"
                       f"repro: pytest tests/test_cuda_differential.py -k '{name}' on a GPU machine")
