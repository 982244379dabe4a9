"""Prompt lookup: llama.cpp's `ngram-simple` (common/ngram-map.cpp).

The last n tokens (the sampled one included) are looked up in the sequence so far; at their
latest earlier occurrence, the up to m tokens that followed it are the draft, if at least n
of them did. An index of every n-gram that has a successor, updated as tokens arrive, makes a
lookup one dict access instead of llama.cpp's backward scan.
"""

from __future__ import annotations

from collections.abc import Iterable


class NgramSimple:
    def __init__(self, size_n: int, size_m: int, prompt: Iterable[int] = ()):
        self.n, self.m = size_n, size_m
        self.tokens: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}  # n-gram -> its latest start (>= 1)
        self.extend(prompt)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens to the history (the prompt, then each token yielded)."""
        n, hist, index = self.n, self.tokens, self.index
        for token in tokens:
            hist.append(token)
            start = len(hist) - n - 2  # the latest start llama.cpp's scan looks at
            if start >= 1:
                index[tuple(hist[start : start + n])] = start

    def draft(self, limit: int) -> list[int]:
        """Up to `limit` tokens that may follow the history (its last token: the one just
        sampled)."""
        n, m, hist = self.n, self.m, self.tokens
        before = len(hist) - 1  # llama.cpp's tokens: the history before the sampled one
        if limit <= 0 or before <= n + m + 1:
            return []
        start = self.index.get(tuple(hist[-n:]))
        if start is None:
            return []
        follow = hist[start + n : min(start + n + m, before)]
        return follow[:limit] if len(follow) >= n else []
