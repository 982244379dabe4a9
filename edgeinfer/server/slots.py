"""The engine's per-slot state (Slot) and the counters behind /metrics (Stats)."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgeinfer.decoder import SequenceDecoder
from edgeinfer.server.events import Job
from edgeinfer.server.params import GenParams


@dataclass
class Slot:
    id: int
    cache: list[int] = field(default_factory=list)  # tokens whose K/V are in the slot
    target: list[int] = field(default_factory=list)  # the tokens to prefill: the prompt
    stalled: bool = False  # preempted for KV room: resumes by prefilling `target` again
    job: Job | None = None
    last_used: float = 0.0
    task_id: int = -1
    params: GenParams | None = None  # the last job's, kept after it ends (for /slots)
    n_prompt: int = 0  # the last job's prompt tokens
    # per-job state, set by Engine._start
    n_cached: int = 0
    next_token: int = -1  # sampled, to be fed at position len(cache); -1 while prefilling
    decoder: SequenceDecoder | None = None  # sampling, constraint, speculation, text
    draft: list[int] = field(default_factory=list)  # drafted tokens in this step's batch
    has_new_line: bool = False
    t_start: float = 0.0

    @property
    def n_decoded(self) -> int:
        decoder = self.decoder
        return decoder.n_decoded if decoder is not None else 0

    @property
    def prefilling(self) -> bool:
        return self.job is not None and not self.stalled and len(self.cache) < len(self.target)

    @property
    def decoding(self) -> bool:
        return (self.job is not None and not self.stalled and self.next_token >= 0
                and len(self.cache) >= len(self.target))


@dataclass
class Stats:
    """Counters behind /metrics, cumulative since start (llama-server's server_metrics).
    The first generated token of a job comes from its prompt's logits: it is counted in
    predicted_tokens but costs no decode step, so rates use predicted_steps."""

    prompt_tokens: int = 0  # evaluated, not reused from the cache
    prompt_seconds: float = 0.0
    prompt_cached: int = 0
    predicted_tokens: int = 0
    predicted_steps: int = 0
    predicted_seconds: float = 0.0
    n_decode: int = 0
    busy_slots_sum: int = 0
    n_tokens_max: int = 0
    requests_done: int = 0
    n_preempted: int = 0  # sequences that gave their KV blocks back to let others go on
    kv_cells_peak: int = 0  # the most KV cells sequences held at once
    draft_tokens: int = 0  # speculative decoding: drafted tokens checked
    draft_accepted: int = 0  # of them, kept
    n_drafts: int = 0  # steps that checked a draft
