"""Start-up of a one-shot `edgeinfer run` (issue 36): in-process (`--local`), through a warm
server (`--host`), and llama.cpp's `llama-completion` on the same model and threads,
alternating; then a shell loop of --prompts one-shot runs, each a new process, through the
server and with llama-completion. JSON out.

    python scripts/bench_startup.py MODEL.gguf --llama-completion PATH [-n 7] [-t 2]
        [--prompts 100] [--json out.json]

Wall time of the whole process, medians over -n runs of each kind.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_server_harness import ServerProcess  # noqa: E402

EDGEINFER = ([shutil.which("edgeinfer")] if shutil.which("edgeinfer")
             else [sys.executable, "-c", "import sys; from edgeinfer.cli import main; "
                                         "sys.exit(main())"])


def wall(cmd: list[str], stdin: str | None = None) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, input=stdin, text=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True,
                   **({} if stdin is not None else {"stdin": subprocess.DEVNULL}))
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--llama-completion", required=True, help="llama.cpp's binary")
    ap.add_argument("-n", type=int, default=7)
    ap.add_argument("-t", "--threads", default="2")
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model, t = args.model, args.threads
    server = ServerProcess(Path(model), "-np", "1", "-c", "2048", "-t", t)
    run = [*EDGEINFER, "run", model, "-t", t]
    llama = [args.llama_completion, "-m", model, "-t", t, "-no-cnv", "-c", "2048"]
    one_shot = {"local": [*run, "--local", "-p", "hi", "-n", "1"],
                "server": [*run, "--host", server.url, "-p", "hi", "-n", "1"],
                "llama-completion": [*llama, "-p", "hi", "-n", "1"]}
    try:
        for cmd in one_shot.values():
            wall(cmd)  # warm the page cache and Numba's cache
        times = {k: [] for k in one_shot}
        for _ in range(args.n):  # alternate, so machine noise hits all alike
            for kind, cmd in one_shot.items():
                times[kind].append(wall(cmd))
        prompts = [f"Write one word about the number {i}." for i in range(args.prompts)]
        loop = {"server": 0.0, "llama-completion": 0.0}
        for p in prompts:  # `echo PROMPT | edgeinfer run MODEL -n 4`, one process each
            loop["server"] += wall([*run, "--host", server.url, "-n", "4"], stdin=p + "\n")
            loop["llama-completion"] += wall([*llama, "-p", p, "-n", "4"])
    finally:
        server.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"model": Path(model).name, "threads": t, "runs": args.n,
              "one_shot_median_s": med,
              "ratio_to_llama_completion": {k: med[k] / med["llama-completion"]
                                            for k in ("local", "server")},
              "piped_prompts": args.prompts, "piped_total_s": loop}
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
