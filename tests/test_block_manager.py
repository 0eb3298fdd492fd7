"""Block manager (seed 004): pool accounting, copy-on-write forks, failure atomicity,
fragmentation, and the KVX metadata it produces.

Repro: python -m pytest tests/test_block_manager.py -k <name>
(hypothesis runs derandomized: the same examples on every run.)
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvx_conformance.abi.header import DType, Status, TableFormat, TableFlags
from kvx_conformance.adapters import trtllm
from kvx_conformance.adapters.block_manager import BlockManager, OutOfBlocks

BS = 4


def oracle():
    return pytest.importorskip("kvx_conformance.reference_impl", reason="the numpy oracle is not installed")


def snapshot(m: BlockManager):
    return (list(m._free), list(m._ref), {s: (list(q.blocks), q.num_tokens, q.new_start) for s, q in m._seqs.items()})


def test_allocate_and_append_hand_out_blocks_in_queue_order():
    m = BlockManager(8, BS)
    assert m.allocate("a", 10) == [0, 1, 2]
    assert m.slot_mapping(["a"]).slots.tolist() == list(range(10))
    assert [m.ref_count(b) for b in range(4)] == [1, 1, 1, 0]
    s = m.append_tokens("a", 3)  # positions 10, 11 in block 2, 12 in a new block 3
    assert s.slots.tolist() == [10, 11, 12] and m.blocks("a") == [0, 1, 2, 3]
    assert m.append_tokens("a", 0).slots.tolist() == []
    assert m.num_free == 4
    m.check()


def test_out_of_blocks_changes_nothing():
    m = BlockManager(4, BS)
    m.allocate("a", 9)  # 3 blocks
    before = snapshot(m)
    with pytest.raises(OutOfBlocks, match="need 2, 1 free") as e:
        m.allocate("b", 5)
    assert (e.value.requested, e.value.free) == (2, 1)
    assert snapshot(m) == before
    with pytest.raises(OutOfBlocks):
        m.append_tokens("a", 8)  # 17 tokens need 5 blocks
    assert snapshot(m) == before
    m.check()


def test_out_of_blocks_with_a_pending_copy_on_write_changes_nothing():
    m = BlockManager(3, BS)
    m.allocate("p", 6)  # blocks 0, 1 (block 1 half full)
    m.fork("p", "c")
    m.allocate("x", 4)  # the last free block
    before = snapshot(m)
    with pytest.raises(OutOfBlocks, match="need 1, 0 free"):
        m.append_tokens("c", 1)  # needs a copy of shared block 1
    assert snapshot(m) == before and m.take_copies() == []
    m.check()


def test_fork_shares_blocks_and_copies_a_shared_partial_block_on_write():
    m = BlockManager(8, BS)
    m.allocate("p", 6)  # [0, 1], block 1 holds 2 tokens
    m.fork("p", "c")
    assert [m.ref_count(b) for b in (0, 1)] == [2, 2]
    assert m.slot_mapping(["c"]).slots.tolist() == []  # a fork appends nothing
    s = m.append_tokens("c", 1)
    assert m.blocks("c") == [0, 2] and m.blocks("p") == [0, 1]
    assert m.take_copies() == [(1, 2)] and m.take_copies() == []
    assert s.slots.tolist() == [2 * BS + 2]
    assert [m.ref_count(b) for b in (0, 1, 2)] == [2, 1, 1]
    # appending past a full shared block needs no copy
    m.allocate("q", 8)  # [3, 4], both full
    m.fork("q", "r")
    m.append_tokens("r", 1)
    assert m.take_copies() == [] and m.blocks("r") == [3, 4, 5]
    m.check()


def test_free_returns_blocks_to_the_back_of_the_queue_last_block_first():
    m = BlockManager(6, BS)
    m.allocate("a", 8)  # [0, 1]
    m.allocate("b", 4)  # [2]
    m.free("a")
    assert list(m._free) == [3, 4, 5, 1, 0]
    m.fork("b", "b2")
    m.free("b")
    assert m.ref_count(2) == 1 and 2 not in m._free  # still held by the fork
    m.free("b2")
    assert list(m._free)[-1] == 2
    with pytest.raises(KeyError, match="unknown sequence 'b'"):
        m.free("b")
    m.check()


def test_fragmentation_scatters_blocks_over_rounds():
    rng = np.random.default_rng(404)
    m = BlockManager(64, BS)
    live = []
    for i in range(200):
        if live and (rng.random() < 0.45 or m.num_free < 8):
            m.free(live.pop(int(rng.integers(len(live)))))
        else:
            m.allocate(i, int(rng.integers(1, 29)))
            live.append(i)
        m.check()
    scattered = [s for s in live if len(m.blocks(s)) > 1 and np.any(np.diff(m.blocks(s)) != 1)]
    assert scattered, "after 200 rounds some sequence should own non-contiguous blocks"
    for s in list(live):
        m.free(s)
    assert m.num_free == 64 and sorted(m._free) == list(range(64))


def test_metadata_tables_and_lengths():
    m = BlockManager(8, BS)
    m.allocate("a", 3)  # [0]
    m.allocate("b", 9)  # [1, 2, 3]
    m.free("a")  # queue: 4..7, 0
    m.allocate("c", 5)  # [4, 5]
    ids = ["b", "c"]
    assert m.seq_lens(ids).lengths.tolist() == [9, 5]
    t = m.packed_table(ids, pad_id=-1)
    assert (t.format, t.index_dtype) == (TableFormat.PACKED, DType.S32)
    assert t.indices.reshape(2, 3).tolist() == [[1, 2, 3], [4, 5, -1]]
    assert m.packed_table(ids, max_blocks_per_seq=4).max_blocks_per_seq == 4
    with pytest.raises(ValueError, match="max_blocks_per_seq is 2"):
        m.packed_table(ids, max_blocks_per_seq=2)
    r = m.ragged_table(ids)
    assert r.indices.tolist() == [1, 1, 1, 1, 2, 2, 2, 2, 3, 4, 4, 4, 4, 5]
    assert r.indptr.tolist() == [0, 9, 14]
    k = m.kv_offsets_table(ids, num_layers=2, secondary=[5])
    assert (k.format, k.flags, k.beam_width) == (TableFormat.KV_OFFSETS, int(TableFlags.KVCACHEINDEX), 1)
    offs = k.indices.reshape(2, 1, 2, 3)
    assert offs[0, 0].tolist() == [[4, 8, 12], [5, 9, 13]]  # block * 2 layers * 2, V = K + 1
    assert trtllm.decode_index(offs[1, 0, 0, 1]) == (20, True) and offs[1, 0, 0, 2] == trtllm.NULL_INDEX
    sm = m.slot_mapping(ids, pad_to=16)
    assert sm.slots.tolist()[:14] == [4, 5, 6, 7, 8, 9, 10, 11, 12, 16, 17, 18, 19, 20] and sm.slots[14:].tolist() == [-1, -1]


class PoolMachine(RuleBasedStateMachine):
    """Random allocate / append / fork / free against a simulated cache: every token a
    sequence appended is written through its slot mapping (copy-on-write copies applied),
    and a PACKED gather of every live sequence must return exactly its tokens."""

    NUM_BLOCKS = 24

    def __init__(self):
        super().__init__()
        self.m = BlockManager(self.NUM_BLOCKS, BS)
        self.cache = np.full(self.NUM_BLOCKS * BS, -1, np.int64)
        self.tokens: dict[int, list[int]] = {}
        self.next_id = 0
        self.next_token = 1000

    def _write_new(self, sid, slots):
        for src, dst in self.m.take_copies():
            self.cache[dst * BS:(dst + 1) * BS] = self.cache[src * BS:(src + 1) * BS]
        n = len(slots.slots)
        vals = list(range(self.next_token, self.next_token + n))
        self.next_token += n
        self.cache[slots.slots] = vals
        self.tokens[sid].extend(vals)

    @rule(n=st.integers(0, 20))
    def allocate(self, n):
        sid = self.next_id
        self.next_id += 1
        try:
            self.m.allocate(sid, n)
        except OutOfBlocks:
            assert sid not in self.m.seq_ids()
            return
        self.tokens[sid] = []
        self._write_new(sid, self.m.slot_mapping([sid]))

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), n=st.integers(0, 9))
    def append(self, data, n):
        sid = data.draw(st.sampled_from(sorted(self.tokens)))
        before = snapshot(self.m)
        try:
            slots = self.m.append_tokens(sid, n)
        except OutOfBlocks:
            assert snapshot(self.m) == before
            return
        self._write_new(sid, slots)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.tokens)))
        child = self.next_id
        self.next_id += 1
        self.m.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        sid = data.draw(st.sampled_from(sorted(self.tokens)))
        self.m.free(sid)
        del self.tokens[sid]

    @invariant()
    def pool_is_consistent(self):
        self.m.check()

    @invariant()
    def every_sequence_reads_its_tokens(self):
        ids = sorted(self.tokens)
        if not ids:
            return
        t = self.m.packed_table(ids)
        rows = t.indices.reshape(len(ids), t.max_blocks_per_seq)
        for i, sid in enumerate(ids):
            n = len(self.tokens[sid])
            pos = np.arange(n)
            got = self.cache[rows[i, pos // BS] * BS + pos % BS]
            assert got.tolist() == self.tokens[sid], sid

    def teardown(self):
        for sid in list(self.tokens):
            self.m.free(sid)
        self.m.check()
        assert self.m.num_free == self.NUM_BLOCKS, "a block leaked"


PoolMachine.TestCase.settings = settings(derandomize=True, database=None, max_examples=60, stateful_step_count=30, deadline=None)
TestPoolMachine = PoolMachine.TestCase


def test_manager_metadata_through_the_oracle_packed_ragged_kv_offsets():
    ref = oracle()
    rng = np.random.default_rng(8)
    H, D, NB = 2, 4, 16
    m = BlockManager(NB, BS)
    for i in range(6):  # fragment the pool first
        m.allocate(f"tmp{i}", int(rng.integers(1, 9)))
    for i in (4, 1, 5):
        m.free(f"tmp{i}")
    m.allocate("a", 7)
    m.allocate("b", 3)
    m.fork("a", "a2")
    tokens = {s: [] for s in ("a", "b", "a2")}
    pool = np.zeros((NB, 1, 2, H, BS, D), np.float32)  # TRT-LLM pool of one layer
    cache = trtllm.block_array(pool, layer_idx=0, num_kv_heads=H, tokens_per_block=BS, head_dim=D)

    def write(seq_ids):
        for src, dst in m.take_copies():
            pool[dst] = pool[src]
        slots = m.slot_mapping(seq_ids)
        key = rng.standard_normal((len(slots.slots), H, D)).astype(np.float32)
        res = ref.expected_write(cache.write_case(key, -key, slots))
        assert res.status == Status.OK, res
        cache.load(res.arrays)
        i = 0
        for s in seq_ids:
            n = m.num_tokens(s) - m._seqs[s].new_start
            tokens[s].extend(key[i:i + n])
            i += n

    write(["a", "b"])
    tokens["a2"] = list(tokens["a"])
    for s, n in (("a2", 3), ("b", 6), ("a", 2)):
        m.append_tokens(s, n)
        write([s])
    m.check()
    ids = ["a", "b", "a2"]
    lens = m.seq_lens(ids)
    max_len = 12
    tables = [m.packed_table(ids), m.ragged_table(ids), m.kv_offsets_table(ids, num_layers=1)]
    for table in tables:
        g = ref.expected_gather(cache.gather_case(table, lens, max_len))
        assert g.status == Status.OK, (table.format, g)
        out_k = g.arrays["k"].reshape(len(ids), max_len, H, D)
        out_v = g.arrays["v"].reshape(len(ids), max_len, H, D)
        for i, s in enumerate(ids):
            n = len(tokens[s])
            np.testing.assert_array_equal(out_k[i, :n], np.array(tokens[s]), err_msg=f"{table.format.name} {s}")
            np.testing.assert_array_equal(out_v[i, :n], -np.array(tokens[s]), err_msg=f"{table.format.name} {s}")
