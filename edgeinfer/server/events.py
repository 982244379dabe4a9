"""What the engine thread and the HTTP side exchange: a `Job` in, events out through its sink
(a thread-safe callable): TokenEvent per token, ProgressEvent while a prompt is read, then one
FinalEvent or ErrorEvent."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgeinfer.decoder import TokenProbs
from edgeinfer.server.errors import ApiError
from edgeinfer.server.params import GenParams


@dataclass
class ProgressEvent:
    """Prompt processing so far (llama-server's prompt_progress, with return_progress)."""

    total: int  # prompt tokens
    cache: int  # of them reused from the KV cache
    processed: int  # of them in the KV cache now, cached ones included
    time_ms: float
    slot: int
    timings: dict | None = None  # only with timings_per_token


@dataclass
class TokenEvent:
    text: str  # new text (may be "" while a character or stop string is held back)
    token: int
    n_decoded: int
    slot: int
    probs: TokenProbs | None = None
    timings: dict | None = None  # only with timings_per_token
    n_cached: int = 0  # prompt tokens reused from the KV cache


@dataclass
class FinalEvent:
    text: str  # the held-back tail
    stop_type: str  # "eos" | "word" | "limit"
    stopping_word: str
    truncated: bool
    slot: int
    n_prompt: int  # prompt tokens, cached + evaluated
    n_cached: int  # prompt tokens reused from the KV cache
    n_decoded: int
    tokens_cached: int  # tokens now held by the slot
    timings: dict


@dataclass
class ErrorEvent:
    error: ApiError


Sink = Callable[[Any], None]
__all__ = ["ErrorEvent", "FinalEvent", "Job", "ProgressEvent", "Sink", "TokenEvent", "TokenProbs"]


class Job:
    """One generation request as the engine sees it."""

    _ids = itertools.count()

    def __init__(self, prompt: list[int], params: GenParams, sink: Sink,
                 constraint: Any = None):
        self.id = next(Job._ids)
        self.prompt, self.params, self.sink = prompt, params, sink
        self.constraint = constraint  # a CompiledConstraint (edgeinfer.structured), or None
        self.cancelled = False  # set by the HTTP side; honoured at the next step


