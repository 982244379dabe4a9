"""KV of sequences no slot holds any more, kept in RAM (llama-server's `--cache-ram`).

With N slots the radix tree can only reuse what N sequences left behind. When a slot is
about to be overwritten, its K/V rows are copied here first; a later prompt that shares
their prefix gets them copied back instead of prefilled, as llama-server restores saved
slot states. Entries live in the engine's PrefixTree under ids >= n_slots, so one lookup
ranks slots and saved sequences together. Least recently used entries are dropped beyond the
byte budget.
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
    def __init__(self, tree: PrefixTree, kv_cache: KVCache, budget_bytes: int):
        """kv_cache: the model's (host and device parts); entry ids start after the last
        slot."""
        self.tree, self.kv_cache = tree, kv_cache
        self.budget = budget_bytes
        self.entries: OrderedDict[int, tuple[int, tuple]] = OrderedDict()  # (bytes, cells)
        self.n_bytes = 0
        self._ids = itertools.count(kv_cache.n_slots)

    def holds(self, entry: int) -> bool:
        return entry in self.entries

    def save(self, slot: int, tokens: Sequence[int], keep: int = -1) -> bool:
        """Keep slot `slot`'s K/V for `tokens` (the slot's cells 0..n-1) unless they are too
        short, already held whole by another slot or entry, or would need entry `keep` (about
        to be restored) evicted to fit. True if a copy was made."""
        n = len(tokens)
        size = self.kv_cache.slot_bytes(n)
        if n < MIN_TOKENS or size > self.budget - (self._size(keep) if keep in self.entries else 0):
            return False
        if any(shared == n for other, shared in self.tree.match(tokens).items() if other != slot):
            return False
        while self.n_bytes + size > self.budget:
            oldest = next(entry for entry in self.entries if entry != keep)
            self._drop(oldest)
        entry = next(self._ids)
        self.entries[entry] = (size, self.kv_cache.read(slot, n))
        self.n_bytes += size
        self.tree.set(entry, tokens)
        return True

    def restore(self, entry: int, slot: int, n_tokens: int) -> None:
        """Copy the first n_tokens cells of `entry` into slot `slot`."""
        self.kv_cache.write(slot, self.entries[entry][1], n_tokens)
        self.entries.move_to_end(entry)

    def _size(self, entry: int) -> int:
        return self.entries[entry][0]

    def _drop(self, entry: int) -> None:
        size, _ = self.entries.pop(entry)
        self.n_bytes -= size
        self.tree.remove(entry)
