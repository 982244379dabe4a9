"""Test harness (no tests here): start `python -m edgeinfer.server` as a subprocess on a free
port and wait until it is ready."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, model: Path, *args: str, timeout: float = 600.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        fd, log_path = tempfile.mkstemp(prefix=f"edgeinfer-server-{self.port}-", suffix=".log")
        self.log_path = Path(log_path)
        self.log = os.fdopen(fd, "w")  # closed and removed in stop()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edgeinfer.server", str(model), "--port", str(self.port),
             *args], stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited:\n{self._read_and_stop()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready after {timeout} s:\n{self._read_and_stop()}")

    def _read_and_stop(self) -> str:
        self.log.flush()
        log = self.log_path.read_text(errors="replace")
        self.stop()
        return log

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.log.closed:  # stopped before
            return
        self.log.close()
        # pytest shows captured output only for a failing test: there, the server's last words
        # (on stderr: a script using this harness may print JSON on stdout)
        tail = self.log_path.read_text(errors="replace").splitlines()[-40:]
        print(f"--- server log tail ({self.log_path.name}) ---", *tail, sep="\n",
              file=sys.stderr)
        self.log_path.unlink(missing_ok=True)

    def wait_idle(self, timeout: float = 30.0) -> list[dict]:
        """Poll /slots until no slot is processing; return the last answer."""
        deadline = time.monotonic() + timeout
        while True:
            slots = httpx.get(self.url + "/slots", timeout=10).json()
            if not any(s["is_processing"] for s in slots) or time.monotonic() > deadline:
                return slots
            time.sleep(0.05)
