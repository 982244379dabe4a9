"""`python -m edgeinfer.server MODEL [flags]`: the same flags as `edgeinfer serve`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edgeinfer.errors import EdgeInferError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edgeinfer.server",
                                description="llama-server and OpenAI compatible HTTP API")
    p.add_argument("model", type=Path)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080,
                   help="0: a free port, named in the 'listening on' line")
    p.add_argument("-c", "--ctx-size", type=int, default=0, dest="n_ctx")
    p.add_argument("-np", "--parallel", type=int, default=-1, help="slots; -1: auto (4)")
    p.add_argument("--api-key", default=None)
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("--metrics", action="store_true")
    p.add_argument("-a", "--alias", default=None)
    p.add_argument("-cram", "--cache-ram", type=int, default=1024, dest="cache_ram",
                   help="MiB of RAM for prompts no slot holds any more (0: off)")
    p.add_argument("-fa", "--flash-attn", choices=("on", "off", "auto"), default="off",
                   help="flash attention, llama.cpp's -fa on numerics (auto: off)")
    p.add_argument("--max-body-bytes", type=int, default=64 << 20,
                   help="larger request bodies get 413 (default: 64 MiB)")
    p.add_argument("--sse-ping-interval", type=float, default=30.0,
                   help="seconds between SSE keep-alive comments (<= 0: none)")
    p.add_argument("--cors-origins", default="localhost",
                   help="origins browsers may call from, comma-separated: exact origins, * or "
                        "localhost (any port of localhost, 127.0.0.1, ::1; the default)")
    p.add_argument("--allowed-hosts", default="",
                   help="Host names accepted besides IP addresses, localhost and this machine's "
                        "name, comma-separated (*: any; the DNS rebinding guard off)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds running requests get after SIGTERM before they are ended")
    args = p.parse_args(argv)
    from edgeinfer.server import serve

    try:
        serve(args.model, host=args.host, port=args.port, n_ctx=args.n_ctx,
              parallel=args.parallel, api_key=args.api_key, threads=args.threads,
              metrics=args.metrics, alias=args.alias, cache_ram=args.cache_ram,
              flash_attn=args.flash_attn == "on", max_body_bytes=args.max_body_bytes,
              sse_ping_interval=args.sse_ping_interval, cors_origins=args.cors_origins,
              allowed_hosts=args.allowed_hosts, shutdown_timeout=args.shutdown_timeout)
    except EdgeInferError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
