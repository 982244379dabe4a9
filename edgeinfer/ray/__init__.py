"""Scale-out on Ray Serve (the `ray` extra): the server as a Ray Serve deployment.

    python -m edgeinfer.ray MODEL.gguf [MODEL.gguf ...] [--replicas N | --autoscale MIN:MAX]
        [--address auto] [--host 127.0.0.1] [--port 8000] [--no-prefix-affinity]
        [-- SERVER FLAGS]

Each engine replica is a router (server/router/) over the given models: it starts a worker
process per model on demand, so one replica can serve several models. An ingress deployment
reads each request and hands it to an engine replica chosen by its prompt's prefix
(routing.py: the replica that served the longest prefix, unless it is busier than the
rest); Ray Serve restarts a replica that dies and scales their number. The
routes are the server's (OpenAI, Anthropic, llama-server), through Ray Serve's HTTP proxy.
Multi-node: `ray start --head` on one machine, `ray start --address HEAD:6379` on the
others, then this command with `--address auto` on any of them (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def models_by_name(paths: list[str | Path]) -> dict[str, str]:
    """Each GGUF file (or every one in a directory) by its name without .gguf."""
    found: dict[str, str] = {}
    for item in map(Path, paths):
        files = sorted(item.glob("*.gguf")) if item.is_dir() else [item]
        for f in files:
            found.setdefault(f.stem, str(f.resolve()))
    return found


def build_app(models: list[str | Path], server_args: tuple[str, ...] = (), *,
              num_replicas: int = 1, autoscaling_config: dict | None = None,
              models_max: int = 4, name: str = "edgeinfer", num_cpus: float = 1.0,
              prefix_affinity: bool = True):
    """A Ray Serve application (bind it with serve.run) serving `models`: an ingress
    deployment `{name}` in front of the engine deployment `{name}-engine`, whose replicas
    are chosen by prompt prefix (routing.PrefixAffinityRouter) or, without
    prefix_affinity, by Ray's default power-of-two-choices router."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from edgeinfer.ray.deployments import Engine, ingress_deployment

    catalog = models_by_name(models)
    if not catalog:
        raise ValueError(f"no .gguf files in {models}")
    scale = ({"autoscaling_config": autoscaling_config} if autoscaling_config
             else {"num_replicas": num_replicas})
    routing = ({"request_router_config": RequestRouterConfig(
        request_router_class="edgeinfer.ray.routing.PrefixAffinityRouter")}
        if prefix_affinity else {})
    engine = serve.deployment(Engine, name=f"{name}-engine",
                              ray_actor_options={"num_cpus": num_cpus},
                              max_ongoing_requests=64, **scale, **routing)
    ingress = ingress_deployment(name)
    return ingress.bind(engine.bind(catalog, list(server_args), models_max))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    server_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m edgeinfer.ray",
                                description="serve GGUF models on Ray Serve")
    p.add_argument("models", nargs="+", help="GGUF files or directories of them")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--autoscale", default=None, metavar="MIN:MAX",
                   help="autoscale between MIN and MAX replicas instead")
    p.add_argument("--address", default=None, help="a Ray cluster to join ('auto': the "
                   "local one `ray start` made); default: start one here")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--no-prefix-affinity", action="store_true",
                   help="route by load alone (Ray's power-of-two choices)")
    a = p.parse_args(argv)
    try:
        import ray
        from ray import serve
    except ImportError:
        print("error: Ray Serve is not installed: pip install 'edgeinfer[ray]'",
              file=sys.stderr)
        return 1
    autoscaling = None
    if a.autoscale:
        low, high = (int(v) for v in a.autoscale.split(":"))
        autoscaling = {"min_replicas": low, "max_replicas": high,
                       "target_ongoing_requests": 4}
    try:
        app = build_app(a.models, tuple(server_args), num_replicas=a.replicas,
                        autoscaling_config=autoscaling,
                        prefix_affinity=not a.no_prefix_affinity)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    ray.init(address=a.address)
    serve.start(http_options={"host": a.host, "port": a.port})
    print(f"listening on http://{a.host}:{a.port} (Ray Serve)", file=sys.stderr)
    serve.run(app, route_prefix="/", blocking=True)
    return 0

