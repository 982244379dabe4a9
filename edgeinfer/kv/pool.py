"""BlockPool: the fixed-size blocks of the paged KV cache, shared by every sequence.

Each block is in exactly one state:
  free       refcount 0, not cached: on the free list;
  evictable  refcount 0, cached: holds a prefix the radix tree can hand out again, kept until
             `alloc` needs room (leaves only, least recently released first);
  used       refcount > 0: in some sequence's block table, or held while its rows are copied.

The pool also keeps the cached blocks' tree shape (parent, number of cached children), so it
can tell a leaf from an inner node without asking the tree: evicting an inner node would strand
its children. `RadixCache` registers blocks with `cache` and is told of evictions by `on_evict`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np

ROOT = -1  # parent of the cached blocks that start a sequence


class PoolFull(RuntimeError):
    """Not enough free or evictable blocks; nothing was allocated by the failing call."""

    def __init__(self, needed: int, available: int):
        super().__init__(f"KV block pool full: {needed} blocks needed, {available} available")
        self.needed, self.available = needed, available


def block_nbytes(n_layer: int, n_head_kv: int, head_dim: int, block_size: int,
                 dtype_bytes: int = 2) -> int:
    """Bytes of one block: keys and values of block_size positions in every layer."""
    return 2 * n_layer * n_head_kv * head_dim * block_size * dtype_bytes


class BlockPool:
    """n_blocks blocks (ids 0..n_blocks-1) of block_size positions each."""

    def __init__(self, n_blocks: int, block_size: int):
        if n_blocks < 1 or block_size < 1:
            raise ValueError(f"need n_blocks >= 1 and block_size >= 1, got {n_blocks}, "
                             f"{block_size}")
        self.n_blocks, self.block_size = n_blocks, block_size
        # per block, lists rather than arrays: every access is one scalar from Python
        self._refs = [0] * n_blocks
        self._cached = [False] * n_blocks  # holds a prefix registered in the radix tree
        self._parent = [ROOT] * n_blocks  # the cached block this one extends
        self._n_children = [0] * n_blocks  # cached blocks that extend this one
        self._released = [0] * n_blocks  # tick at which the refcount last fell to 0
        self._tick = 0
        self._free = list(range(n_blocks - 1, -1, -1))  # a stack: block 0 is handed out first
        # heap of (tick, block) for evictable leaves; entries made stale by a later ref, a new
        # child or an eviction stay in it and are skipped when popped (lazy deletion)
        self._lru: list[tuple[int, int]] = []
        self._n_used = 0
        self.on_evict: Callable[[int], None] | None = None  # the radix tree drops the node

    # counters
    @property
    def n_free(self) -> int:
        return len(self._free)

    @property
    def n_used(self) -> int:
        return self._n_used

    @property
    def n_evictable(self) -> int:
        return self.n_blocks - len(self._free) - self._n_used

    @property
    def n_available(self) -> int:
        """Blocks `alloc` can hand out now: free, then evicted."""
        return self.n_blocks - self._n_used

    def used_bytes(self, bytes_per_block: int) -> int:
        return self._n_used * bytes_per_block

    def cached_bytes(self, bytes_per_block: int) -> int:
        """Bytes held only as cache (evictable)."""
        return self.n_evictable * bytes_per_block

    def refcount(self, block: int) -> int:
        return self._refs[block]

    def is_cached(self, block: int) -> bool:
        return self._cached[block]

    def parent(self, block: int) -> int:
        return self._parent[block]

    def refcounts(self) -> np.ndarray:
        """A snapshot of every block's refcount, (n_blocks,) int32."""
        return np.array(self._refs, np.int32)

    # references
    def alloc(self) -> int:
        """One block with refcount 1: a free one, else the least recently used evictable
        leaf (evicted from the tree first); PoolFull if there is neither."""
        if self._free:
            block = self._free.pop()
        else:
            block = self._evict_one()
            if block is None:
                raise PoolFull(1, 0)
        self._refs[block] = 1
        self._n_used += 1
        return block

    def alloc_many(self, n: int) -> list[int]:
        """n blocks, or PoolFull with none taken."""
        if n > self.n_available:
            raise PoolFull(n, self.n_available)
        blocks: list[int] = []
        try:
            for _ in range(n):
                blocks.append(self.alloc())
        except PoolFull:  # evictable inner nodes under a held block: cannot be reached now
            for block in reversed(blocks):
                self.unref(block)
            raise PoolFull(n, len(blocks)) from None
        return blocks

    def ref(self, block: int) -> None:
        """One more holder of a used or evictable block."""
        refs = self._refs[block]
        if refs == 0:
            if not self._cached[block]:
                raise ValueError(f"block {block} is free: allocate it instead")
            self._n_used += 1  # evictable -> used; its heap entry is now stale
        self._refs[block] = refs + 1

    def unref(self, block: int) -> None:
        """One holder fewer; at 0 the block becomes evictable if cached, else free."""
        refs = self._refs[block]
        if refs <= 0:
            raise ValueError(f"block {block} is not referenced")
        self._refs[block] = refs - 1
        if refs == 1:
            self._n_used -= 1
            if self._cached[block]:
                self._tick += 1
                self._released[block] = self._tick
                self._push_if_leaf(block)
            else:
                self._free.append(block)

    # the radix tree's side
    def cache(self, block: int, parent: int) -> None:
        """Mark a used block as holding a cached prefix that extends `parent` (ROOT for the
        first block of a sequence): when its refcount falls to 0 it is kept, not freed."""
        if self._refs[block] <= 0 or self._cached[block]:
            raise ValueError(f"block {block} must be used and not yet cached")
        if parent != ROOT:
            if not self._cached[parent]:
                raise ValueError(f"parent block {parent} is not cached")
            self._n_children[parent] += 1
        self._cached[block], self._parent[block] = True, parent

    def evict(self, n: int = 1) -> int:
        """Free up to n evictable leaves, least recently released first; how many were."""
        done = 0
        while done < n:
            block = self._evict_one()
            if block is None:
                break
            self._free.append(block)
            done += 1
        return done

    def _evict_one(self) -> int | None:
        while self._lru:
            tick, block = heapq.heappop(self._lru)
            if tick == self._released[block] and self._is_evictable_leaf(block):
                break
        else:
            return None
        parent = self._parent[block]
        self._cached[block], self._parent[block] = False, ROOT
        if parent != ROOT:
            self._n_children[parent] -= 1
            self._push_if_leaf(parent)  # an inner node may have become a leaf
        if self.on_evict is not None:
            self.on_evict(block)
        return block

    def _is_evictable_leaf(self, block: int) -> bool:
        return (self._refs[block] == 0 and self._cached[block]
                and self._n_children[block] == 0)

    def _push_if_leaf(self, block: int) -> None:
        if self._is_evictable_leaf(block):
            heapq.heappush(self._lru, (self._released[block], block))
            if len(self._lru) > 2 * self.n_blocks + 16:  # drop the stale entries
                live = {(t, b) for t, b in self._lru
                        if t == self._released[b] and self._is_evictable_leaf(b)}
                self._lru = list(live)
                heapq.heapify(self._lru)

    def check(self) -> None:
        """Raise AssertionError unless the bookkeeping is consistent (for tests)."""
        n = self.n_blocks
        free = set(self._free)
        _require(len(free) == len(self._free), "a block is on the free list twice")
        for b in range(n):
            refs, cached = self._refs[b], self._cached[b]
            _require(refs >= 0, f"block {b} has refcount {refs}")
            _require((b in free) == (refs == 0 and not cached), f"block {b} free list state")
            if not cached:
                _require(self._n_children[b] == 0 and self._parent[b] == ROOT,
                         f"uncached block {b} has tree links")
            p = self._parent[b]
            _require(p == ROOT or self._cached[p], f"block {b}'s parent {p} is not cached")
        _require(self._n_used == sum(r > 0 for r in self._refs), "n_used is off")
        children = [0] * n
        for b in range(n):
            if self._cached[b] and self._parent[b] != ROOT:
                children[self._parent[b]] += 1
        _require(children == self._n_children, "child counts are off")
        queued = {b for t, b in self._lru if t == self._released[b]}
        for b in range(n):
            if self._is_evictable_leaf(b):
                _require(b in queued, f"evictable leaf {b} is not in the LRU heap")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)
