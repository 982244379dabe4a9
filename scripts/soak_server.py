"""Soak `edgeinfer serve`: many short requests from many clients, some hanging up mid-stream,
with the server's RSS sampled throughout, to show memory stays within the configured caches.

    python scripts/soak_server.py                       # SmolLM2 from the model cache
    python scripts/soak_server.py --model M.gguf --requests 20000 --out soak.json

`--clients` workers send `--requests` requests in all, each drawn from a seeded mix: streamed
chat read to the end, non-stream completions, and streamed chat whose client hangs up after the
first token (`--cancel-share`). Prompts are random word sequences, a share of them behind a
common system prompt, so the RAM prompt cache (`--cache-ram`, MiB) keeps taking entries and
must evict at its bound. The server's RSS (psutil) is sampled every `--sample-every` seconds
with the number of requests done. The JSON report (stdout, and `--out`) has the request counts
by outcome, the RSS curve, its figures at start, after warm-up and at the end, the slope over
the second half in MiB per 1,000 requests, and the drain: SIGTERM at the end, exit code and
seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

WORDS = ("apple river stone cloud lamp window garden music paper engine candle forest "
         "bridge winter silver ocean market letter castle mirror pepper rocket violin "
         "harbor meadow planet saddle thunder velvet whistle yellow zebra anchor").split()
SYSTEM = "You are a terse assistant. Answer in one short sentence and never use lists."
MIB = 1 << 20


def prompt_for(rng: random.Random) -> list[dict]:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 48)))
    messages = [{"role": "user", "content": f"Say something about: {words}"}]
    return ([{"role": "system", "content": SYSTEM}] if rng.random() < 0.3 else []) + messages


async def chat_stream(client: httpx.AsyncClient, body: dict, hang_up: bool) -> str:
    """A streamed chat; with `hang_up`, the client closes the connection after the first
    content chunk (a cancellation mid-stream)."""
    async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            await r.aread()
            return f"http_{r.status_code}"
        done = False
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return "error_event"
            if hang_up and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                return "cancelled"  # leaving the block closes the connection unread
        return "ok" if done else "truncated"


async def completion(client: httpx.AsyncClient, body: dict) -> str:
    r = await client.post("/v1/completions", json={
        "prompt": body["messages"][-1]["content"], "max_tokens": body["max_tokens"],
        "temperature": body["temperature"]})
    if r.status_code != 200:
        return f"http_{r.status_code}"
    return "ok" if r.json()["choices"][0]["finish_reason"] in ("length", "stop") else "bad"


async def one_request(client: httpx.AsyncClient, rng: random.Random, args) -> tuple[str, str]:
    body = {"messages": prompt_for(rng), "max_tokens": args.max_tokens,
            "temperature": rng.choice((0.0, 0.7))}
    draw = rng.random()
    kind = ("cancel" if draw < args.cancel_share else
            "completion" if draw < args.cancel_share + 0.25 else "stream")
    try:
        if kind == "completion":
            return kind, await completion(client, body)
        return kind, await chat_stream(client, body, hang_up=kind == "cancel")
    except httpx.HTTPError as exc:
        return kind, type(exc).__name__


async def soak(url: str, pid: int, args) -> dict:
    outcomes: Counter = Counter()
    done, samples = 0, []
    todo = iter(range(args.requests))
    proc = psutil.Process(pid)
    t0 = time.monotonic()

    def sample() -> None:
        cpu = proc.cpu_times()
        samples.append({"t": round(time.monotonic() - t0, 2), "requests": done,
                        "rss_mib": round(proc.memory_info().rss / MIB, 1),
                        "server_cpu_s": round(cpu.user + cpu.system, 1)})

    async def worker(index: int) -> None:
        nonlocal done
        rng = random.Random(args.seed * 1000 + index)
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=url, timeout=args.timeout, limits=limits) as client:
            for _ in todo:
                kind, outcome = await one_request(client, rng, args)
                outcomes[f"{kind}:{outcome}"] += 1
                done += 1

    async def sampler() -> None:
        while True:
            sample()
            await asyncio.sleep(args.sample_every)

    sampling = asyncio.create_task(sampler())
    await asyncio.gather(*(worker(i) for i in range(args.clients)))
    sampling.cancel()
    sample()
    wall = time.monotonic() - t0
    return {"outcomes": dict(sorted(outcomes.items())), "requests": done,
            "wall_s": round(wall, 1), "requests_per_s": round(done / wall, 1),
            "rss": summarize(samples, args.warmup_share), "rss_curve": samples}


def summarize(samples: list[dict], warmup_share: float) -> dict:
    """RSS at start, at the end of warm-up (the first `warmup_share` of the requests), at the
    end; the least-squares slope over the second half of the requests."""
    n_req = samples[-1]["requests"] or 1
    warm = next(s for s in samples if s["requests"] >= warmup_share * n_req)
    late = [s for s in samples if s["requests"] >= n_req / 2]
    slope = 0.0
    if len(late) >= 3 and late[-1]["requests"] > late[0]["requests"]:
        x = np.array([s["requests"] for s in late], float)
        y = np.array([s["rss_mib"] for s in late])
        slope = float(np.polyfit(x, y, 1)[0]) * 1000
    return {"start_mib": samples[0]["rss_mib"], "after_warmup_mib": warm["rss_mib"],
            "end_mib": samples[-1]["rss_mib"], "max_mib": max(s["rss_mib"] for s in samples),
            "second_half_min_mib": min(s["rss_mib"] for s in late),
            "second_half_max_mib": max(s["rss_mib"] for s in late),
            "second_half_slope_mib_per_1000_requests": round(slope, 2)}


def drain(server) -> dict:
    """SIGTERM the idle server: it should exit 0 at once."""
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        code = server.proc.wait(60)
    except Exception:  # noqa: BLE001 - reported, then the harness kills it
        code = None
    return {"exit_code": code, "seconds": round(time.monotonic() - t0, 2)}


def default_model() -> Path:
    from edgeinfer.pull import KNOWN_MODELS, models_dir

    return models_dir() / KNOWN_MODELS["smollm2"].filename


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=None, help="GGUF (default: SmolLM2-135M)")
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--cancel-share", type=float, default=0.15)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--parallel", type=int, default=8, help="server slots")
    p.add_argument("--ctx-size", type=int, default=512, help="per slot")
    p.add_argument("--cache-ram", type=int, default=1024, help="server's RAM prompt cache, MiB")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sample-every", type=float, default=1.0, help="seconds between samples")
    p.add_argument("--warmup-share", type=float, default=0.2,
                   help="share of the requests counted as warm-up")
    p.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    model = args.model or default_model()
    if not model.exists():
        p.error(f"{model} not found (python scripts/fetch_models.py smollm2)")
    from test_server_harness import ServerProcess

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still stop the server
    server = ServerProcess(model, "-t", str(args.threads), "-np", str(args.parallel),
                           "-c", str(args.parallel * args.ctx_size),
                           "--kv-unified-per-slot", str(args.ctx_size),
                           "--cache-ram", str(args.cache_ram))
    try:
        report = asyncio.run(soak(server.url, server.proc.pid, args))
        report["shutdown"] = drain(server)
    finally:
        server.stop()
    report = {"model": model.name, "clients": args.clients, "parallel": args.parallel,
              "ctx_size": args.ctx_size, "cache_ram_mib": args.cache_ram,
              "max_tokens": args.max_tokens, "cancel_share": args.cancel_share, **report}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
