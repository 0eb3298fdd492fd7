"""A paged-cache block manager that produces realistic KVX metadata (seed 004).

A pool of ``num_blocks`` blocks of ``block_size`` tokens with reference counts and
a FIFO free queue (a freed block goes to the back, so after rounds of allocation
and release sequences own scattered, non-contiguous blocks, as in a serving
engine). Sequences share prefix blocks after :meth:`BlockManager.fork`; appending
into a shared, partly filled last block copies it first (copy-on-write: the copy
is recorded in :meth:`BlockManager.take_copies` for the caller to perform on the
cache). Every failing call raises before changing anything: :class:`OutOfBlocks`
leaks no block.

The metadata methods return KVX descriptors: the slot mapping of the tokens each
sequence appended last, PACKED / RAGGED / KV_OFFSETS tables and seq lens.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Sequence

import numpy as np

from ..abi.descriptors import BlockTable, SeqLens, SlotMapping
from ..abi.header import DType
from .common import ragged_table
from .trtllm import PoolBlock, block_offsets


class OutOfBlocks(RuntimeError):
    """Not enough free blocks; the manager's state is as before the call."""

    def __init__(self, requested: int, free: int):
        super().__init__(f"out of KV cache blocks: need {requested}, {free} free")
        self.requested = requested
        self.free = free


@dataclass
class _Seq:
    blocks: list[int] = field(default_factory=list)
    num_tokens: int = 0
    #: tokens appended by the last allocate / append_tokens call: [new_start, num_tokens)
    new_start: int = 0


def _blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._seqs: dict[Hashable, _Seq] = {}
        self._copies: list[tuple[int, int]] = []

    # ------------------------------------------------------------------ state

    @property
    def num_free(self) -> int:
        return len(self._free)

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    def blocks(self, seq_id: Hashable) -> list[int]:
        return list(self._seq(seq_id).blocks)

    def num_tokens(self, seq_id: Hashable) -> int:
        return self._seq(seq_id).num_tokens

    def seq_ids(self) -> list[Hashable]:
        return list(self._seqs)

    def _seq(self, seq_id: Hashable) -> _Seq:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise KeyError(f"unknown sequence {seq_id!r}") from None

    def _take(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfBlocks(n, len(self._free))
        out = [self._free.popleft() for _ in range(n)]
        for b in out:
            self._ref[b] = 1
        return out

    def _release(self, block: int) -> None:
        self._ref[block] -= 1
        if self._ref[block] == 0:
            self._free.append(block)

    # -------------------------------------------------------------- lifecycle

    def allocate(self, seq_id: Hashable, num_tokens: int) -> list[int]:
        """A new sequence holding ``num_tokens`` (its prompt); returns its blocks."""
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} already exists")
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        blocks = self._take(_blocks_for(num_tokens, self.block_size))
        self._seqs[seq_id] = _Seq(blocks, num_tokens, 0)
        return list(blocks)

    def append_tokens(self, seq_id: Hashable, num_tokens: int) -> SlotMapping:
        """Grow a sequence by ``num_tokens``; returns the slots of the new tokens.

        A shared last block that still has room is copied first (copy-on-write), so
        the new tokens never land in a block another sequence reads.
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        seq = self._seq(seq_id)
        bs = self.block_size
        partial = seq.num_tokens % bs != 0
        cow = num_tokens > 0 and partial and self._ref[seq.blocks[-1]] > 1
        grow = _blocks_for(seq.num_tokens + num_tokens, bs) - len(seq.blocks)
        fresh = self._take(grow + int(cow))  # raises before any change
        if cow:
            src, dst = seq.blocks[-1], fresh.pop()
            self._release(src)
            seq.blocks[-1] = dst
            self._copies.append((src, dst))
        seq.blocks.extend(fresh)
        seq.new_start = seq.num_tokens
        seq.num_tokens += num_tokens
        return self.slot_mapping([seq_id])

    def fork(self, parent: Hashable, child: Hashable) -> None:
        """``child`` shares every block of ``parent`` (reference counts + 1)."""
        if child in self._seqs:
            raise ValueError(f"sequence {child!r} already exists")
        p = self._seq(parent)
        for b in p.blocks:
            self._ref[b] += 1
        self._seqs[child] = _Seq(list(p.blocks), p.num_tokens, p.num_tokens)

    def free(self, seq_id: Hashable) -> None:
        """Drop a sequence; blocks nobody else holds go back to the free queue
        (last block first, so a tail is reused before a shared prefix)."""
        seq = self._seq(seq_id)
        del self._seqs[seq_id]
        for b in reversed(seq.blocks):
            self._release(b)

    def take_copies(self) -> list[tuple[int, int]]:
        """Copy-on-write copies ``(src_block, dst_block)`` made since the last call."""
        out, self._copies = self._copies, []
        return out

    # --------------------------------------------------------------- checking

    def check(self) -> None:
        """Raise AssertionError unless the pool is consistent: every block is either
        free (count 0, queued once) or held, with a count equal to its holders."""
        holders = [0] * self.num_blocks
        for sid, seq in self._seqs.items():
            assert len(seq.blocks) == _blocks_for(seq.num_tokens, self.block_size), f"{sid!r}: blocks do not match tokens"
            assert len(set(seq.blocks)) == len(seq.blocks), f"{sid!r} holds a block twice"
            for b in seq.blocks:
                holders[b] += 1
        assert holders == self._ref, "reference counts differ from the holders"
        free = list(self._free)
        assert len(set(free)) == len(free), "a block is queued twice"
        assert set(free) == {b for b in range(self.num_blocks) if self._ref[b] == 0}, "free queue differs from unreferenced blocks"

    # --------------------------------------------------------------- metadata

    def slot_mapping(self, seq_ids: Sequence[Hashable], pad_to: int | None = None, dtype: DType = DType.S64) -> SlotMapping:
        """Slots of the tokens each sequence appended last, in ``seq_ids`` order,
        padded with -1 up to ``pad_to`` tokens."""
        bs = self.block_size
        parts = []
        for sid in seq_ids:
            seq = self._seq(sid)
            pos = np.arange(seq.new_start, seq.num_tokens, dtype=np.int64)
            blocks = np.asarray(seq.blocks, dtype=np.int64)
            parts.append(blocks[pos // bs] * bs + pos % bs if len(pos) else pos)
        slots = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        if pad_to is not None:
            if pad_to < len(slots):
                raise ValueError(f"pad_to {pad_to} is below the {len(slots)} new tokens")
            slots = np.concatenate([slots, np.full(pad_to - len(slots), -1, np.int64)])
        return SlotMapping(slots, dtype=dtype, invalid_slot=-1)

    def seq_lens(self, seq_ids: Sequence[Hashable], dtype: DType = DType.S32) -> SeqLens:
        return SeqLens(np.asarray([self._seq(s).num_tokens for s in seq_ids], dtype=np.int64), dtype=dtype)

    def packed_table(
        self, seq_ids: Sequence[Hashable], pad_id: int = 0, max_blocks_per_seq: int | None = None,
        index_dtype: DType = DType.S32,
    ) -> BlockTable:
        rows = [self._seq(s).blocks for s in seq_ids]
        width = max((len(r) for r in rows), default=0) if max_blocks_per_seq is None else max_blocks_per_seq
        table = np.full((len(rows), width), pad_id, dtype=np.int64)
        for i, r in enumerate(rows):
            if len(r) > width:
                raise ValueError(f"sequence {seq_ids[i]!r} holds {len(r)} blocks, max_blocks_per_seq is {width}")
            table[i, : len(r)] = r
        return BlockTable.packed(table, index_dtype=index_dtype)

    def ragged_table(self, seq_ids: Sequence[Hashable], index_dtype: DType = DType.S32) -> BlockTable:
        seqs = [self._seq(s) for s in seq_ids]
        return ragged_table([np.asarray(s.blocks) for s in seqs], [s.num_tokens for s in seqs], self.block_size, index_dtype)

    def kv_offsets_table(
        self, seq_ids: Sequence[Hashable], *, beam_width: int = 1, num_layers: int = 1,
        secondary: Iterable[int] = (), max_blocks_per_seq: int | None = None,
    ) -> BlockTable:
        """KV_OFFSETS (TensorRT-LLM) for a ``[num_blocks, num_layers, 2, H, T, D]`` pool;
        blocks listed in ``secondary`` are marked as living in the secondary pool."""
        sec = set(secondary)
        lists = [[PoolBlock(b, b in sec) for b in self._seq(s).blocks] for s in seq_ids]
        offsets = block_offsets(lists, beam_width=beam_width, num_layers=num_layers, max_blocks_per_seq=max_blocks_per_seq)
        return BlockTable.kv_offsets(offsets.astype(np.int64))
