"""A radix tree over token sequences, each under an id: the RAM prompt cache's entries
(prompt_cache.py). A lookup walks a new prompt down the tree once and returns, for every id,
how many leading tokens its sequence shares with the prompt.

Edges are labelled with token runs; each node records the set of ids whose sequence passes
through it, so the sets shrink going down and a node with an empty set is pruned. (The KV
blocks themselves are shared through edgeinfer/kv/radix.py, a tree of whole blocks.)
"""

from __future__ import annotations

from collections.abc import Sequence

from edgeinfer.kv.prefix import common_prefix

__all__ = ["PrefixTree", "common_prefix"]


class _Node:
    __slots__ = ("children", "edge", "slots")

    def __init__(self, edge: tuple[int, ...]):
        self.edge = edge  # token ids on the edge leading into this node
        self.children: dict[int, _Node] = {}  # first token of a child's edge -> child
        self.slots: set[int] = set()  # slots whose cached sequence goes through this node


class PrefixTree:
    """Which slot caches which token sequence, searchable by longest common prefix."""

    def __init__(self) -> None:
        self.root = _Node(())
        self.sequences: dict[int, tuple[int, ...]] = {}  # slot -> its cached tokens

    def cached(self, slot: int) -> tuple[int, ...]:
        return self.sequences.get(slot, ())

    def set(self, slot: int, tokens: Sequence[int]) -> None:
        """Record that `slot` now holds exactly `tokens` (replacing what it held)."""
        tokens = tuple(tokens)
        if self.sequences.get(slot) == tokens:
            return
        self.remove(slot)
        self.sequences[slot] = tokens
        node, rest = self.root, tokens
        while rest:
            child = node.children.get(rest[0])
            if child is None:
                child = node.children[rest[0]] = _Node(rest)
            else:
                n = common_prefix(child.edge, rest)
                if n < len(child.edge):
                    child = self._split(node, child, n)
            child.slots.add(slot)
            node, rest = child, rest[len(child.edge):]

    def remove(self, slot: int) -> None:
        tokens = self.sequences.pop(slot, None)
        if not tokens:
            return
        node, rest = self.root, tokens
        while rest:
            child = node.children[rest[0]]
            child.slots.discard(slot)
            if not child.slots:  # nobody else goes this way: drop the whole branch
                del node.children[rest[0]]
                return
            node, rest = child, rest[len(child.edge):]

    def match(self, tokens: Sequence[int]) -> dict[int, int]:
        """For every slot with a cached sequence: the length of its common prefix with
        `tokens` (0 for slots that share nothing)."""
        shared = dict.fromkeys(self.sequences, 0)
        node, depth = self.root, 0
        while depth < len(tokens):
            child = node.children.get(tokens[depth])
            if child is None:
                break
            n = common_prefix(child.edge, tokens[depth:depth + len(child.edge)])
            for slot in child.slots:
                shared[slot] = depth + n
            if n < len(child.edge):
                break
            node, depth = child, depth + n
        return shared

    @staticmethod
    def _split(parent: _Node, child: _Node, n: int) -> _Node:
        """Cut child's edge after n tokens; return the new middle node."""
        middle = _Node(child.edge[:n])
        middle.slots = set(child.slots)
        parent.children[middle.edge[0]] = middle
        child.edge = child.edge[n:]
        middle.children[child.edge[0]] = child
        return middle
