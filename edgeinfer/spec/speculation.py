"""Speculation: one sequence's drafter and draft length, as the generation loops use them."""

from __future__ import annotations

from edgeinfer.spec.length import DraftLength
from edgeinfer.spec.params import SpecParams, make_drafter


class Speculation:
    def __init__(self, drafter, n_min: int, n_max: int):
        self.drafter, self.length = drafter, DraftLength(n_min, n_max)

    @classmethod
    def start(cls, params: SpecParams | None, prompt, n_rows: int, draft=None,
              slot: int = 0, drafter=None) -> Speculation | None:
        """The speculation for a sequence starting with prompt, checking at most n_rows - 1
        drafted tokens a step; None when params enable none. `draft`: the loaded draft
        model; `drafter` replaces the one params name (tests)."""
        if drafter is None:
            if params is None:
                return None
            drafter = make_drafter(params, prompt, draft, slot)
        if drafter is None or n_rows < 2:
            return None
        params = params or SpecParams("ngram-simple")
        return cls(drafter, min(params.n_min, n_rows - 1), min(params.n_max, n_rows - 1))

    @property
    def n_max(self) -> int:
        return self.length.n_max

    @property
    def drafted(self) -> int:
        return self.length.drafted

    @property
    def accepted(self) -> int:
        return self.length.accepted

    def extend(self, token: int) -> None:
        """A token was sampled (and is part of the sequence from now)."""
        self.drafter.extend((token,))

    def propose(self, limit: int, n_seqs: int = 1) -> list[int]:
        """The next draft: at most limit tokens, [] when not worth checking in a step that
        decodes n_seqs sequences."""
        if limit <= 0 or not self.length.worth(n_seqs):
            return []
        return self.length.usable(self.drafter.draft(min(self.length.k, limit)))

    def record(self, n_drafted: int, n_accepted: int) -> None:
        if n_drafted:
            self.length.record(n_drafted, n_accepted)
