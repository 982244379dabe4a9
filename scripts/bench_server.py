"""Benchmark an OpenAI-compatible server with N concurrent streaming chat clients.

    python scripts/bench_server.py --model MODEL.gguf --threads 2          # starts edgeinfer
    python scripts/bench_server.py --url http://127.0.0.1:8080             # any running server

For each client count (default 1, 4, 8, 16), every client sends `--requests` streamed, greedy
chat requests of `--max-tokens` completion tokens (ignore_eos, so every reply has the same
length) back to back; `--system-rules N` prefixes each with a shared system prompt of N rule
sentences (60: ~1,130 SmolLM2 tokens), for decoding over a long context. Reported as JSON:
aggregate generated tokens/s over the level's wall time, and time-to-first-token /
inter-token latency percentiles in milliseconds; each level runs --repeat times and the
median run (by tokens/s) is reported, with every run's tokens/s. `--response-format json`
asks each request for a JSON array of strings (structured output, issue 34), which never
completes, so the replies keep their length.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

TOPICS = ["the sea", "a robot", "mountains", "a city at night", "an old library", "rain",
          "a chess game", "the moon", "a bakery", "trains", "a garden", "winter", "a lighthouse",
          "music", "a desert", "friendship"]


def system_prompt(n_rules: int) -> str:
    return " ".join(f"Rule {i}: answer politely and briefly, and never mention the number {i}."
                    for i in range(n_rules))


RESPONSE_FORMATS = {
    "none": {},
    "json": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "list", "schema": {"type": "array", "items": {"type": "string"}}}}},
}
EXTRA: dict = {}  # fields every request adds (--response-format)


async def one_request(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int,
                      system: str = "") -> dict:
    messages = [{"role": "system", "content": system}] if system else []
    body = {"model": "bench", "messages": [*messages, {"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, **EXTRA}
    t0 = time.perf_counter()
    stamps, n_tokens = [], 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                n_tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                stamps.append(time.perf_counter())
    return {"ttft": stamps[0] - t0 if stamps else None, "itl": list(np.diff(stamps)),
            "tokens": n_tokens or len(stamps)}


async def client_loop(client, url, index, n_requests, max_tokens, system) -> list[dict]:
    results = []
    for j in range(n_requests):
        topic = TOPICS[(index + 5 * j) % len(TOPICS)]
        prompt = f"Client {index}, request {j}: write a long story about {topic}."
        try:
            results.append(await one_request(client, url, prompt, max_tokens, system))
        except httpx.RemoteProtocolError:  # a kept-alive connection the server had closed
            results.append(await one_request(client, url, prompt, max_tokens, system))
    return results


def percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    ms = 1e3 * np.asarray(values)
    return {f"p{q}": round(float(np.percentile(ms, q)), 1) for q in (50, 90, 99)} | \
        {"mean": round(float(ms.mean()), 1)}


async def run_level(url: str, n_clients: int, n_requests: int, max_tokens: int,
                    system: str = "") -> dict:
    limits = httpx.Limits(max_connections=n_clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        per_client = await asyncio.gather(*(client_loop(client, url, i, n_requests, max_tokens,
                                                        system)
                                            for i in range(n_clients)))
        wall = time.perf_counter() - t0
    results = [r for rs in per_client for r in rs]
    tokens = sum(r["tokens"] for r in results)
    return {"clients": n_clients, "requests": len(results), "completion_tokens": tokens,
            "wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 1),
            "ttft_ms": percentiles([r["ttft"] for r in results if r["ttft"] is not None]),
            "itl_ms": percentiles([x for r in results for x in r["itl"]])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", help="a running server (else one is started with --model)")
    p.add_argument("--model", type=Path, help="GGUF to serve with edgeinfer")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--parallel", type=int, default=16, help="slots of the started server")
    p.add_argument("--ctx-size", type=int, default=1024, help="per slot, started server")
    p.add_argument("--clients", default="1,4,8,16")
    p.add_argument("--requests", type=int, default=2, help="requests per client")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--system-rules", type=int, default=0,
                   help="shared system prompt of this many rule sentences (0: none)")
    p.add_argument("--repeat", type=int, default=3, help="runs per level; the median is shown")
    p.add_argument("--response-format", choices=sorted(RESPONSE_FORMATS), default="none")
    p.add_argument("--out", type=Path, help="also write the JSON here")
    args = p.parse_args()
    EXTRA.update(RESPONSE_FORMATS[args.response_format])
    if not args.url and not args.model:
        p.error("give --url or --model")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still stop the server
    server = None
    if not args.url:
        from test_server_harness import ServerProcess

        server = ServerProcess(args.model, "-t", str(args.threads), "-np", str(args.parallel),
                               "-c", str(args.parallel * args.ctx_size),
                               "--kv-unified-per-slot", str(args.ctx_size))
        args.url = server.url
    try:
        system = system_prompt(args.system_rules)
        asyncio.run(run_level(args.url, 1, 1, 8, system))  # warm-up
        levels = []
        for n in args.clients.split(","):  # median of --repeat: this machine kind is noisy
            runs = [asyncio.run(run_level(args.url, int(n), args.requests, args.max_tokens,
                                          system))
                    for _ in range(args.repeat)]
            by_speed = sorted(runs, key=lambda level: level["tokens_per_s"])
            median = by_speed[(len(runs) - 1) // 2]  # the lower middle for an even count
            median["tokens_per_s_runs"] = [level["tokens_per_s"] for level in runs]
            levels.append(median)
    finally:
        if server is not None:
            server.stop()
    report = {"server": "edgeinfer" if server else args.url,
              "model": str(args.model) if args.model else None, "threads": args.threads,
              "max_tokens": args.max_tokens, "system_rules": args.system_rules,
              "response_format": args.response_format,
              "levels": levels}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
