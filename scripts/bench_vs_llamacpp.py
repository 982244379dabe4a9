"""edgeinfer against llama.cpp on the same GGUF file and thread count, alternating runs.

    python scripts/bench_vs_llamacpp.py MODEL [-p 512] [-n 128] [-t 2] [-d 0] [-r 5]
        [--llama-python /path/to/venv/bin/python | --llama-bench /path/to/llama-bench]
        [--json out.json]

llama.cpp is reached through a llama-bench binary, or through llama-cpp-python installed in
another interpreter (a separate venv: the product never needs it). Each round runs one
repetition of each engine, one after the other, so both see the same machine load; the
figures are medians over the rounds and the ratio is edgeinfer / llama.cpp. Prints a table
and writes llama-bench shaped JSON rows with an `engine` field. -d runs each test after that
many context tokens (llama-bench -d). Each llama.cpp keeps its defaults, which differ in
attention: llama-bench's flash attention is auto (on for a CPU), llama-cpp-python's off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

# llama-cpp-python's side: llama-bench's pp/tg semantics through the low-level eval.
LLAMA_CPP_PYTHON = textwrap.dedent("""
    import json, sys, time, random
    from llama_cpp import Llama
    path, n_prompt, n_gen, threads, depth = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                             int(sys.argv[4]), int(sys.argv[5]))
    llm = Llama(model_path=path, n_ctx=max(512, depth + max(n_prompt, n_gen)), n_threads=threads,
                n_threads_batch=threads, n_batch=512, n_ubatch=512, verbose=False)
    vocab = llm.n_vocab()
    rnd = random.Random(0)
    out = {}
    if n_prompt:
        llm.reset(); llm.eval([rnd.randrange(vocab) for _ in range(16)])
        llm.reset(); llm.eval([rnd.randrange(vocab) for _ in range(depth)])
        toks = [rnd.randrange(vocab) for _ in range(n_prompt)]
        t = time.perf_counter(); llm.eval(toks); out["pp"] = n_prompt / (time.perf_counter() - t)
    if n_gen:
        llm.reset(); llm.eval([rnd.randrange(vocab) for _ in range(depth)])
        tok = rnd.randrange(vocab)
        t = time.perf_counter()
        for _ in range(n_gen):
            llm.eval([tok])
        out["tg"] = n_gen / (time.perf_counter() - t)
    print(json.dumps(out))
""")


def run_edgeinfer(model: str, n_prompt: int, n_gen: int, threads: int, depth: int) -> dict:
    cmd = [sys.executable, "-m", "edgeinfer.cli", "bench", model, "-p", str(n_prompt),
           "-n", str(n_gen), "-t", str(threads), "-d", str(depth), "-r", "1", "--json"]
    rows = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in rows}


def run_llama_python(python: str, model: str, n_prompt: int, n_gen: int, threads: int,
                     depth: int) -> dict:
    cmd = [python, "-c", LLAMA_CPP_PYTHON, model, str(n_prompt), str(n_gen), str(threads),
           str(depth)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def run_llama_bench(binary: str, model: str, n_prompt: int, n_gen: int, threads: int,
                    depth: int) -> dict:
    cmd = [binary, "-m", model, "-p", str(n_prompt), "-n", str(n_gen), "-t", str(threads),
           "-r", "1", "-o", "json", *(["-d", str(depth)] if depth else [])]
    rows = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-d", "--n-depth", type=int, default=0, help="tokens in context first")
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("--llama-python", help="python of a venv with llama-cpp-python")
    ap.add_argument("--llama-bench", help="a llama-bench binary")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    if not (args.llama_python or args.llama_bench):
        sys.exit("llama.cpp not given: pass --llama-python or --llama-bench")
    spec = (args.model, args.n_prompt, args.n_gen, args.threads, args.n_depth)
    samples: dict[str, dict[str, list[float]]] = {"edgeinfer": {}, "llama.cpp": {}}
    for i in range(args.rounds):
        ours = run_edgeinfer(*spec)
        theirs = (run_llama_bench(args.llama_bench, *spec) if args.llama_bench
                  else run_llama_python(args.llama_python, *spec))
        for engine, result in (("edgeinfer", ours), ("llama.cpp", theirs)):
            for test, ts in result.items():
                samples[engine].setdefault(test, []).append(ts)
        print(f"round {i + 1}: edgeinfer {ours}  llama.cpp {theirs}", file=sys.stderr)
    rows = report(samples, args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


def report(samples: dict, args) -> list[dict]:
    rows = []
    at = f" @ d{args.n_depth}" if args.n_depth else ""
    width = len(f"pp{max(args.n_prompt, args.n_gen)}{at}") + 2
    print(f"{'test':{width}s} {'edgeinfer t/s':>14s} {'llama.cpp t/s':>14s} {'ratio':>7s}")
    for test, n in (("pp", args.n_prompt), ("tg", args.n_gen)):
        if test not in samples["edgeinfer"]:
            continue
        ours = statistics.median(samples["edgeinfer"][test])
        theirs = statistics.median(samples["llama.cpp"][test])
        print(f"{f'{test}{n}{at}':{width}s} {ours:14.2f} {theirs:14.2f} {ours / theirs:7.2f}")
        for engine in samples:
            ts = samples[engine][test]
            rows.append({"engine": engine, "model_filename": args.model,
                         "n_threads": args.threads, "n_depth": args.n_depth,
                         "n_prompt": n if test == "pp" else 0,
                         "n_gen": n if test == "tg" else 0, "avg_ts": statistics.mean(ts),
                         "stddev_ts": statistics.pstdev(ts), "samples_ts": ts,
                         "median_ts": statistics.median(ts)})
    return rows


if __name__ == "__main__":
    main()
