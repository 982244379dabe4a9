"""Test harness (no tests here): start `python -m edgeinfer.server` as a subprocess and wait
until it is ready.

The server binds port 0 itself and says which port it got ("listening on http://HOST:PORT");
the harness reads that line, so no port is ever picked here and released for the server to
take (another process could take it between the two). Every wait ends at its deadline with
an exception that carries the server's last log lines; none returns quietly.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx

ROOT = Path(__file__).resolve().parents[1]
LISTENING = re.compile(r"listening on (http://\S+):(\d+)")
T = TypeVar("T")


class ServerProcess:
    """`python -m edgeinfer.server MODEL --port 0 ARGS...` (`entry` may name another module
    that takes the same arguments: `("edgeinfer.cli", "serve")`), ready on return."""

    def __init__(self, model: Path, *args: str, timeout: float = 600.0,
                 entry: tuple[str, ...] = ("edgeinfer.server",)):
        fd, log_path = tempfile.mkstemp(prefix="edgeinfer-server-", suffix=".log")
        self.log_path = Path(log_path)
        self.log = os.fdopen(fd, "w")  # closed and removed in stop()
        self.port, self.url = 0, ""  # known once the server says where it listens
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *entry, str(model), "--port", "0", *args],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    # -- waiting -----------------------------------------------------------------------------
    def poll(self, what: str, probe: Callable[[], T], timeout: float) -> T:
        """Call `probe` until it returns something truthy and return that; raise
        TimeoutError naming `what` at the deadline, RuntimeError if the server exits."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited (code {self.proc.returncode}) while waiting "
                                   f"for {what}\n{self.log_tail()}")
            got = probe()
            if got:
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"gave up waiting for {what} after {timeout} s\n"
                                   f"{self.log_tail()}")
            time.sleep(0.05)

    def wait_ready(self, timeout: float) -> None:
        """Wait for the "listening on" line, then for /health to answer 200."""
        deadline = time.monotonic() + timeout
        match = self.poll("the 'listening on' line", lambda: LISTENING.search(self.log_text()),
                          timeout)
        self.port = int(match.group(2))
        self.url = f"{match.group(1)}:{self.port}"
        self.poll(f"{self.url}/health answering 200", self._healthy,
                  max(0.0, deadline - time.monotonic()))

    def _healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def slots(self) -> list[dict]:
        return httpx.get(self.url + "/slots", timeout=10).json()

    def wait_idle(self, timeout: float = 30.0) -> list[dict]:
        """Poll /slots until no slot is processing; return that answer."""
        def idle() -> list[dict] | None:
            slots = self.slots()
            return None if any(s["is_processing"] for s in slots) else slots
        return self.poll("every slot to be idle", idle, timeout)

    def wait_busy(self, timeout: float = 30.0) -> list[dict]:
        """Poll /slots until some slot is processing; return the busy slots."""
        return self.poll("a slot to be processing",
                         lambda: [s for s in self.slots() if s["is_processing"]], timeout)

    # -- the log -----------------------------------------------------------------------------
    def log_text(self, start: int = 0) -> str:
        """The server's log from character `start` on (`len(log_text())` marks a point)."""
        return self.log_path.read_text(errors="replace")[start:]

    def log_tail(self, n_lines: int = 40) -> str:
        lines = self.log_text().splitlines()[-n_lines:]
        return "\n".join([f"--- server log tail ({self.log_path.name}) ---", *lines])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.log.closed:  # stopped before
            return
        self.log.close()
        # pytest shows captured output only for a failing test: there, the server's last words
        # (on stderr: a script using this harness may print JSON on stdout)
        print(self.log_tail(), file=sys.stderr)
        self.log_path.unlink(missing_ok=True)


def idle_around_test(server: ServerProcess):
    """Body of a function-scoped fixture over a module-scoped server: every slot idle before
    the test (nothing of an earlier test still runs) and after it (a test that leaves work
    behind fails itself, not the next one)."""
    server.wait_idle()
    yield server
    server.wait_idle()
