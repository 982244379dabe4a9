"""/metrics: Prometheus text exposition with llama-server's metric names, help and order
(server_task_result_metrics::to_metrics).

Counters are totals since start. The two throughput gauges cover the window since the
previous scrape (llama-server resets its buckets on each scrape) and count decode steps, so
the first token of each reply, which comes from the prompt's logits, does not inflate them.
The counters live in the engine and outlive a sleeping model, so a scrape never wakes it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from edgeinfer.server.engine import Engine
from edgeinfer.server.slots import Stats

COUNTERS = (  # (name, help)
    ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "Total time spent processing prompts"),
    ("tokens_predicted_total", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "Total time spent generating tokens"),
    ("n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding "
                       "and multimodal decoding"),
    ("n_tokens_max", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total",
     "Speculative: Total draft tokens accepted by the target model"),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps"),
)
GAUGES = (
    ("prompt_tokens_seconds", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "Average generation throughput in tokens/s"),
    ("requests_processing", "Number of requests processing"),
    ("requests_deferred", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call"),
)
KV_GAUGES = (  # edgeinfer's own, after llama-server's: the shared KV block pool
    ("kv_cells_total", "gauge", "KV cells in the pool (-c)"),
    ("kv_cells_used", "gauge", "KV cells in blocks that sequences hold (shared blocks once)"),
    ("kv_cells_cached", "gauge", "KV cells in blocks kept only as a prefix cache"),
    ("kv_cells_peak", "gauge", "Most KV cells held at once since start"),
    ("kv_preemptions_total", "counter", "Sequences that gave their blocks back for room"),
)


@dataclass
class Scraper:
    """Remembers the previous scrape so the throughput gauges cover the window since then."""

    engine: Engine
    start_time: float
    last: Stats | None = None

    def render(self) -> str:
        stats, last = replace(self.engine.stats), self.last or Stats()
        self.last = stats
        values = self._values(stats, last)
        lines = []
        for kind, items in (("counter", COUNTERS), ("gauge", GAUGES)):
            for name, help_text in items:
                lines += [f"# HELP llamacpp:{name} {help_text}",
                          f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {values[name]:g}"]
        kv = self._kv(stats)
        for name, kind, help_text in KV_GAUGES:
            lines += [f"# HELP edgeinfer:{name} {help_text}",
                      f"# TYPE edgeinfer:{name} {kind}", f"edgeinfer:{name} {kv[name]:g}"]
        return "\n".join(lines) + "\n"

    def _kv(self, s: Stats) -> dict[str, float]:
        kv = self.engine.kv_figures()  # while asleep: as it went to sleep
        return {"kv_cells_total": kv["total"], "kv_cells_used": kv["used"],
                "kv_cells_cached": kv["cached"], "kv_cells_peak": s.kv_cells_peak,
                "kv_preemptions_total": s.n_preempted}

    def _values(self, s: Stats, last: Stats) -> dict[str, float]:
        t_prompt = s.prompt_seconds - last.prompt_seconds
        t_pred = s.predicted_seconds - last.predicted_seconds
        return {
            "prompt_tokens_total": s.prompt_tokens, "prompt_tokens_cached_total": s.prompt_cached,
            "prompt_seconds_total": s.prompt_seconds,
            "tokens_predicted_total": s.predicted_tokens,
            "tokens_predicted_seconds_total": s.predicted_seconds,
            "n_decode_total": s.n_decode, "n_tokens_max": s.n_tokens_max,
            "spec_decode_num_draft_tokens_total": s.draft_tokens,
            "spec_decode_num_accepted_tokens_total": s.draft_accepted,
            "spec_decode_num_drafts_total": s.n_drafts,
            "prompt_tokens_seconds":
                (s.prompt_tokens - last.prompt_tokens) / t_prompt if t_prompt > 0 else 0.0,
            "predicted_tokens_seconds":
                (s.predicted_steps - last.predicted_steps) / t_pred if t_pred > 0 else 0.0,
            "requests_processing": sum(slot.job is not None for slot in self.engine.slots),
            "requests_deferred": self.engine.n_deferred,
            "n_busy_slots_per_decode": s.busy_slots_sum / max(s.n_decode, 1),
        }

    def headers(self) -> dict[str, str]:
        return {"Process-Start-Time-Unix": str(int(self.start_time))}
