"""The paged KV cache's memory manager (edgeinfer/kv): unit tests of the pool, the radix
cache and the block table, then a hypothesis state machine of many sequences sharing a small
pool, checked against a shadow of what each block holds."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from edgeinfer.kv import (
    ROOT,
    UNUSED,
    BlockPool,
    BlockTable,
    PoolFull,
    RadixCache,
    RowCopy,
    Verdict,
    admit,
    block_nbytes,
)


def computed(pool: BlockPool, cache: RadixCache, tokens: list[int]) -> BlockTable:
    """A sequence that computed tokens from scratch and registered its full blocks."""
    table = BlockTable(pool)
    table.reserve(len(tokens))
    table.commit(cache, tokens)
    return table


# --- BlockPool


def test_pool_counters_and_free_list():
    pool = BlockPool(4, 16)
    assert (pool.n_free, pool.n_used, pool.n_evictable) == (4, 0, 0)
    a, b = pool.alloc(), pool.alloc()
    assert (a, b) == (0, 1)
    assert (pool.n_free, pool.n_used, pool.n_available) == (2, 2, 2)
    assert pool.used_bytes(1000) == 2000
    pool.ref(a)
    assert pool.refcount(a) == 2
    pool.unref(a)
    pool.unref(a)
    assert pool.refcount(a) == 0 and pool.n_free == 3
    assert pool.alloc() == a  # the free list is a stack
    pool.check()


def test_pool_misuse_raises_and_changes_nothing():
    pool = BlockPool(2, 2)
    with pytest.raises(ValueError):
        pool.unref(0)  # free
    with pytest.raises(ValueError):
        pool.ref(1)  # free: allocate it instead
    with pytest.raises(ValueError):
        BlockPool(0, 16)
    with pytest.raises(ValueError):
        BlockPool(4, 0)
    block = pool.alloc()
    with pytest.raises(ValueError):
        pool.cache(block, parent=1)  # parent not cached
    pool.check()


def test_pool_full_is_clean():
    pool = BlockPool(3, 1)
    held = pool.alloc_many(2)
    with pytest.raises(PoolFull) as err:
        pool.alloc_many(2)
    assert (err.value.needed, err.value.available) == (2, 1)
    assert pool.n_free == 1 and pool.n_used == 2  # nothing taken
    pool.alloc()
    with pytest.raises(PoolFull):
        pool.alloc()
    for block in held:
        pool.unref(block)
    assert pool.n_free == 2
    pool.check()


def test_a_failed_alloc_many_keeps_the_cache():
    pool = BlockPool(2, 1)
    cached, held = pool.alloc_many(2)
    pool.cache(cached, ROOT)
    pool.unref(cached)
    with pytest.raises(PoolFull):
        pool.alloc_many(2)  # only one available: found out before evicting anything
    assert pool.is_cached(cached) and pool.n_evictable == 1
    pool.check()


def test_cached_block_outlives_its_references_until_evicted():
    pool = BlockPool(2, 4)
    dropped = []
    pool.on_evict = dropped.append
    a = pool.alloc()
    pool.cache(a, ROOT)
    pool.unref(a)
    assert (pool.n_free, pool.n_evictable, pool.n_used) == (1, 1, 0)
    assert pool.cached_bytes(10) == 10
    pool.ref(a)  # a cache hit revives it
    assert (pool.n_evictable, pool.n_used) == (0, 1)
    pool.unref(a)
    b = pool.alloc()  # the free block first
    assert b != a and dropped == []
    c = pool.alloc()  # then the evictable one, evicted
    assert c == a and dropped == [a] and not pool.is_cached(a)
    assert pool.refcount(c) == 1
    pool.check()


def test_eviction_takes_leaves_least_recently_released_first():
    pool = BlockPool(6, 1)
    order = []
    pool.on_evict = order.append
    chain = pool.alloc_many(3)  # 0 -> 1 -> 2
    for parent, block in zip([ROOT] + chain, chain):
        pool.cache(block, parent)
    other = pool.alloc()  # 3, its own chain of one
    pool.cache(other, ROOT)
    for block in chain:  # released root first: the root is the least recent, yet inner
        pool.unref(block)
    pool.unref(other)
    pool.check()
    assert pool.evict(1) == 1 and order == [2]  # the leaf, not the older inner node
    assert pool.evict(10) == 3 and order == [2, 1, 0, 3]  # parents become leaves in turn
    assert pool.n_free == 6 and pool.n_evictable == 0
    pool.check()


def test_referenced_child_keeps_its_parent():
    pool = BlockPool(2, 1)
    parent, child = pool.alloc_many(2)
    pool.cache(parent, ROOT)
    pool.cache(child, parent)
    pool.unref(parent)  # evictable, but an inner node while child is held
    assert pool.n_evictable == 1 and pool.n_available == 1
    with pytest.raises(PoolFull):  # cannot be reached now; the rollback leaves it cached
        pool.alloc_many(1)
    assert pool.is_cached(parent) and pool.n_evictable == 1
    pool.check()


def test_lru_heap_stays_bounded():
    pool = BlockPool(3, 1)
    block = pool.alloc()
    pool.cache(block, ROOT)
    for _ in range(1000):
        pool.unref(block)
        pool.ref(block)
    assert len(pool._lru) <= 2 * pool.n_blocks + 17
    pool.unref(block)
    pool.check()
    assert pool.evict(3) == 1


def test_block_nbytes():
    # keys and values, 22 layers, 4 KV heads of 64, 16 positions, F16
    assert block_nbytes(22, 4, 64, 16) == 2 * 22 * 4 * 64 * 16 * 2


# --- RadixCache


@pytest.mark.parametrize("size", [1, 2, 16])
def test_match_full_blocks_takes_references(size):
    pool = BlockPool(8, size)
    cache = RadixCache(pool)
    tokens = list(range(3 * size))
    seq = computed(pool, cache, tokens)
    assert len(cache) == 3
    match = cache.match(tokens + [99])
    assert match.blocks == tuple(seq.blocks)
    assert match.partial is None and match.n_tokens == 3 * size
    assert all(pool.refcount(b) == 2 for b in seq.blocks)
    seq.release()
    match.release(pool)
    assert pool.n_evictable == 3 and pool.n_used == 0
    assert cache.match([]).blocks == () and cache.match([7]).blocks == ()
    pool.check()


def test_match_partial_last_block():
    pool = BlockPool(8, 4)
    cache = RadixCache(pool)
    seq = computed(pool, cache, [0, 1, 2, 3, 4, 5, 6, 7])
    b0, b1 = seq.blocks
    match = cache.match([0, 1, 2, 3, 4, 5])  # fewer tokens than a block left
    assert match.blocks == (b0,) and match.partial == (b1, 2) and match.n_tokens == 6
    assert pool.refcount(b1) == 2  # held until copied
    match.release(pool)
    match = cache.match([0, 1, 2, 3, 4, 5, 9, 9, 9])  # a block that differs in its third row
    assert match.blocks == (b0,) and match.partial == (b1, 2)
    match.release(pool)
    assert cache.match([5, 1]).partial is None  # nothing shares the first token
    seq.release()
    pool.check()


def test_partial_picks_the_longest_shared_prefix():
    pool = BlockPool(8, 4)
    cache = RadixCache(pool)
    short = computed(pool, cache, [1, 2, 8, 8])
    long = computed(pool, cache, [1, 2, 3, 8])
    match = cache.match([1, 2, 3, 4])
    assert match.blocks == () and match.partial == (long.blocks[0], 3)
    match.release(pool)
    match = cache.match([1, 2])
    assert match.partial is not None and match.partial[1] == 2
    match.release(pool)
    short.release()
    long.release()
    pool.check()


def test_block_size_one_has_no_partial_blocks():
    pool = BlockPool(4, 1)
    cache = RadixCache(pool)
    seq = computed(pool, cache, [3, 4])
    match = cache.match([3, 5])
    assert match.blocks == (seq.blocks[0],) and match.partial is None
    match.release(pool)
    seq.release()


def test_insert_reports_duplicates_and_extends_the_cached_path():
    pool = BlockPool(8, 2)
    cache = RadixCache(pool)
    first = computed(pool, cache, [1, 2, 3, 4])
    second = BlockTable(pool)  # computed the same prefix meanwhile, and one block more
    second.reserve(6)
    mine = list(second.blocks)
    assert cache.insert([1, 2, 3, 4, 5, 6], mine) == [(0, first.blocks[0]),
                                                      (1, first.blocks[1])]
    assert mine[2] in cache and pool.parent(mine[2]) == first.blocks[1]
    assert second.commit(cache, [1, 2, 3, 4, 5, 6]) == 2  # switch to the cached blocks
    assert second.blocks == first.blocks + [mine[2]]
    assert pool.refcount(mine[0]) == 0 and pool.n_free == 8 - 3  # ours went back
    match = cache.match([1, 2, 3, 4, 5, 6])
    assert match.blocks == tuple(second.blocks)
    match.release(pool)
    first.release()
    second.release()
    pool.check()


def test_insert_misuse():
    pool = BlockPool(4, 2)
    cache = RadixCache(pool)
    with pytest.raises(ValueError):
        cache.insert([1, 2], [0])  # block 0 is free: the caller holds no reference
    seq = computed(pool, cache, [1, 2])
    with pytest.raises(ValueError):
        cache.insert([7, 7], seq.blocks)  # already cached for [1, 2]
    with pytest.raises(ValueError):
        RadixCache(pool)  # one tree per pool
    assert cache.insert([1], seq.blocks) == [] and len(cache) == 1  # no full block


def test_eviction_drops_nodes_leaf_first():
    pool = BlockPool(3, 2)
    cache = RadixCache(pool)
    computed(pool, cache, [1, 2, 3, 4, 5, 6]).release()
    assert len(cache) == 3 and pool.n_evictable == 3
    assert cache.evict(1) == 1
    match = cache.match([1, 2, 3, 4, 5, 6])
    assert len(match.blocks) == 2  # the tail went first
    match.release(pool)
    seq = BlockTable(pool)
    seq.reserve(6)  # evicts the rest for room
    assert len(cache) == 0 and cache.match([1, 2]).blocks == ()
    assert cache.root.children == {}
    seq.release()
    assert pool.n_free == 3
    pool.check()


def test_numpy_tokens_make_int_keys():
    pool = BlockPool(4, 2)
    cache = RadixCache(pool)
    seq = computed(pool, cache, np.array([5, 6, 7, 8], np.int32))
    (key,) = cache.root.children
    assert key == (5, 6) and all(type(t) is int for t in key)
    match = cache.match(np.array([5, 6, 7, 8]))
    assert match.blocks == tuple(seq.blocks)
    match.release(pool)
    seq.release()


# --- BlockTable and admission


@pytest.mark.parametrize("size", [1, 2, 16])
def test_reserve_and_table_row(size):
    pool = BlockPool(10, size)
    table = BlockTable(pool)
    table.reserve(0)
    assert table.blocks == []
    table.reserve(size + 1)
    assert len(table.blocks) == 2 and table.capacity == 2 * size
    table.reserve(2 * size)  # already has room
    assert len(table.blocks) == 2
    row = np.full(5, 77, np.int32)
    table.table_row(row)
    assert row.tolist() == table.blocks + [UNUSED] * 3
    with pytest.raises(ValueError):
        table.table_row(np.zeros(1, np.int32))
    # position p lives in block row[p // size], at row p % size
    p = size
    assert row[p // size] == table.blocks[1] and p % size == 0
    table.release()
    assert table.blocks == [] and pool.n_free == 10


def test_reserve_is_atomic():
    pool = BlockPool(4, 2)
    table, other = BlockTable(pool), BlockTable(pool)
    other.reserve(4)
    table.reserve(2)
    with pytest.raises(PoolFull):
        table.reserve(8)  # 3 more blocks, 1 left
    assert len(table.blocks) == 1 and pool.n_free == 1
    pool.check()


def test_adopt_copies_a_partial_block():
    pool = BlockPool(4, 4)
    cache = RadixCache(pool)
    owner = computed(pool, cache, [1, 2, 3, 4, 5, 6, 7, 8])
    match = cache.match([1, 2, 3, 4, 5, 6, 0])
    table = BlockTable(pool)
    copy = table.adopt(match)
    assert copy == RowCopy(owner.blocks[1], copy.dst, 2)
    assert table.blocks == [owner.blocks[0], copy.dst]
    assert pool.refcount(copy.dst) == 1 and not pool.is_cached(copy.dst)  # ours to write
    pool.unref(copy.src)  # copied
    assert pool.refcount(owner.blocks[1]) == 1
    with pytest.raises(ValueError):
        table.adopt(match)  # only into an empty table
    table.release()
    owner.release()
    pool.check()


def test_adopt_on_a_full_pool_changes_nothing():
    pool = BlockPool(2, 4)
    cache = RadixCache(pool)
    owner = computed(pool, cache, [1, 2, 3, 4])
    filler = BlockTable(pool)
    filler.reserve(1)
    match = cache.match([1, 2])
    with pytest.raises(PoolFull):
        BlockTable(pool).adopt(match)
    assert pool.refcount(owner.blocks[0]) == 2  # the match still holds its reference
    match.release(pool)
    owner.release()
    filler.release()
    pool.check()


def test_admission():
    pool = BlockPool(4, 16)
    cache = RadixCache(pool)
    prefix = computed(pool, cache, list(range(32)))
    assert admit(pool, 100).verdict is Verdict.REJECT  # 7 blocks > 4, ever
    assert admit(pool, 65).verdict is Verdict.REJECT  # 5 blocks
    assert admit(pool, 64).verdict is Verdict.WAIT  # 4 blocks, 2 free and 2 held
    match = cache.match(list(range(40)))
    decision = admit(pool, 64, match)  # 4 blocks, 2 shared, 2 to allocate, 2 free
    assert decision.verdict is Verdict.ADMIT
    assert (decision.total, decision.needed, decision.available, decision.capacity) == (
        4, 2, 2, 4)
    busy = BlockTable(pool)
    busy.reserve(32)
    assert admit(pool, 64, match).verdict is Verdict.WAIT
    busy.release()
    assert admit(pool, 64, match).verdict is Verdict.ADMIT
    match.release(pool)
    prefix.release()
    assert admit(pool, 64).verdict is Verdict.ADMIT  # the cached blocks can be evicted


# --- many sequences sharing a small pool: a hypothesis state machine

# a few shared "system prompts", then a tail from a tiny alphabet: prefixes are shared often,
# in whole blocks and in part
PROMPTS = [[], [0, 1, 2, 0, 1, 2], [0, 1, 2, 0, 2, 2, 1], [1, 1, 1, 1]]
TOKENS = st.builds(lambda head, tail: head + tail, st.sampled_from(PROMPTS),
                   st.lists(st.integers(0, 2), max_size=5))


@dataclass
class Live:
    """A sequence in the machine: its table, its tokens, how many positions hold their KV,
    and the row copy it still owes (holding the source block)."""

    table: BlockTable
    tokens: list[int]
    n_done: int
    pending: RowCopy | None
    ready: bool = False  # every token computed


class KVMachine(RuleBasedStateMachine):
    """Start requests (match, admit, adopt), compute them (copy, reserve, write), extend,
    commit to the cache, finish, evict; `shadow` records what each block's rows hold."""

    @initialize(size=st.sampled_from([1, 2, 3, 4]), n_blocks=st.integers(1, 16))
    def setup(self, size, n_blocks):
        self.size = size
        self.pool = BlockPool(n_blocks, size)
        self.cache = RadixCache(self.pool)
        self.shadow: dict[int, list[int | None]] = {}
        self.live: list[Live] = []

    # rules

    @rule(tokens=TOKENS, at_once=st.booleans())
    def start(self, tokens, at_once):
        match = self.cache.match(tokens)
        self.check_match(tokens, match)
        event(f"match: {'full blocks' if match.blocks else 'none'}"
              f"{', partial' if match.partial else ''}")
        decision = admit(self.pool, len(tokens), match)
        assert (decision.verdict is Verdict.REJECT) == (decision.total > self.pool.n_blocks)
        admitted = decision.verdict is Verdict.ADMIT and not self.pinned()
        if decision.verdict is Verdict.REJECT:
            event("rejected")
            match.release(self.pool)
            return
        table = BlockTable(self.pool)
        before = self.snapshot()
        try:
            copy = table.adopt(match)
        except PoolFull:
            self.require_unchanged(before)
            assert not admitted
            event("PoolFull in adopt")
            match.release(self.pool)
            return
        n_done = len(match.blocks) * self.size
        self.live.append(Live(table, list(tokens), n_done, copy))
        if at_once:
            self.compute_and_commit(self.live[-1], commit=True)
            assert self.live[-1].ready or not admitted  # admitted: it fits

    @rule(tokens=TOKENS)
    def start_twins(self, tokens):
        # two requests for the same tokens before either is computed: both compute the same
        # blocks, and the second to commit finds the first's (a duplicate)
        self.start(tokens, at_once=False)
        self.start(tokens, at_once=False)

    @precondition(lambda self: any(not s.ready for s in self.live))
    @rule(data=st.data(), commit=st.booleans())
    def compute(self, data, commit):
        self.compute_and_commit(
            data.draw(st.sampled_from([s for s in self.live if not s.ready])), commit)

    def compute_and_commit(self, seq: Live, commit: bool) -> None:
        if seq.pending is not None:
            copy, seq.pending = seq.pending, None
            self.require_exclusive(copy.dst)
            rows = self.shadow[copy.src][:copy.n_rows]
            self.shadow.setdefault(copy.dst, [None] * self.size)[:copy.n_rows] = rows
            self.pool.unref(copy.src)
            seq.n_done += copy.n_rows
        seq.ready = self.write(seq, len(seq.tokens))
        if seq.ready and commit and seq.table.commit(self.cache, seq.tokens):
            event("commit switched to cached blocks")

    @precondition(lambda self: any(s.ready for s in self.live))
    @rule(data=st.data(), more=st.lists(st.integers(0, 2), min_size=1, max_size=5))
    def extend(self, data, more):
        seq = data.draw(st.sampled_from([s for s in self.live if s.ready]))
        seq.tokens += more
        if not self.write(seq, len(seq.tokens)):
            del seq.tokens[-len(more):]

    @precondition(lambda self: any(s.ready for s in self.live))
    @rule(data=st.data(), switch=st.booleans())
    def commit(self, data, switch):
        seq = data.draw(st.sampled_from([s for s in self.live if s.ready]))
        if not switch:  # keep our duplicates: later blocks hang under cached ones we don't hold
            if self.cache.insert(seq.tokens, seq.table.blocks):
                event("insert kept duplicates")
        elif seq.table.commit(self.cache, seq.tokens):
            event("commit switched to cached blocks")

    @precondition(lambda self: self.live)
    @rule(data=st.data(), commit_first=st.booleans())
    def finish(self, data, commit_first):
        seq = data.draw(st.sampled_from(self.live))
        if commit_first and seq.ready:
            seq.table.commit(self.cache, seq.tokens)
        if seq.pending is not None:
            self.pool.unref(seq.pending.src)
        seq.table.release()
        self.live.remove(seq)

    @rule(n=st.integers(1, 4))
    def evict(self, n):
        evictable = self.pool.n_evictable
        done = self.cache.evict(n)
        assert done <= n and self.pool.n_evictable == evictable - done

    @rule()
    def drain(self):
        for seq in list(self.live):
            if seq.pending is not None:
                self.pool.unref(seq.pending.src)
            seq.table.release()
        self.live.clear()
        self.check_drained()

    def teardown(self):
        if hasattr(self, "pool"):
            self.drain()

    # helpers

    def write(self, seq: Live, n_tokens: int) -> bool:
        """Reserve and compute positions [n_done, n_tokens); False (and nothing changed)
        on PoolFull."""
        before = self.snapshot()
        cached = len(self.cache)
        try:
            seq.table.reserve(n_tokens)
        except PoolFull:
            self.require_unchanged(before)
            event("PoolFull in reserve")
            return False
        for p in range(seq.n_done, n_tokens):
            block = seq.table.blocks[p // self.size]
            self.require_exclusive(block)
            self.shadow.setdefault(block, [None] * self.size)[p % self.size] = seq.tokens[p]
        seq.n_done = n_tokens
        if len(self.cache) < cached:
            event("reserve evicted cached blocks")
        return True

    def require_exclusive(self, block: int) -> None:
        # a block is written only by its one holder, and never once cached
        assert self.pool.refcount(block) == 1 and not self.pool.is_cached(block)

    def snapshot(self):
        return (self.pool.refcounts().tolist(), self.pool.n_free, self.pool.n_evictable,
                len(self.cache), sorted(self.tree_paths().items()))

    def require_unchanged(self, before) -> None:
        """A failed call took nothing; unless cached blocks are pinned (see `pinned`), it
        evicted nothing either."""
        after = self.snapshot()
        if self.pinned():
            assert after[0] == before[0]  # the refcounts
        else:
            assert after == before

    def pinned(self) -> bool:
        """Whether an unreferenced cached block has a referenced one below it: it counts as
        evictable but cannot be evicted yet, so `n_available` overstates, and a failing
        reserve may evict other leaves before it finds out."""
        size, paths = self.size, self.tree_paths()
        for path, block in paths.items():
            if self.pool.refcount(block):
                for n in range(size, len(path), size):
                    if self.pool.refcount(paths[path[:n]]) == 0:
                        event("pinned cached block")
                        return True
        return False

    def tree_paths(self) -> dict[tuple[int, ...], int]:
        """Every cached prefix (a whole number of blocks) -> its last block."""
        paths, stack = {}, [((), self.cache.root)]
        while stack:
            prefix, node = stack.pop()
            for key, child in node.children.items():
                assert child.tokens == key and child.parent is node
                paths[prefix + key] = child.block
                stack.append((prefix + key, child))
        return paths

    def check_match(self, tokens: list[int], match) -> None:
        size, paths = self.size, self.tree_paths()
        k = 0  # the reference: the longest cached prefix of whole blocks
        while (k + 1) * size <= len(tokens) and tuple(tokens[:(k + 1) * size]) in paths:
            k += 1
        assert len(match.blocks) == k
        for i, block in enumerate(match.blocks):
            assert self.shadow[block] == tokens[i * size:(i + 1) * size]
            assert paths[tuple(tokens[:(i + 1) * size])] == block
        rest, best = tokens[k * size:(k + 1) * size], 0
        for path in paths:
            if len(path) == (k + 1) * size and list(path[:k * size]) == tokens[:k * size]:
                m = 0
                while m < len(rest) and path[k * size + m] == rest[m]:
                    m += 1
                best = max(best, m)
        if match.partial is None:
            assert best == 0
        else:
            block, m = match.partial
            assert m == best and 0 < m < size and m <= len(rest)
            assert self.shadow[block][:m] == rest[:m]

    def check_drained(self) -> None:
        pool = self.pool
        assert pool.n_used == 0 and pool.n_free + pool.n_evictable == pool.n_blocks
        assert pool.n_evictable == len(self.cache)
        pool.check()
        n_cached = len(self.cache)
        assert self.cache.evict(pool.n_blocks) == n_cached
        assert pool.n_free == pool.n_blocks and len(self.cache) == 0
        assert self.cache.root.children == {}

    # invariants, after every step

    @invariant()
    def refcounts_count_the_holders(self):
        self.pool.check()
        expected = [0] * self.pool.n_blocks
        for seq in self.live:
            assert len(set(seq.table.blocks)) == len(seq.table.blocks)
            for block in seq.table.blocks:
                expected[block] += 1
            if seq.pending is not None:
                expected[seq.pending.src] += 1
        assert self.pool.refcounts().tolist() == expected
        states = Counter("used" if r else "evictable" if self.pool.is_cached(b) else "free"
                         for b, r in enumerate(expected))
        assert (states["free"], states["evictable"], states["used"]) == (
            self.pool.n_free, self.pool.n_evictable, self.pool.n_used)

    @invariant()
    def cached_blocks_hold_their_tokens(self):
        paths = self.tree_paths()
        blocks = list(paths.values())
        assert len(set(blocks)) == len(blocks) == len(self.cache)
        for path, block in paths.items():
            assert block in self.cache and self.pool.is_cached(block)
            assert self.shadow[block] == list(path[-self.size:])
            parent = paths[path[:-self.size]] if len(path) > self.size else ROOT
            assert self.pool.parent(block) == parent
        assert sum(map(self.pool.is_cached, range(self.pool.n_blocks))) == len(blocks)

    @invariant()
    def sequences_read_their_own_tokens(self):
        for seq in self.live:
            for p in range(seq.n_done):
                block = seq.table.blocks[p // self.size]
                assert self.shadow[block][p % self.size] == seq.tokens[p]


def test_kv_state_machine():
    run_state_machine_as_test(KVMachine, settings=settings(
        max_examples=600, stateful_step_count=50, deadline=None, database=None,
        derandomize=True, suppress_health_check=[HealthCheck.too_slow]))
