"""ppl.nn ``dynamic_batching.KeyValueCache``-shaped caches (seed 001; docs/adapters.md, ppl.nn rows).

One ``cache`` tensor holds K and V of every layer, ordered by ``cache_layout``
(0 ``(MaxT, L, 2, H, Dh)``, 1 ``(L, MaxT, 2, H, Dh)``, 2 ``(L, 2, MaxT, H, Dh)``,
3 ``(L, 2, H, MaxT, Dh)``); layer ``layer_idx``'s K and V are strided views. New
tokens go to rows from ``cachestarts`` (``cache_mode`` 0: one start per request,
its tokens contiguous; 1: a start per page of ``page_size`` rows) at positions
``start_pos[b] + i`` (``seqstarts`` prefix sums); the gather reads ``kvstarts``
lengths. ``engine.ppl.cache_mode{M}.layout{L}``: prefill, two decode steps and a
gather of three requests; ``engine.ppl.num_repeat.gather``: the GQA-repeated output
(head stride ``num_repeat * Dh``) as a strided gather output.
"""
from __future__ import annotations

import numpy as np

from kvx_conformance.abi.header import DType
from kvx_conformance.adapters import ppl
from kvx_conformance.results.outcomes import INFORMATIONAL, REQUIRED, conformance

from ._scenario import CL_REFUSED, CL_SCENARIO, Scenario, churned_manager, not_expressible, values

CL = CL_SCENARIO
LAYERS, LAYER = 2, 1
PROMPTS = (37, 9, 50)


def _shape(layout, max_t, h, d):
    return {0: (max_t, LAYERS, 2, h, d), 1: (LAYERS, max_t, 2, h, d),
            2: (LAYERS, 2, max_t, h, d), 3: (LAYERS, 2, h, max_t, d)}[layout]


class _Batch:
    """ppl.nn's per-step inputs for requests whose rows come from ``row_of(b, pos)``."""

    def __init__(self, prompts):
        self.lens = np.zeros(len(prompts), np.int64)

    def step(self, new):
        new = np.asarray(new, np.int64)
        seqstarts = np.concatenate([[0], np.cumsum(new)])
        start_pos = self.lens.copy()
        self.lens = self.lens + new
        kvstarts = np.concatenate([[0], np.cumsum(self.lens)])
        return seqstarts, start_pos, kvstarts


def _run_mode1(provider, opts, claims, layout, h, d, max_t, page_size, block_size, seed):
    cache = values(DType.F16, _shape(layout, max_t, h, d), seed)
    adapted = ppl.key_value_cache(cache, num_layer=LAYERS, layer_idx=LAYER, cache_layout=layout, cache_mode=1,
                                  page_size=page_size, block_size=block_size)
    scn = Scenario(provider, opts, claims, adapted, seed=seed,
                   what=f"ppl.nn cache_layout {layout} cache_mode 1 page_size {page_size} (KVX block {block_size}) "
                        f"{h}x{d} MaxT {max_t} layer {LAYER}/{LAYERS}")
    bm = churned_manager(max_t // page_size, page_size, seed=seed + 1)  # pages
    seqs = ["a", "b", "c"]
    batch = _Batch(PROMPTS)
    max_pages = -(-(max(PROMPTS) + 2) // page_size)
    for step, new in enumerate([PROMPTS, (1, 1, 1), (1, 1, 1)]):
        for s, n in zip(seqs, new):
            bm.append_tokens(s, n) if step else bm.allocate(s, n)
        cachestarts = np.zeros((3, max_pages), np.int64)
        for i, s in enumerate(seqs):
            cachestarts[i, : len(bm.blocks(s))] = np.asarray(bm.blocks(s)) * page_size
        seqstarts, start_pos, kvstarts = batch.step(new)
        slots = ppl.write_slots(cachestarts, seqstarts, start_pos, cache_mode=1, page_size=page_size,
                                geometry=adapted.geometry)
        scn.write(slots, label=("prefill" if step == 0 else "decode") + f" of {list(new)} tokens")
    table, lens = ppl.gather_table(cachestarts, kvstarts, cache_mode=1, block_size=block_size, page_size=page_size)
    scn.gather(table, lens, int(lens.lengths.max()), label="kvstarts lengths through cachestarts pages")


def _run_mode0(provider, opts, claims, layout, h, d, max_t, starts, block_size, seed):
    cache = values(DType.F16, _shape(layout, max_t, h, d), seed)
    adapted = ppl.key_value_cache(cache, num_layer=LAYERS, layer_idx=LAYER, cache_layout=layout, cache_mode=0,
                                  block_size=block_size)
    scn = Scenario(provider, opts, claims, adapted, seed=seed,
                   what=f"ppl.nn cache_layout {layout} cache_mode 0 cachestarts {list(starts)} (KVX block "
                        f"{block_size}) {h}x{d} MaxT {max_t} layer {LAYER}/{LAYERS}")
    cachestarts = np.asarray(starts, np.int64)
    batch = _Batch(PROMPTS)
    for step, new in enumerate([PROMPTS, (1, 1, 1), (1, 1, 1)]):
        seqstarts, start_pos, kvstarts = batch.step(new)
        slots = ppl.write_slots(cachestarts, seqstarts, start_pos, cache_mode=0, geometry=adapted.geometry)
        scn.write(slots, label=("prefill" if step == 0 else "decode") + f" of {list(new)} tokens")
    table, lens = ppl.gather_table(cachestarts, kvstarts, cache_mode=0, block_size=block_size)
    scn.gather(table, lens, int(lens.lengths.max()), label="kvstarts lengths from the cache starts")
    return scn, table, lens


#: cache_mode 1: (num_kv_heads, head_dim, MaxT, page_size, KVX block_size) per cache_layout
MODE1 = {0: (2, 64, 256, 16, 16), 1: (1, 128, 256, 32, 16), 2: (8, 128, 144, 16, 16), 3: (4, 256, 144, 16, 16)}
#: cache_mode 0: (num_kv_heads, head_dim, MaxT, cachestarts, KVX block_size) per cache_layout
MODE0 = {0: (2, 64, 192, (128, 0, 64), 16), 3: (1, 128, 192, (83, 0, 131), 1)}


def _mode1_test(layout):
    h, d, max_t, page, bs = MODE1[layout]

    @conformance(f"engine.ppl.cache_mode1.layout{layout}", CL, REQUIRED, "engines", ("write", "gather"))
    def test(kvx_provider, kvx_call_options, kvx_claims):
        _run_mode1(kvx_provider, kvx_call_options(), kvx_claims, layout, h, d, max_t, page, bs, 500 + 10 * layout)

    test.__name__ = test.__qualname__ = f"test_cache_mode1_layout{layout}"
    test.__doc__ = f"cache_layout {layout}, paged cachestarts: {h}x{d}, MaxT {max_t}, page_size {page}, KVX block {bs}"
    return test


def _mode0_test(layout):
    h, d, max_t, starts, bs = MODE0[layout]

    @conformance(f"engine.ppl.cache_mode0.layout{layout}", CL, REQUIRED, "engines", ("write", "gather"))
    def test(kvx_provider, kvx_call_options, kvx_claims):
        _run_mode0(kvx_provider, kvx_call_options(), kvx_claims, layout, h, d, max_t, starts, bs, 600 + 10 * layout)

    test.__name__ = test.__qualname__ = f"test_cache_mode0_layout{layout}"
    test.__doc__ = f"cache_layout {layout}, offset cachestarts {starts}: {h}x{d}, MaxT {max_t}, KVX block {bs}"
    return test


for _l in MODE1:
    globals()[f"test_cache_mode1_layout{_l}"] = _mode1_test(_l)
for _l in MODE0:
    globals()[f"test_cache_mode0_layout{_l}"] = _mode0_test(_l)


@conformance("engine.ppl.num_repeat.gather", CL + "; spec 6.8 (IO strides)", REQUIRED, "engines", "gather",
             feature="io_strides")
def test_num_repeat_output(kvx_provider, kvx_call_options, kvx_claims):
    """GQA ``num_repeat = 4``: a gather lands in the repeated output through a view of
    head stride ``4 * Dh`` (one of the ``num_repeat`` views); the gaps stay untouched."""
    h, d, max_t, layout, rep = 2, 64, 96, 2, 4
    cache = values(DType.F16, _shape(layout, max_t, h, d), 700)
    adapted = ppl.key_value_cache(cache, num_layer=LAYERS, layer_idx=LAYER, cache_layout=layout, cache_mode=0,
                                  block_size=16)
    scn = Scenario(kvx_provider, kvx_call_options(), kvx_claims, adapted, seed=700,
                   what=f"ppl.nn num_repeat {rep} output view, cache_layout {layout} 2x64")
    cachestarts, lens = np.array([48, 0], np.int64), np.array([32, 32])
    kvstarts = np.concatenate([[0], np.cumsum(lens)])
    table, seq_lens = ppl.gather_table(cachestarts, kvstarts, cache_mode=0, block_size=16)
    (view, _offset), *_ = ppl.repeat_output_views(int(lens.sum()), h, d, rep, DType.F16)
    scn.gather(table, seq_lens, 32, out_layout=view,
               label=f"into (T, H*{rep}, Dh) rows kvstarts {kvstarts.tolist()}, head stride {rep * d}")


@conformance("engine.ppl.refused.quant_bit8", CL_REFUSED, INFORMATIONAL, "engines")
def test_refused_quant():
    """int8 caches with per-group scales: no such KVX cache dtype."""
    cache = np.zeros(_shape(0, 32, 1, 8), np.float16)
    not_expressible(lambda: ppl.key_value_cache(cache, num_layer=LAYERS, layer_idx=0, quant_bit=8))


@conformance("engine.ppl.refused.off_grid_start", CL_REFUSED, INFORMATIONAL, "engines")
def test_refused_off_grid_start():
    """An offset-mode cache start that is not a multiple of the KVX block size chosen (16)."""
    not_expressible(lambda: ppl.gather_table(np.array([83, 0]), np.array([0, 20, 30]), cache_mode=0, block_size=16))
