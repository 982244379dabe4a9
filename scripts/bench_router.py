"""Router mode's overhead (issue 36): the same requests to a server, through a router
serving the same model and (--ray) through Ray Serve's proxy, our ingress and one engine
replica on a local Ray cluster, alternating. JSON out.

    python scripts/bench_router.py MODEL.gguf [-n 30] [--tokens 32] [-t 1] [--ray]
        [--json out.json]

Per request: wall time of a 1-token /completion (the added latency per request); per
streamed token: the mean gap between SSE events of a --tokens-token greedy stream (the added
latency per token). Medians over -n requests of each kind.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_server_harness import ServerProcess  # noqa: E402


def one_token(url: str, model: str) -> float:
    t = time.perf_counter()
    r = httpx.post(url + "/completion", timeout=120, json={
        "model": model, "prompt": "Hello", "n_predict": 1, "temperature": 0})
    r.raise_for_status()
    return time.perf_counter() - t


def token_gaps(url: str, model: str, n: int) -> float:
    body = {"model": model, "prompt": "Once upon a time", "n_predict": n, "temperature": 0,
            "stream": True, "ignore_eos": True}
    stamps = []
    with httpx.stream("POST", url + "/completion", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                stamps.append(time.perf_counter())
    gaps = [b - a for a, b in zip(stamps[1:], stamps[2:])]  # past the first token
    return statistics.mean(gaps)


def start_ray(model: str, flags: tuple[str, ...]) -> str:
    """One engine replica of `model` behind Ray Serve on a local cluster; its URL."""
    import ray
    from ray import serve

    from edgeinfer.ray import build_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app([model], flags, num_replicas=1, num_cpus=0), route_prefix="/",
              name="edgeinfer")
    return f"http://127.0.0.1:{port}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-n", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("-t", "--threads", default="1")
    ap.add_argument("--ray", action="store_true", help="also through Ray Serve")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp())
    name = Path(args.model).stem
    shutil.copy(args.model, folder / Path(args.model).name)
    flags = ("-np", "1", "-c", "512", "-t", args.threads, "--cache-ram", "0")
    direct = ServerProcess(Path(args.model), *flags)
    router = ServerProcess(Path(f"--models-dir={folder}"), *flags)
    urls = {"direct": direct.url, "router": router.url}
    try:
        if args.ray:
            urls["ray"] = start_ray(args.model, flags)
        for url in urls.values():
            one_token(url, name)  # loads the model behind a router
        runs = {kind: {"request_s": [], "token_gap_s": []} for kind in urls}
        for _ in range(args.n):  # alternate, so machine noise hits all alike
            for kind, url in urls.items():
                runs[kind]["request_s"].append(one_token(url, name))
        for _ in range(max(3, args.n // 10)):
            for kind, url in urls.items():
                runs[kind]["token_gap_s"].append(token_gaps(url, name, args.tokens))
        med = {kind: {k: statistics.median(v) for k, v in r.items()} for kind, r in runs.items()}
        result = {"model": Path(args.model).name, "threads": args.threads, "median": med,
                  "added_ms": {kind: {k: 1e3 * (med[kind][k] - med["direct"][k])
                                      for k in ("request_s", "token_gap_s")}
                               for kind in urls if kind != "direct"}}
    finally:
        direct.stop()
        router.stop()
        shutil.rmtree(folder, ignore_errors=True)
        if args.ray:
            import ray
            from ray import serve

            serve.shutdown()
            ray.shutdown()
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
