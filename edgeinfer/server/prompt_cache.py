"""KV of sequences no slot holds any more, kept in RAM (llama-server's `--cache-ram`).

The block pool keeps the full blocks of finished sequences for as long as it has room; a
sequence whose slot is reclaimed (another request needs the blocks or the slot) also has its
K/V rows copied here first, partial last block included, and a later prompt that shares
their prefix gets them copied back into fresh blocks instead of prefilled, as llama-server
restores saved slot states. Least recently used entries are dropped beyond the byte budget.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from edgeinfer.server.prefix import PrefixTree

if TYPE_CHECKING:
    from edgeinfer.model import KVCache

MIN_TOKENS = 16  # shorter sequences cost less to prefill than to keep


class PromptCache:
    def __init__(self, kv_cache: KVCache, budget_bytes: int):
        """kv_cache: the model's (host and device parts), read and written through a slot's
        block table."""
        self.tree, self.kv_cache = PrefixTree(), kv_cache
        self.budget = budget_bytes
        self.entries: OrderedDict[int, tuple[int, tuple]] = OrderedDict()  # (bytes, cells)
        self.n_bytes = 0
        self._ids = itertools.count()

    def holds(self, entry: int) -> bool:
        return entry in self.entries

    def best(self, tokens: Sequence[int]) -> tuple[int, int]:
        """(entry, n): the entry sharing the longest prefix with tokens, n tokens of it;
        (-1, 0) if none shares any."""
        shared = self.tree.match(tokens)
        entry = max(shared, key=shared.get, default=-1)
        return (entry, shared[entry]) if entry >= 0 and shared[entry] > 0 else (-1, 0)

    def save(self, slot: int, tokens: Sequence[int], keep: int = -1) -> bool:
        """Keep slot `slot`'s K/V for `tokens` (the slot's cells 0..n-1) unless they are too
        short, already held whole by an entry, or would need entry `keep` (about to be
        restored) evicted to fit. True if a copy was made."""
        n = len(tokens)
        size = self.kv_cache.slot_bytes(n)
        kept = self.entries[keep][0] if keep in self.entries else 0
        if n < MIN_TOKENS or size > self.budget - kept:
            return False
        if any(shared == n for shared in self.tree.match(tokens).values()):
            return False
        while self.n_bytes + size > self.budget:
            self._drop(next(entry for entry in self.entries if entry != keep))
        entry = next(self._ids)
        self.entries[entry] = (size, self.kv_cache.read(slot, n))
        self.n_bytes += size
        self.tree.set(entry, tokens)
        return True

    def restore(self, entry: int, slot: int, n_tokens: int) -> None:
        """Copy the first n_tokens cells of `entry` into slot `slot`'s own blocks."""
        self.kv_cache.write(slot, self.entries[entry][1], n_tokens)
        self.entries.move_to_end(entry)

    def _drop(self, entry: int) -> None:
        size, _ = self.entries.pop(entry)
        self.n_bytes -= size
        self.tree.remove(entry)
