"""SpecParams: what to draft with and how much (llama.cpp's names and defaults)."""

from __future__ import annotations

from dataclasses import dataclass

from edgeinfer.errors import EdgeInferError

SPEC_TYPES = ("none", "ngram-simple", "draft-simple")


@dataclass(frozen=True)
class SpecParams:
    type: str = "none"  # --spec-type
    n_max: int = 16  # --spec-draft-n-max: the most tokens drafted a step
    n_min: int = 0  # --spec-draft-n-min: a shorter draft is not checked
    # --spec-ngram-simple-size-n: tokens matched in the history (llama.cpp's 12 finds few
    # drafts in small models' rewrites; 3 measured best: docs/performance.md)
    ngram_size_n: int = 3
    ngram_size_m: int = 48  # --spec-ngram-simple-size-m: tokens copied after the match
    draft_model: str | None = None  # -md: the draft model's GGUF (draft-simple)
    p_min: float = 0.0  # --spec-draft-p-min: the draft model stops below this confidence

    def __post_init__(self):
        if self.type not in SPEC_TYPES:
            raise EdgeInferError(f"unknown --spec-type {self.type!r}; expected one of "
                                 f"{', '.join(SPEC_TYPES)}")
        if self.type == "draft-simple" and not self.draft_model:
            raise EdgeInferError("--spec-type draft-simple needs a draft model: -md FILE")
        if not 0.0 <= self.p_min <= 1.0:
            raise EdgeInferError("--spec-draft-p-min must be between 0 and 1")
        if self.n_max < 0 or self.n_min < 0 or self.ngram_size_n < 1 or self.ngram_size_m < 1:
            raise EdgeInferError("--spec-draft-n-max and -n-min must be >= 0 and the n-gram "
                                 "sizes >= 1")

    @property
    def enabled(self) -> bool:
        return self.type != "none" and self.n_max > 0


def spec_params(type: str = "none", draft_model: str | None = None, **sizes) -> SpecParams:
    """SpecParams from the command line's flags: a draft model alone means draft-simple
    (as llama.cpp)."""
    if draft_model and type == "none":
        type = "draft-simple"
    if draft_model and type != "draft-simple":
        raise EdgeInferError(f"-md/--model-draft drafts with --spec-type draft-simple, "
                             f"not {type}")
    return SpecParams(type, draft_model=str(draft_model) if draft_model else None, **sizes)


def make_drafter(params: SpecParams, prompt, draft=None, slot: int = 0):
    """The drafter for one sequence starting with `prompt` (token ids), or None. `draft`:
    the loaded draft model (draft_model.DraftModel) for draft-simple; `slot` its KV slot."""
    if not params.enabled:
        return None
    if params.type == "draft-simple":
        return draft.drafter(slot, prompt, params.p_min)
    from edgeinfer.spec.ngram import NgramSimple

    return NgramSimple(params.ngram_size_n, params.ngram_size_m, prompt)
