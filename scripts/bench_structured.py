"""Structured output's cost (issue 34): decode tokens/s of the server's engine with a JSON
schema against the same run without one, at 1 and 8 sequences, and the schemas' compile
times over the corpus in ../shared/structured. JSON out.

    python scripts/bench_structured.py MODEL.gguf [MODEL.gguf ...] -t 2 --rounds 3 --json out.json

Each measurement submits B jobs of --tokens greedy tokens (ignore_eos, no prompt cache) to
one engine (the server's, without HTTP) and times them from the first submit to the last
token; decode tokens/s is B x tokens over that time minus the prompt's. The schema is an
array of strings, which never completes, so every job generates all its tokens. Runs with
and without the schema alternate within each round, so machine noise hits both alike; the
ratio is paired per round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

from edgeinfer.sampling import SamplingParams
from edgeinfer.server.engine import Engine, ErrorEvent, FinalEvent, Job
from edgeinfer.server.options import ServerSettings
from edgeinfer.server.params import GenParams
from edgeinfer.structured import Constraint, compile_constraint

SCHEMA = {"type": "array", "items": {"type": "string"}}
CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "structured"
PROMPT = "List the names of some colours, as a JSON array of strings."


def start_engine(model: Path, n_slots: int, threads: int | None, n_ctx: int = 1024) -> Engine:
    settings = ServerSettings(n_slots=n_slots, n_ctx=n_slots * n_ctx, n_ctx_slot=n_ctx,
                              threads=threads, cache_ram_mib=0)
    failures: list[BaseException] = []
    engine = Engine(model, settings, failures.append)
    engine.start()
    while not engine.ready.is_set():
        if failures:
            raise failures[0]
        time.sleep(0.05)
    return engine


def run_jobs(engine: Engine, prompt: list[int], n_jobs: int, n_tokens: int,
             compiled) -> tuple[float, list[FinalEvent]]:
    """Seconds from the first submit to the last final event, and the final events."""
    params = GenParams(sampling=SamplingParams(temperature=0), n_predict=n_tokens,
                       ignore_eos=True, cache_prompt=False)
    finals: list = []
    done = threading.Event()

    def sink(event) -> None:
        if isinstance(event, (FinalEvent, ErrorEvent)):
            finals.append(event)
            if len(finals) == n_jobs:
                done.set()
    t0 = time.perf_counter()
    for _ in range(n_jobs):
        engine.submit(Job(prompt, params, sink, compiled))
    done.wait()
    seconds = time.perf_counter() - t0
    errors = [f.error.message for f in finals if isinstance(f, ErrorEvent)]
    if errors:
        raise SystemExit(f"a job failed: {errors[0]}")
    return seconds, finals


def decode_rate(seconds: float, finals: list[FinalEvent]) -> float:
    """Decode tokens/s of the batch: its tokens over the time after the prompts."""
    prompt_s = max(f.timings["prompt_ms"] for f in finals) / 1e3
    return sum(f.n_decoded for f in finals) / max(seconds - prompt_s, 1e-9)


def bench_model(model: Path, args) -> dict:
    engine = start_engine(model, max(args.batches), args.threads)
    try:
        tok = engine.model.tokenizer
        prompt = engine.model.tokenize(engine.model.apply_chat_template(
            [{"role": "user", "content": PROMPT}]))
        compiled = compile_constraint(tok, Constraint.json_schema(SCHEMA))
        run_jobs(engine, prompt, 1, 8, compiled)  # warm-up: the first mask, kernels
        rows = {}
        for batch in args.batches:
            plain, schema = [], []
            for _ in range(args.rounds):
                plain.append(decode_rate(*run_jobs(engine, prompt, batch, args.tokens, None)))
                schema.append(decode_rate(*run_jobs(engine, prompt, batch, args.tokens,
                                                    compiled)))
            rows[str(batch)] = {
                "tokens_per_s_plain": statistics.median(plain),
                "tokens_per_s_schema": statistics.median(schema),
                "ratio_paired": statistics.median(s / p for s, p in zip(schema, plain)),
                "rounds_plain": plain, "rounds_schema": schema}
        return {"model": model.name, "n_vocab": tok.n_vocab, "batches": rows,
                "compile": compile_times(tok)}
    finally:
        engine.stop()


def compile_times(tok) -> dict:
    """Compile seconds of every corpus schema (a fresh compile: the cache is bypassed by
    a whitespace change), p50 / p99 / max, and how many compiled."""
    times, failed = [], 0
    for path in sorted(CORPUS.glob("*.json")):
        schema = json.loads(path.read_text(encoding="utf-8"))["schema"]
        text = json.dumps(schema, ensure_ascii=False) + " " * len(times)
        t0 = time.perf_counter()
        try:
            compile_constraint(tok, Constraint("json_schema", text), approximate=True)
        except Exception:  # noqa: BLE001 - counted: what compiles is the measurement
            failed += 1
        times.append(time.perf_counter() - t0)
    if not times:
        return {"schemas": 0}
    times.sort()
    return {"schemas": len(times), "failed": failed,
            "p50_ms": 1e3 * times[len(times) // 2],
            "p99_ms": 1e3 * times[min(len(times) - 1, int(0.99 * len(times)))],
            "max_ms": 1e3 * times[-1]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("models", type=Path, nargs="+")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--batches", default="1,8")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    results = [bench_model(model, args) for model in args.models]
    text = json.dumps({"threads": args.threads, "tokens": args.tokens, "results": results},
                      indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
