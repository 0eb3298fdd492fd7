"""Engine-shaped scenario suites (profile "engines"; docs/engine-suites.md).

Each scenario allocates the cache the way an engine does (numpy arrays in the
engine's shapes and strides), describes it through ``kvx_conformance.adapters``,
makes block tables and slot mappings with ``kvx_conformance.adapters.block_manager`` (fixed
seeds, after allocate/free churn so block ids scatter), puts them into the engine's
own metadata format, and runs prefill / decode / chunked-prefill writes and gathers
against the provider on the run's memory type. Every call is checked against the
oracle bit-exactly, guards included (``_scenario.Scenario``).

| module | ids | engine concepts |
| --- | --- | --- |
| ``test_vllm`` | ``engine.vllm.{flash_nhd,flash_hnd,combined,paged,hybrid,dcp,fp8}.*`` | reshape_and_cache(_flash) caches, slot_mapping with CUDA-graph -1 padding, block_table, hybrid blocks, DCP |
| ``test_tgi`` | ``engine.tgi.{flashinfer,flashdecoding,paged,ragged}.*`` | BLOCK_SIZE 1 / 256 / 16, slots, block_tables_tensor, block_tables_ragged |
| ``test_trtllm`` | ``engine.trtllm.kv_offsets.*`` | KVBlockArray over a multi-layer pool, KVCacheIndex offsets, beams, secondary pool |
| ``test_flashinfer`` | ``engine.flashinfer.{nhd,hnd}.*`` | paged_kv_indptr / indices / last_page_len, ``[pages, 2, ...]`` caches |
| ``test_ppl`` | ``engine.ppl.cache_mode{0,1}.layout{0..3}`` | KeyValueCache cache_layout 0-3, cachestarts (offset and paged) |

Shapes (``_scenario.SHAPES``): 8 KV heads x 128 (Llama-3-8B), 1 x 128 (a 70B model at
tensor parallel 8), 2 x 64 and 4 x 256, with 16-token blocks unless the engine fixes
another size.

Levels. A scenario is ``required`` in profile ``engines``: it only calls the API in
ways the spec defines, so a wrong result is a conformance failure. The profile is
not certified unless claimed (``profiles: [core, engines]``); its per-engine summary
(``results.json`` key ``engines``, report section "Engines") is always shown. A
scenario that uses an optional feature the provider does not claim (HND_PACKED,
RAGGED, KV_OFFSETS, non-canonical strides, FP8, ...) may answer UNSUPPORTED: the
engine then "partly" works. Engine configurations KVX v1.1 cannot express
(``engine.*.refused.*``) are ``informational`` skips whose message starts with
"not expressible in KVX v1.1": recorded, never a failure.
"""
