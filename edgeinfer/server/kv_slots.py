"""The server's KV memory: one pool of blocks shared by every slot (issue 38).

The model's KV cache is a pool of fixed-size blocks (model.KVCache, built with kv_blocks);
each slot holds a BlockTable of the blocks its sequence uses, mirrored in its row of the
kernels' tables. Full blocks of computed prompts and answers are registered in a radix tree
(edgeinfer/kv/), so a request whose prompt starts with a cached prefix references those
blocks instead of copying or prefilling them; a partly matching block is copied (copy on
write). A slot keeps its blocks when its request ends (its next request, often the same
conversation's next turn, continues in place, partial last block included) until their
room is needed: then idle slots give their blocks back, least recently used first, their
sequences saved to the RAM cache (`--cache-ram`) on the way.

Admission is in blocks: a request starts when its prompt (and the first generated token)
fits in free, evictable or reclaimable blocks; a decoding sequence takes one block more
every B tokens, and when none is left the most recently started sequence is preempted
(its blocks registered and given back) and resumes later by prefilling what it had,
mostly from the tree again (vLLM's recompute preemption).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from edgeinfer.kv import BlockPool, BlockTable, Match, PoolFull, RadixCache
from edgeinfer.kv.prefix import common_prefix
from edgeinfer.server.prompt_cache import PromptCache

log = logging.getLogger("edgeinfer.server")


@dataclass
class Start:
    """Where a new sequence's first n_past cells come from."""

    n_past: int
    source: str  # "slot" (its own cells), "tree" (shared blocks) or "ram" (RAM cache copy)


class ServerKV:
    def __init__(self, kv_cache, n_slots: int, ram_bytes: int):
        self.kv = kv_cache  # model.KVCache, a pool (its tables start empty)
        self.block = kv_cache.block
        self.pool = BlockPool(kv_cache.n_blocks, self.block)
        self.radix = RadixCache(self.pool)
        self.tables = [BlockTable(self.pool) for _ in range(n_slots)]
        self.saved = PromptCache(kv_cache, ram_bytes)

    # -- sizes -------------------------------------------------------------------------------
    def blocks(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block)

    @property
    def n_cells(self) -> int:
        return self.pool.n_blocks * self.block

    def used_cells(self) -> int:
        """Cells in blocks some sequence holds (shared blocks once)."""
        return self.pool.n_used * self.block

    # -- one slot's table --------------------------------------------------------------------
    def _sync(self, slot: int) -> None:
        self.tables[slot].table_row(self.kv.tables[slot])

    def release(self, slot: int, tokens: Sequence[int] = (), save: bool = False) -> None:
        """Give back slot's blocks; its full blocks of `tokens` (computed) stay in the tree,
        and with `save` the whole sequence is copied to the RAM cache first."""
        if save and tokens:
            self.save_held(slot, tokens)
        if tokens:
            self.commit(slot, tokens)
        self.tables[slot].release()
        self._sync(slot)

    def commit(self, slot: int, tokens: Sequence[int]) -> None:
        """Register the full blocks of slot's computed cells `tokens` in the tree."""
        if len(tokens) >= self.block and self.tables[slot].commit(self.radix, tokens):
            self._sync(slot)

    def truncate(self, slot: int, n_tokens: int) -> None:
        """Keep slot's first n_tokens cells (their blocks), release the blocks after."""
        table = self.tables[slot]
        keep = self.blocks(n_tokens)
        for block in reversed(table.blocks[keep:]):
            self.pool.unref(block)
        del table.blocks[keep:]
        self._sync(slot)

    def grow(self, slot: int, n_tokens: int) -> bool:
        """Give slot blocks for n_tokens cells; False if the pool has no room."""
        try:
            self.tables[slot].reserve(n_tokens)
        except PoolFull:
            return False
        self._sync(slot)
        return True

    # -- starting a sequence -----------------------------------------------------------------
    def plan(self, slot: int, held: Sequence[int], tokens: Sequence[int], n_keep: int,
             reuse: bool, others: Sequence[tuple[int, Sequence[int]]] = ()
             ) -> tuple[Start, Match | None, int]:
        """The best source for the first cells of `tokens` (at most n_keep of them) in slot,
        which holds the cells of `held`: (start, the tree's match if that is the source, its
        references taken; the RAM entry if that is). `others`: (slot, cells) of the other
        slots, whose partly filled blocks the tree does not hold. Touches nothing else."""
        if not reuse:
            return Start(0, "slot"), None, -1
        own = min(common_prefix(held, tokens), n_keep)
        match = self._from_others(self.radix.match(tokens[:n_keep]), tokens[:n_keep], others)
        entry, n_ram = self.saved.best(tokens[:n_keep])
        n_ram = min(n_ram, n_keep)
        if own >= match.n_tokens and own >= n_ram:
            match.release(self.pool)
            return Start(own, "slot"), None, -1
        if match.n_tokens >= n_ram:
            return Start(match.n_tokens, "tree"), match, -1
        match.release(self.pool)
        return Start(n_ram, "ram"), None, entry

    def _from_others(self, match: Match, tokens: Sequence[int],
                     others: Sequence[tuple[int, Sequence[int]]]) -> Match:
        """match, its partial block taken from another slot's block at the same place where
        that holds more rows of tokens (a block still being filled is in no tree)."""
        i, size = len(match.blocks), self.block
        best, rows = None, match.partial[1] if match.partial else 0
        for other, cells in others:
            n = min(common_prefix(cells, tokens), (i + 1) * size) - i * size
            if n > rows and len(self.tables[other].blocks) > i:
                best, rows = self.tables[other].blocks[i], n
        if best is None:
            return match
        if match.partial is not None:
            self.pool.unref(match.partial[0])
        self.pool.ref(best)
        return Match(match.blocks, (best, rows), size)

    def prepare(self, slot: int, held: Sequence[int], start: Start, entry: int) -> int:
        """Free what slot's new sequence will not use: its held cells past start.n_past
        (all of them unless the source is the slot), saved to the RAM cache first and their
        full blocks left in the tree. Returns the cells slot still holds."""
        if len(held) > start.n_past:
            self.save_held(slot, held, keep=entry)
        self.commit(slot, held)
        kept = start.n_past if start.source == "slot" else 0
        self.truncate(slot, kept)
        return kept

    def blocks_needed(self, slot: int, start: Start, match: Match | None,
                      n_tokens: int) -> int:
        """Blocks the pool must hand out for slot's sequence of n_tokens cells (after
        `prepare`)."""
        table, total = self.tables[slot], self.blocks(n_tokens)
        if start.source == "tree":
            return total - len(match.blocks)  # the partial block's copy among them
        need = max(0, total - len(table.blocks))
        return need + (1 if self._shared_tail(slot, start.n_past) else 0)

    def begin(self, slot: int, start: Start, match: Match | None, entry: int,
              n_tokens: int) -> None:
        """Make slot's table hold the first start.n_past cells and room for n_tokens (the
        caller made sure the pool has it: `blocks_needed`)."""
        if start.source == "slot":
            self._own_tail(slot, start.n_past)
        elif start.source == "tree":
            log.debug("slot %d: updating prompt cache: %d tokens shared from cached blocks",
                      slot, start.n_past)
            copy = self.tables[slot].adopt(match)
            if copy is not None:
                self.kv.copy_rows(copy.src, copy.dst, copy.n_rows)
                self.pool.unref(copy.src)
            self._sync(slot)
        if not self.grow(slot, n_tokens):
            raise PoolFull(self.blocks(n_tokens), self.pool.n_available)
        if start.source == "ram":
            log.debug("slot %d: updating prompt cache: %d tokens restored", slot, start.n_past)
            self.saved.restore(entry, slot, start.n_past)

    def _shared_tail(self, slot: int, n_past: int) -> bool:
        """Whether the block that will hold cell n_past is shared (so is copied first)."""
        table, i = self.tables[slot], n_past // self.block
        if not n_past % self.block or i >= len(table.blocks):
            return False
        src = table.blocks[i]
        return self.pool.refcount(src) > 1 or self.pool.is_cached(src)

    def _own_tail(self, slot: int, n_past: int) -> None:
        """Before writing cell n_past: the block holding it must be slot's alone (a block
        in the tree or in another table is copied first)."""
        if self._shared_tail(slot, n_past):
            table, i = self.tables[slot], n_past // self.block
            src, dst = table.blocks[i], self.pool.alloc()
            self.kv.copy_rows(src, dst, n_past % self.block)
            table.blocks[i] = dst
            self.pool.unref(src)
            self._sync(slot)

    def save_held(self, slot: int, held: Sequence[int], keep: int = -1) -> None:
        """Copy slot's sequence to the RAM cache before it is overwritten."""
        if self.saved.save(slot, held, keep=keep):
            log.debug("slot %d: updating prompt cache: %d tokens saved", slot, len(held))

