"""SpecParams: what to draft with and how much (llama.cpp's names and defaults)."""

from __future__ import annotations

from dataclasses import dataclass

from edgeinfer.errors import EdgeInferError

SPEC_TYPES = ("none", "ngram-simple")


@dataclass(frozen=True)
class SpecParams:
    type: str = "none"  # --spec-type
    n_max: int = 16  # --spec-draft-n-max: the most tokens drafted a step
    n_min: int = 0  # --spec-draft-n-min: a shorter draft is not checked
    ngram_size_n: int = 12  # --spec-ngram-simple-size-n: tokens matched in the history
    ngram_size_m: int = 48  # --spec-ngram-simple-size-m: tokens copied after the match

    def __post_init__(self):
        if self.type not in SPEC_TYPES:
            raise EdgeInferError(f"unknown --spec-type {self.type!r}; expected one of "
                                 f"{', '.join(SPEC_TYPES)}")
        if self.n_max < 0 or self.n_min < 0 or self.ngram_size_n < 1 or self.ngram_size_m < 1:
            raise EdgeInferError("--spec-draft-n-max and -n-min must be >= 0 and the n-gram "
                                 "sizes >= 1")

    @property
    def enabled(self) -> bool:
        return self.type != "none" and self.n_max > 0


def make_drafter(params: SpecParams, prompt):
    """The drafter for one sequence starting with `prompt` (token ids), or None."""
    if not params.enabled:
        return None
    from edgeinfer.spec.ngram import NgramSimple

    return NgramSimple(params.ngram_size_n, params.ngram_size_m, prompt)
