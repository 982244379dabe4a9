"""How many leading items two sequences share: the cache lookups' one comparison."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix(a: Sequence, b: Sequence) -> int:
    """How many leading tokens (or characters) a and b share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
