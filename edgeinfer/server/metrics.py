"""/metrics: Prometheus text exposition with llama-server's metric names.

Counters are totals since start; the throughput and busy-slot gauges are averaged over the
window since the previous scrape, as llama-server does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from edgeinfer.server.engine import Engine, Stats

METRICS = (  # (name, type, help)
    ("prompt_tokens_total", "counter", "Number of prompt tokens processed."),
    ("prompt_seconds_total", "counter", "Prompt process time"),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed."),
    ("tokens_predicted_seconds_total", "counter", "Predict process time"),
    ("n_decode_total", "counter", "Total number of llama_decode() calls"),
    ("n_tokens_max", "counter", "Largest observed n_tokens."),
    ("n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call"),
    ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s."),
    ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s."),
    ("requests_processing", "gauge", "Number of requests processing."),
    ("requests_deferred", "gauge", "Number of requests deferred."),
    ("kv_cache_usage_ratio", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    ("kv_cache_tokens", "gauge", "KV-cache tokens."),
)


@dataclass
class Scraper:
    """Remembers the previous scrape so gauges cover the window since then."""

    engine: Engine
    start_time: float
    last: Stats | None = None

    def render(self) -> str:
        stats, last = replace(self.engine.stats), self.last or Stats()
        self.last = stats
        values = self._values(stats, last)
        lines = []
        for name, kind, help_text in METRICS:
            lines += [f"# HELP llamacpp:{name} {help_text}", f"# TYPE llamacpp:{name} {kind}",
                      f"llamacpp:{name} {values[name]:g}"]
        return "\n".join(lines) + "\n"

    def _values(self, s: Stats, last: Stats) -> dict[str, float]:
        engine = self.engine
        slots = engine.slots
        n_cells = sum(len(slot.cache) for slot in slots)
        n_prompt, t_prompt = s.prompt_tokens - last.prompt_tokens, \
            s.prompt_seconds - last.prompt_seconds
        n_pred, t_pred = s.predicted_tokens - last.predicted_tokens, \
            s.predicted_seconds - last.predicted_seconds
        n_decode = s.n_decode - last.n_decode
        return {
            "prompt_tokens_total": s.prompt_tokens, "prompt_seconds_total": s.prompt_seconds,
            "tokens_predicted_total": s.predicted_tokens,
            "tokens_predicted_seconds_total": s.predicted_seconds,
            "n_decode_total": s.n_decode, "n_tokens_max": s.n_tokens_max,
            "n_busy_slots_per_decode":
                (s.busy_slots_sum - last.busy_slots_sum) / n_decode if n_decode else 0.0,
            "prompt_tokens_seconds": n_prompt / t_prompt if t_prompt > 0 else 0.0,
            "predicted_tokens_seconds": n_pred / t_pred if t_pred > 0 else 0.0,
            "requests_processing": sum(slot.job is not None for slot in slots),
            "requests_deferred": engine.n_deferred,
            "kv_cache_usage_ratio": n_cells / (len(slots) * engine.n_ctx),
            "kv_cache_tokens": n_cells,
        }

    def headers(self) -> dict[str, str]:
        return {"Process-Start-Time-Unix": str(int(self.start_time))}
