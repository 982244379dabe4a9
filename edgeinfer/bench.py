"""llama-bench's measurements: pp (prompt processing) and tg (text generation) tokens/s.

pp N: one batched forward of N random tokens on a fresh context. tg N: N single-token
decode steps from an empty context, each on a random token, as llama-bench does. With a
depth D (llama-bench -d), the context first holds D random tokens, filled once and untimed,
and every test run continues from there ("pp512 @ d4096"): long-context speed.
Rows carry llama-bench's JSON field names so tools that read one read both.
"""

from __future__ import annotations

import resource
import time
from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass
class BenchRow:
    model_filename: str
    model_type: str
    n_threads: int
    n_prompt: int
    n_gen: int
    n_depth: int = 0
    flash_attn: bool = False
    n_gpu_layers: int = 0
    launches_per_token: float = 0.0  # CUDA kernel launches per tg step (0: all on the CPU)
    avg_ts: float = 0.0
    stddev_ts: float = 0.0
    samples_ts: list[float] = field(default_factory=list)
    samples_ns: list[int] = field(default_factory=list)
    peak_rss_mb: float = 0.0

    @property
    def test(self) -> str:
        name = f"pp{self.n_prompt}" if self.n_prompt else f"tg{self.n_gen}"
        return f"{name} @ d{self.n_depth}" if self.n_depth else name

    def as_json(self) -> dict:
        return asdict(self)


def _fill(model, depth: int, rng: np.random.Generator) -> None:
    """The untimed context of the depth tests: `depth` random tokens in slot 0, cells the
    tests (which write from `depth` on) leave alone, so one fill serves every repetition."""
    if depth:
        ids = rng.integers(0, model.config.n_vocab, size=depth).astype(np.int32)
        pos = np.arange(depth, dtype=np.int32)
        model.transformer.forward(ids, pos, np.zeros(depth, np.int32), pos[:0],
                                  np.zeros((0, model.config.n_vocab), np.float32))


def _time_pp(model, n: int, depth: int, rng: np.random.Generator) -> float:
    ids = rng.integers(0, model.config.n_vocab, size=n).astype(np.int32)
    pos = np.arange(depth, depth + n, dtype=np.int32)
    logits = np.zeros((1, model.config.n_vocab), np.float32)
    t = time.perf_counter()
    model.transformer.forward(ids, pos, np.zeros(n, np.int32), np.array([n - 1], np.int32),
                              logits)
    return time.perf_counter() - t


def _time_tg(model, n: int, depth: int, rng: np.random.Generator) -> float:
    """n one-token steps; like llama-bench, each feeds a random token (no sampling)."""
    tokens = rng.integers(0, model.config.n_vocab, size=n).astype(np.int32)
    pos, slot, row = (np.zeros(1, np.int32) for _ in range(3))
    logits = np.zeros((1, model.config.n_vocab), np.float32)
    t = time.perf_counter()
    for i in range(n):
        pos[0] = depth + i
        model.transformer.forward(tokens[i : i + 1], pos, slot, row, logits)
    return time.perf_counter() - t


def run_bench(model, n_prompt: int, n_gen: int, reps: int, threads: int,
              depth: int = 0) -> list[BenchRow]:
    """A warm-up of each test, the depth fill, then `reps` timed runs of each test; returns
    the pp and tg rows."""
    rng = np.random.default_rng(0)
    tests = [(n, timer, kind) for n, timer, kind in
             ((n_prompt, _time_pp, "pp"), (n_gen, _time_tg, "tg")) if n > 0]
    for n, timer, _ in tests:
        timer(model, min(n, 16), 0, rng)  # warm-up: kernels loaded, caches touched
    _fill(model, depth, rng)
    rows = []
    device = model.transformer.device
    for n, timer, kind in tests:
        launched = device.launches if device is not None else 0
        seconds = [timer(model, n, depth, rng) for _ in range(reps)]
        per_token = ((device.launches - launched) / (n * reps)
                     if device is not None and kind == "tg" else 0.0)
        ts = [n / s for s in seconds]
        rows.append(BenchRow(
            model_filename=str(model.path), model_type=f"{model.config.arch} {model.config.name}",
            n_threads=threads, n_prompt=n if kind == "pp" else 0, n_gen=n if kind == "tg" else 0,
            n_depth=depth, flash_attn=model.transformer.flash_attn,
            n_gpu_layers=model.transformer.gpu_layers, launches_per_token=per_token,
            avg_ts=float(np.mean(ts)),
            stddev_ts=float(np.std(ts)), samples_ts=ts,
            samples_ns=[int(s * 1e9) for s in seconds], peak_rss_mb=peak_rss_mb()))
    return rows


def peak_rss_mb() -> float:
    """Peak resident set size of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
