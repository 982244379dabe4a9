"""KV memory and time to first token of servers, side by side (issue 38's figures).

    python scripts/bench_kv_pool.py shared MODEL.gguf \\
        --server "after=edgeinfer serve {model} -t 2 -np 8 -c 16384 --metrics" \\
        --server "llama=llama-server -m {model} -t 2 -np 8 -c 16384 --kv-unified --metrics" \\
        --rounds 3 --json out.json

Each --server is NAME=COMMAND ({model} and {port} are filled in; --port is added unless
{port} is there). Every round starts each server in turn, warms it with one request, runs
the scenario and stops it, so the servers alternate under the same machine noise.

  shared   8 clients at once, each a ~1,000-token system prompt and its own question, 16
           greedy tokens: time to first token of each (streamed /completion), the wall time,
           and the KV cells the run held: the sum of the replies' tokens_cached (each
           sequence's cells) and, where the server reports it, edgeinfer:kv_cells_peak (the
           pool's cells held at once, shared blocks counted once).
  budget   --clients requests at once, each ~--prompt random-word tokens and --gen greedy
           tokens: the most requests generating at once (client side: first token received,
           not yet finished), the wall time and the generated tokens/s.

Results: per server, each round's figures and their medians, as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, command: str, model: str):
        self.port = free_port()
        args = command.format(model=model, port=self.port)
        if "{port}" not in command:
            args += f" --port {self.port}"
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.proc = subprocess.Popen(shlex.split(args), stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{args} exited:\n{Path(self.log.name).read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(args)
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def tokens(self, text: str) -> int:
        r = httpx.post(self.url + "/tokenize", json={"content": text}, timeout=30)
        return len(r.json()["tokens"])

    def metric(self, name: str) -> float | None:
        r = httpx.get(self.url + "/metrics", timeout=10)
        for line in r.text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None


async def stream(client: httpx.AsyncClient, url: str, prompt: str, n: int) -> dict:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True,
            "stream": True, "cache_prompt": True}
    t0 = time.perf_counter()
    first = last = None
    async with client.stream("POST", url + "/completion", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            now = time.perf_counter()
            if first is None:
                first = now
            if event.get("stop") or "error" in event:
                last = event
    if last is None or "error" in last:  # the server gave up on it (llama-server: KV full)
        return {"error": str((last or {}).get("error", "no final event"))[:200]}
    return {"start": t0, "first": first, "end": time.perf_counter(),
            "ttft_ms": 1e3 * (first - t0), "tokens_cached": last.get("tokens_cached", 0),
            "cache_n": last.get("timings", {}).get("cache_n", 0)}


async def run_clients(url: str, prompts: list[str], n: int) -> list[dict]:
    async with httpx.AsyncClient(timeout=600) as client:
        return await asyncio.gather(*(stream(client, url, p, n) for p in prompts))


def system_prompt(server: Server, n_tokens: int) -> str:
    rules, text = 0, ""
    while server.tokens(text) < n_tokens:
        rules += 4
        text = " ".join(f"Rule {i}: answer politely and briefly, and never mention the "
                        f"number {i}." for i in range(rules))
    return text


QUESTIONS = ["What is the sea?", "Name a robot.", "Why do mountains rise?", "Is the city loud?",
             "Where is the old library?", "When does rain fall?", "Who plays chess?",
             "How far is the moon?"]


def shared(server: Server, args) -> dict:
    system = system_prompt(server, args.system)
    prompts = [f"{system}\nUser: {q}\nAssistant:" for q in QUESTIONS]
    t0 = time.perf_counter()
    results = asyncio.run(run_clients(server.url, prompts, 16))
    wall = time.perf_counter() - t0
    if any("error" in r for r in results):
        raise RuntimeError(f"failed requests: {results}")
    ttft = sorted(r["ttft_ms"] for r in results)
    return {"system_tokens": server.tokens(system), "wall_s": wall,
            "ttft_ms_median": statistics.median(ttft), "ttft_ms_max": ttft[-1],
            "ttft_ms": ttft, "cells_of_sequences": sum(r["tokens_cached"] for r in results),
            "cells_peak": server.metric("edgeinfer:kv_cells_peak"),
            "cache_n": [r["cache_n"] for r in results]}


WORDS = ("apple river stone cloud window garden silver paper orange music forest ladder "
         "candle bridge winter pocket yellow market camera island").split()


def budget(server: Server, args) -> dict:
    prompts = []
    for i in range(args.clients):
        words = [WORDS[(i * 7 + j * (i + 3)) % len(WORDS)] for j in range(args.prompt)]
        prompts.append(f"Request {i}: " + " ".join(words))
    t0 = time.perf_counter()
    results = asyncio.run(run_clients(server.url, prompts, args.gen))
    wall = time.perf_counter() - t0
    failed = [r["error"] for r in results if "error" in r]
    results = [r for r in results if "error" not in r]
    events = sorted([(r["first"], 1) for r in results] + [(r["end"], -1) for r in results])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return {"wall_s": wall, "peak_generating": peak, "failed": len(failed),
            "errors": failed[:2], "gen_tokens_per_s": len(results) * args.gen / wall,
            "preempted": server.metric("edgeinfer:kv_preemptions_total"),
            "cells_peak": server.metric("edgeinfer:kv_cells_peak")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario", choices=("shared", "budget"))
    p.add_argument("model")
    p.add_argument("--server", action="append", required=True, metavar="NAME=COMMAND")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--system", type=int, default=1000, help="shared: system prompt tokens")
    p.add_argument("--clients", type=int, default=16, help="budget: requests at once")
    p.add_argument("--prompt", type=int, default=200, help="budget: words of each prompt")
    p.add_argument("--gen", type=int, default=100, help="budget: tokens each generates")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    servers = [s.split("=", 1) for s in args.server]
    scenario = {"shared": shared, "budget": budget}[args.scenario]
    runs: dict[str, list[dict]] = {name: [] for name, _ in servers}
    for r in range(args.rounds):
        for name, command in servers:
            server = Server(command, args.model)
            try:
                asyncio.run(run_clients(server.url, ["Hello"], 2))  # warm
                runs[name].append(scenario(server, args))
            finally:
                server.stop()
            print(f"round {r + 1} {name}: {json.dumps(runs[name][-1])}", file=sys.stderr)
    out = {"scenario": args.scenario, "model": args.model, "servers": dict(servers),
           "runs": runs, "median": {}}
    for name, results in runs.items():
        keys = [k for k, v in results[0].items() if isinstance(v, (int, float))]
        out["median"][name] = {k: statistics.median(r[k] for r in results) for k in keys}
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
