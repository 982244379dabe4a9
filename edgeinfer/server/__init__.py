"""`edgeinfer serve`: a llama-server and OpenAI compatible HTTP API (needs the 'serve' extra).

`serve()` binds the socket first, then loads the model in the engine thread, so `/health`
answers 503 while the model loads and 200 once it is ready. Port 0 binds a port the system
picks; the "listening on http://HOST:PORT" line on stderr names the one it got.
"""

from __future__ import annotations

import logging
import socket
import sys
from dataclasses import replace
from pathlib import Path

from edgeinfer.errors import EdgeInferError
from edgeinfer.server.apis.vertex import VertexSettings
from edgeinfer.server.options import ServerSettings

log = logging.getLogger("edgeinfer.server")


def serve(model_path: Path, settings: ServerSettings | None = None) -> None:
    """Serve `model_path` with `settings` (options.py) until interrupted (blocking)."""
    import uvicorn

    from edgeinfer.server.app import Server, create_app
    from edgeinfer.server.engine import Engine
    from edgeinfer.server.shutdown import FLUSH_SECONDS, DrainingServer, Gate

    settings = settings or ServerSettings()
    try:
        vertex = VertexSettings.from_env()
    except ValueError as exc:
        raise EdgeInferError(str(exc)) from None
    settings = replace(settings, port=vertex.listen_port(settings.port))
    _setup_logging(settings.verbose)
    failures: list[BaseException] = []
    socks = _bind_all(settings.hosts, settings.port)
    # uvicorn's own graceful wait runs after DrainingServer's bounded one: a backstop only
    # asyncio and h11 whatever else is installed (ray[serve] brings uvloop and httptools):
    # the server behaves the same everywhere
    config = uvicorn.Config(None, log_level="warning", timeout_keep_alive=30, loop="asyncio",
                            http="h11", timeout_graceful_shutdown=FLUSH_SECONDS)

    def on_fail(exc: BaseException) -> None:
        failures.append(exc)
        server.should_exit = True

    engine = Engine(Path(model_path), settings, on_fail)
    gate = Gate()
    server = DrainingServer(config, gate, engine, settings.shutdown_timeout)
    access = access_policy(settings)
    config.app = create_app(Server(engine, Path(model_path), settings, access=access,
                                   gate=gate, vertex=vertex))
    log.info("listening on %s (loading %s)", ", ".join(_url(s) for s in socks), model_path)
    engine.start()
    try:
        server.run(sockets=socks)
    finally:
        engine.stop()
        for sock in socks:
            sock.close()
    if failures:
        exc = failures[0]
        if isinstance(exc, EdgeInferError):
            raise exc
        raise EdgeInferError(f"loading {model_path} failed: {type(exc).__name__}: {exc}")


def access_policy(settings: ServerSettings):
    """The Host and Origin rules of a server (or a router) bound as `settings` say."""
    from edgeinfer.server.security import AccessPolicy

    return AccessPolicy(settings.cors_origins,
                        ",".join((settings.allowed_hosts, *settings.hosts[1:])),
                        settings.hosts[0])


def _bind_all(hosts: tuple[str, ...], port: int) -> list[socket.socket]:
    """One socket per address, all on the same port (port 0: the port the first one got)."""
    socks: list[socket.socket] = []
    try:
        for host in hosts:
            socks.append(_bind(host, port))
            port = port or socks[0].getsockname()[1]
    except EdgeInferError:
        for sock in socks:
            sock.close()
        raise
    return socks


def _bind(host: str, port: int) -> socket.socket:
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:  # ::1 and 127.0.0.1 on one port are two sockets
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
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


def _setup_logging(verbose: bool = False) -> None:
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(logging.DEBUG if verbose else logging.INFO)


__all__ = ["serve"]
