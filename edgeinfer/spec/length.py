"""DraftLength: how many drafted tokens to check next.

A check of k drafted tokens is one forward pass of k + 1 rows: nearly free while decoding is
bound by reading the weights, not once the rows' compute shows (k of 8 or more on two
cores). So the length doubles after a draft accepted whole and falls to what was accepted
(plus one) after a rejection: text with nothing to copy settles at short checks, or none.
"""

from __future__ import annotations


class DraftLength:
    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max
        self.k = n_max
        self.drafted = self.accepted = 0  # totals, for the timings

    def record(self, n_drafted: int, n_accepted: int) -> None:
        self.drafted += n_drafted
        self.accepted += n_accepted
        if n_accepted == n_drafted:
            self.k = min(self.n_max, max(1, 2 * self.k))
        else:
            self.k = max(1, self.n_min, n_accepted + 1)  # never below what may be checked

    def usable(self, draft: list[int]) -> list[int]:
        """The draft cut to the current length; [] when shorter than n_min."""
        draft = draft[: self.k]
        return draft if len(draft) >= max(1, self.n_min) else []
