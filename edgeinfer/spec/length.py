"""DraftLength: how many drafted tokens to check next.

A check of k drafted tokens is one forward pass of k + 1 rows: cheap while decoding is
bound by reading the weights, not once the rows' compute shows (each row costs a quarter of
a one-row step for SmolLM2 on two cores). So the length doubles after a draft accepted whole
and falls to what was accepted (plus one) after a rejection: text with nothing to copy
settles at short checks, or none. A check is cut to rows that fill the kernels' register
tiles (tiles.py): padded rows cost as much as drafted ones.

In a batch of several sequences every row costs compute, a plain one too, so a drafted row
pays only where its token is likely kept: `worth(n_seqs)` compares the recent acceptance
rate with what a plain row of such a batch costs per token.
"""

from __future__ import annotations

from edgeinfer.tiles import fills_tiles

ROW_COST = 0.25  # an extra row of a decode step, in one-row steps (SmolLM2, two cores)
RATE_KEEP = 0.7  # the acceptance rate's memory, per checked draft
RATE_RECOVERY = 0.05  # a batch's skipped sequences are tried again now and then


class DraftLength:
    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max
        self.k = n_max
        self.drafted = self.accepted = 0  # totals, for the timings
        self.rate = 1.0  # recent drafted tokens kept per token checked

    def worth(self, n_seqs: int) -> bool:
        """Whether to draft in a step that decodes n_seqs sequences: a drafted row costs
        ROW_COST and yields `rate` tokens; a plain batch row costs its share of the step."""
        if n_seqs <= 1:
            return True
        plain = (1 + ROW_COST * (n_seqs - 1)) / n_seqs  # a plain row's cost per token
        if self.rate * plain >= ROW_COST:
            return True
        self.rate += RATE_RECOVERY * (1 - self.rate)  # skipped: look again later
        return False

    def record(self, n_drafted: int, n_accepted: int) -> None:
        self.drafted += n_drafted
        self.accepted += n_accepted
        checked = min(n_drafted, n_accepted + 1)  # tokens compared up to the first miss
        self.rate = RATE_KEEP * self.rate + (1 - RATE_KEEP) * n_accepted / checked
        if n_accepted == n_drafted:
            self.k = min(self.n_max, max(1, 2 * self.k))
        else:
            self.k = max(1, self.n_min, n_accepted + 1)  # never below what may be checked

    def usable(self, draft: list[int]) -> list[int]:
        """The draft cut to the current length and then to whole tiles (not below n_min);
        [] when shorter than n_min."""
        n, least = min(len(draft), self.k), max(1, self.n_min)
        if n < least:
            return []
        while n > least and not fills_tiles(n + 1):
            n -= 1
        return draft[:n]
