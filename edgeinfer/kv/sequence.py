"""A sequence's block table, and the admission arithmetic for a new request.

Position p of a sequence lives in row p % block_size of block `blocks[p // block_size]`; the
kernels read the tables of a batch as one (n_seq, max_blocks) int32 array (`table_row`).
A sequence writes only blocks it alone holds: matched blocks are full, so its first write
lands in a block from `reserve` or in the copy-on-write block made by `adopt`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgeinfer.kv.pool import BlockPool
from edgeinfer.kv.radix import Match, RadixCache

UNUSED = -1  # table entries past a sequence's last block


@dataclass(frozen=True)
class RowCopy:
    """Copy rows [0, n_rows) of block src into block dst, then `pool.unref(src)`."""

    src: int
    dst: int
    n_rows: int


class BlockTable:
    """The blocks one sequence holds, one reference each, in position order."""

    def __init__(self, pool: BlockPool):
        self.pool = pool
        self.blocks: list[int] = []

    @property
    def capacity(self) -> int:
        """Positions that have a block."""
        return len(self.blocks) * self.pool.block_size

    def adopt(self, match: Match) -> RowCopy | None:
        """Start an empty table from a match: take over its full blocks' references and, for a
        partial block, allocate a fresh block to copy its rows into. The returned RowCopy
        keeps the match's reference on the source until the caller has copied. On PoolFull
        nothing changes and the match still holds its references."""
        if self.blocks:
            raise ValueError("adopt needs an empty block table")
        copy = None
        if match.partial is not None:
            src, n_rows = match.partial
            copy = RowCopy(src, self.pool.alloc(), n_rows)
        self.blocks.extend(match.blocks)
        if copy is not None:
            self.blocks.append(copy.dst)
        return copy

    def reserve(self, n_tokens: int) -> None:
        """Make positions [0, n_tokens) have a block; on PoolFull none is taken."""
        size = self.pool.block_size
        need = -(-n_tokens // size) - len(self.blocks)
        if need > 0:
            self.blocks.extend(self.pool.alloc_many(need))

    def commit(self, cache: RadixCache, tokens: Sequence[int] | np.ndarray) -> int:
        """Register the full blocks of tokens (whose KV is computed) in the cache; where the
        cache already held a block for the same prefix, switch to it and release ours.
        Returns how many blocks were switched (rewrite the kernels' table row after)."""
        duplicates = cache.insert(tokens, self.blocks)
        for i, cached in duplicates:
            self.pool.ref(cached)
            self.pool.unref(self.blocks[i])
            self.blocks[i] = cached
        return len(duplicates)

    def release(self) -> None:
        """Give back every block, the last first (so a prefix's tail is evicted first)."""
        for block in reversed(self.blocks):
            self.pool.unref(block)
        self.blocks.clear()

    def table_row(self, out: np.ndarray) -> None:
        """Write the block ids into out, an int32 row of the kernels' table; UNUSED after."""
        n = len(self.blocks)
        if n > out.shape[0]:
            raise ValueError(f"{n} blocks do not fit a table row of {out.shape[0]}")
        out[:n] = self.blocks
        out[n:] = UNUSED


class Verdict(enum.Enum):
    ADMIT = "admit"  # enough free and evictable blocks now
    WAIT = "wait"  # fits the pool, not now: retry when sequences finish
    REJECT = "reject"  # more blocks than the whole pool: can never run


@dataclass(frozen=True)
class Admission:
    verdict: Verdict
    total: int  # blocks the request spans in all, shared ones included
    needed: int  # blocks it must allocate (total less the matched full blocks)
    available: int  # free and evictable blocks now
    capacity: int  # blocks in the pool


def admit(pool: BlockPool, n_tokens: int, match: Match | None = None) -> Admission:
    """Whether a request spanning n_tokens positions (prompt plus the tokens it may
    generate) can start, given what `match` (already taken) shares with it."""
    total = -(-n_tokens // pool.block_size)
    needed = max(0, total - (len(match.blocks) if match is not None else 0))
    if total > pool.n_blocks:
        verdict = Verdict.REJECT
    elif needed > pool.n_available:
        verdict = Verdict.WAIT
    else:
        verdict = Verdict.ADMIT
    return Admission(verdict, total, needed, pool.n_available, pool.n_blocks)
