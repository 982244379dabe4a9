"""RadixCache: a prefix tree over token ids at block granularity, to share computed KV.

A node is one full block: the block_size token ids it holds (a tuple, its key among its
parent's children) and its block id; a path from the root spells a prefix whose KV those
blocks hold, each computed with all the blocks above it as context. Partial blocks are never
nodes: a sequence's unfinished last block is still being written.

A block in the tree is marked cached in the pool, so it outlives its last reference as an
evictable block; the pool evicts leaves, least recently released first, and tells the tree
(`BlockPool.on_evict`) to drop the node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from edgeinfer.kv.pool import ROOT, BlockPool


@dataclass(eq=False)
class Node:
    tokens: tuple[int, ...]  # (block_size,) the token ids this block holds; () for the root
    block: int  # ROOT for the root
    parent: Node | None
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)


@dataclass(frozen=True)
class Match:
    """What the cache holds of a token sequence. The caller owns one reference on each of
    `blocks` and on the partial block, and must hand them on (`BlockTable.adopt`) or give
    them back (`release`)."""

    blocks: tuple[int, ...]  # full blocks holding tokens[:len(blocks) * block_size], in order
    partial: tuple[int, int] | None  # (block, m): its first m rows hold the next m tokens
    block_size: int

    @property
    def n_tokens(self) -> int:
        """Leading tokens whose KV is available (to reuse or to copy)."""
        return len(self.blocks) * self.block_size + (self.partial[1] if self.partial else 0)

    def release(self, pool: BlockPool) -> None:
        """Give back every reference the match holds (a request that waits or is refused)."""
        if self.partial is not None:
            pool.unref(self.partial[0])
        for block in reversed(self.blocks):  # the deepest block is released first: older
            pool.unref(block)


class RadixCache:
    """The prefix tree of one BlockPool (it takes the pool's `on_evict`)."""

    def __init__(self, pool: BlockPool):
        if pool.on_evict is not None:
            raise ValueError("this pool already has a radix cache")
        self.pool, self.block_size = pool, pool.block_size
        self.root = Node((), ROOT, None)
        self._nodes: dict[int, Node] = {}  # block -> its node
        pool.on_evict = self._drop

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, block: int) -> bool:
        return block in self._nodes

    def match(self, tokens: Sequence[int] | np.ndarray) -> Match:
        """The longest cached prefix of tokens: full blocks, then at most one block whose
        first rows hold the next tokens (copy them, copy-on-write, rather than recompute).
        Takes a reference on every block returned. To keep the last prompt token's logits,
        match prompt[:-1]."""
        tokens = _as_list(tokens)
        size, node, blocks = self.block_size, self.root, []
        start = 0
        while start + size <= len(tokens):
            child = node.children.get(tuple(tokens[start:start + size]))
            if child is None:
                break
            blocks.append(child.block)
            node, start = child, start + size
        partial = _longest_child_prefix(node, tokens[start:start + size])
        for block in blocks:
            self.pool.ref(block)
        if partial is not None:
            self.pool.ref(partial[0])
        return Match(tuple(blocks), partial, size)

    def insert(self, tokens: Sequence[int] | np.ndarray,
               blocks: Sequence[int]) -> list[tuple[int, int]]:
        """Register the full blocks of a sequence whose KV is computed: blocks[i] holds
        tokens[i*B:(i+1)*B], for every i with a full block of tokens. The caller must hold a
        reference on each block it registers. Where another block already holds the same
        prefix, that one is kept: returns (i, cached block) for each such duplicate, which
        the caller should swap in and release (`BlockTable.commit` does)."""
        tokens = _as_list(tokens)
        size, node = self.block_size, self.root
        duplicates = []
        for i in range(min(len(blocks), len(tokens) // size)):
            key, block = tuple(tokens[i * size:(i + 1) * size]), blocks[i]
            child = node.children.get(key)
            if child is None:
                if block in self._nodes:
                    raise ValueError(f"block {block} is already cached for other tokens")
                self.pool.cache(block, node.block)
                child = Node(key, block, node)
                node.children[key] = child
                self._nodes[block] = child
            elif child.block != block:
                duplicates.append((i, child.block))
            node = child
        return duplicates

    def evict(self, n: int = 1) -> int:
        """Evict up to n least recently used unreferenced leaves; how many were."""
        return self.pool.evict(n)

    def _drop(self, block: int) -> None:
        node = self._nodes.pop(block)
        del node.parent.children[node.tokens]


def _longest_child_prefix(node: Node, rest: list[int]) -> tuple[int, int] | None:
    """(block, m) of the child whose tokens share the longest prefix, m > 0, with rest (less
    than one block, or a block no child holds in full); None if no child shares any."""
    best, best_m = None, 0
    if rest:
        first = rest[0]
        for key, child in node.children.items():  # one pass over the children, per request
            if key[0] != first:
                continue
            m = 1
            while m < len(rest) and key[m] == rest[m]:
                m += 1
            if m > best_m:
                best, best_m = child, m
    return None if best is None else (best.block, best_m)


def _as_list(tokens: Sequence[int] | np.ndarray) -> list[int]:
    # plain ints: a numpy slice would make keys of numpy scalars
    return tokens.tolist() if isinstance(tokens, np.ndarray) else list(tokens)
