"""The sampling settings and their defaults, llama.cpp's (the samplers are sampling.py);
no numpy here, so the CLI can read the defaults without importing it."""

from __future__ import annotations

from dataclasses import dataclass

from edgeinfer.errors import EdgeInferError

N_PREDICT = -1  # tokens to generate (llama.cpp's n_predict); -1: until EOS or the context is full
# (token id, bias) pairs added to the logits before any other sampler; -inf bans the token.
# A token listed twice gets both (llama_sampler_logit_bias adds each entry).
LogitBias = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings; the defaults are llama.cpp's (common/common.h), and the only copy
    of them: front ends read `SamplingParams()` rather than repeating the values."""

    temperature: float = 0.8
    top_k: int = 40  # <= 0: disabled
    top_p: float = 0.95  # >= 1: disabled
    min_p: float = 0.05  # <= 0: disabled
    repeat_penalty: float = 1.0  # 1: disabled
    repeat_last_n: int = 64  # 0: disabled, -1: all of `recent`
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None  # None: a random seed, drawn once when the sampler is built

    def __post_init__(self) -> None:
        if not self.repeat_penalty > 0:
            raise EdgeInferError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            raise EdgeInferError(f"repeat_last_n must be >= -1, got {self.repeat_last_n}")
        if self.seed is not None and self.seed < 0:
            raise EdgeInferError(f"seed must be >= 0, got {self.seed}")

    @property
    def penalties_active(self) -> bool:
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )
