"""`edgeinfer serve`: a llama-server and OpenAI compatible HTTP API (needs the 'serve' extra).

`serve()` binds the socket first, then loads the model in the engine thread, so `/health`
answers 503 while the model loads and 200 once it is ready. Port 0 binds a port the system
picks; the "listening on http://HOST:PORT" line on stderr names the one it got.
"""

from __future__ import annotations

import logging
import math
import socket
import sys
from pathlib import Path

from edgeinfer.errors import EdgeInferError

log = logging.getLogger("edgeinfer.server")


def serve(model_path: Path, host: str = "127.0.0.1", port: int = 8080, n_ctx: int = 0,
          parallel: int = 1, api_key: str | None = None, threads: int | None = None,
          metrics: bool = False, alias: str | None = None, cache_ram: int = 1024,
          flash_attn: bool = False, max_body_bytes: int = 64 << 20,
          sse_ping_interval: float = 30.0, cors_origins: str = "localhost",
          allowed_hosts: str = "", shutdown_timeout: float = 30.0) -> None:
    """Serve `model_path` until interrupted (blocking). `api_key` may list several keys,
    comma-separated; `parallel` is the number of slots (sequences batched together);
    `n_ctx` is the context of each slot (0: min(4096, the model's)); `cache_ram` is the MiB
    of RAM for the KV of sequences no slot holds any more (0: none); `flash_attn` selects
    llama.cpp's -fa on attention numerics; a request body over `max_body_bytes` gets 413;
    `sse_ping_interval` is the seconds between SSE keep-alive comments when a request does
    not set its own (<= 0: none). `cors_origins` and `allowed_hosts` are the browser guards
    of security.py; `shutdown_timeout` the seconds running requests get after SIGTERM
    (shutdown.py)."""
    if max_body_bytes < 1 or not math.isfinite(sse_ping_interval):
        raise EdgeInferError("--max-body-bytes must be >= 1 and --sse-ping-interval finite")
    import uvicorn

    from edgeinfer.server.app import Server, create_app
    from edgeinfer.server.engine import Engine
    from edgeinfer.server.security import AccessPolicy, split_list
    from edgeinfer.server.shutdown import FLUSH_SECONDS, DrainingServer, Gate

    _setup_logging()
    failures: list[BaseException] = []
    sock = _bind(host, port)
    # uvicorn's own graceful wait runs after DrainingServer's bounded one: a backstop only
    config = uvicorn.Config(None, log_level="warning", timeout_keep_alive=30,
                            timeout_graceful_shutdown=FLUSH_SECONDS)

    def on_fail(exc: BaseException) -> None:
        failures.append(exc)
        server.should_exit = True

    engine = Engine(Path(model_path), n_ctx, parallel if parallel > 0 else 4, threads, on_fail,
                    cache_ram, flash_attn)
    gate = Gate()
    server = DrainingServer(config, gate, engine, shutdown_timeout)
    access = AccessPolicy(cors_origins, allowed_hosts, host)
    config.app = create_app(Server(engine, Path(model_path), alias, split_list(api_key),
                                   metrics, max_body_bytes=max_body_bytes,
                                   sse_ping_interval=sse_ping_interval, access=access,
                                   gate=gate))
    log.info("listening on %s (loading %s)", _url(sock), model_path)
    engine.start()
    try:
        server.run(sockets=[sock])
    finally:
        engine.stop()
        sock.close()
    if failures:
        exc = failures[0]
        if isinstance(exc, EdgeInferError):
            raise exc
        raise EdgeInferError(f"loading {model_path} failed: {type(exc).__name__}: {exc}")


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise EdgeInferError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _url(sock: socket.socket) -> str:
    """http://HOST:PORT of a bound socket: the real port when it was bound to port 0."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _setup_logging() -> None:
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


__all__ = ["serve"]
