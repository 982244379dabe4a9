"""A bounded shutdown. On SIGTERM (or SIGINT):

1. the gate closes: every new request is answered 503 with the error envelope (the socket
   keeps listening, so a client gets that answer rather than a refused connection), and the
   engine refuses the jobs still waiting for a slot, and any submitted later, with 503;
2. requests already running may finish for `--shutdown-timeout` seconds (default 30);
3. the engine then ends the rest with 503 (a stream gets a final `data: {"error": ...}`
   event), the replies are flushed, and the process exits 0.

A second signal exits at once. uvicorn alone would wait for every connection without a
deadline and then re-raise SIGTERM, so the process would die by the signal.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from types import FrameType

import uvicorn

from edgeinfer.server.engine import Engine
from edgeinfer.server.errors import SHUTTING_DOWN
from edgeinfer.server.security import send_error

log = logging.getLogger("edgeinfer.server")
FLUSH_SECONDS = 5.0  # for the requests ended at the deadline to send their last bytes


class Gate:
    """Counts the requests being served; once closed, answers new ones 503. Used only from
    the event loop's thread."""

    def __init__(self) -> None:
        self.closed = False
        self.in_flight = 0


class GateMiddleware:
    """ASGI middleware in front of the routes: counts requests in and out of the gate."""

    def __init__(self, app, gate: Gate):
        self.app, self.gate = app, gate

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.gate.closed:
            return await send_error(send, SHUTTING_DOWN, [(b"connection", b"close")])
        self.gate.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.gate.in_flight -= 1


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the shutdown above instead of uvicorn's own."""

    def __init__(self, config: uvicorn.Config, gate: Gate, engine: Engine,
                 shutdown_timeout: float):
        super().__init__(config)
        self.gate, self.engine, self.shutdown_timeout = gate, engine, max(0.0, shutdown_timeout)
        self._drain: asyncio.Task | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The signal handler: only flags are set here; on_tick starts the drain."""
        if self.gate.closed:  # the second signal: stop now
            self.should_exit = self.force_exit = True
            return
        self.gate.closed = True
        log.info("%s: refusing new requests, %d running get up to %g s",
                 signal.Signals(sig).name, self.gate.in_flight, self.shutdown_timeout)

    async def on_tick(self, counter: int) -> bool:
        if self.gate.closed and self._drain is None:
            self._drain = asyncio.create_task(self.drain())
        return await super().on_tick(counter)

    async def drain(self) -> None:
        self.engine.drain()
        if not await self._wait_idle(self.shutdown_timeout):
            log.info("shutdown: ending %d requests still running after %g s",
                     self.gate.in_flight, self.shutdown_timeout)
            self.engine.abort_running()
            await self._wait_idle(FLUSH_SECONDS)
        self.should_exit = True

    async def _wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.gate.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return not self.gate.in_flight
