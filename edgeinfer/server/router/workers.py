"""The router's models and their worker processes.

Each model runs in its own `python -m edgeinfer.server PATH` process on 127.0.0.1 and a port
it picks (two Numba engines in one process would share its thread pool unsafely). A worker
starts when a request names its model, and stops when `--models-max` needs its place (the
least recently used idle one goes), after `--keep-alive` seconds idle, or on
/models/unload. One that dies is started again by the next request for it, after a back-off
that doubles with each crash in a row.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("edgeinfer.server")
LISTENING = re.compile(r"listening on (http://[^\s,]+)")
START_TIMEOUT = 600.0
BACKOFF = (1.0, 60.0)  # first and longest wait before a crashed worker is started again


def find_models(models_dir: Path | None, extra_dirs: tuple[Path, ...] = ()) -> dict[str, Path]:
    """Every GGUF file of the directories, by id: the file name without .gguf (the first of
    two files with one name wins)."""
    found: dict[str, Path] = {}
    for folder in ((models_dir,) if models_dir else ()) + extra_dirs:
        if folder.is_dir():
            for path in sorted(folder.glob("*.gguf")):
                found.setdefault(path.stem, path)
    return found


@dataclass
class Worker:
    name: str
    path: Path
    status: str = "unloaded"  # unloaded | loading | loaded
    url: str = ""
    proc: subprocess.Popen | None = None
    last_used: float = 0.0
    in_flight: int = 0
    crashes: int = 0  # in a row
    not_before: float = 0.0  # no restart before this (monotonic)
    failure: str = ""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Pool:
    def __init__(self, models: dict[str, Path], worker_args: list[str], models_max: int,
                 keep_alive: float):
        self.workers = {name: Worker(name, path) for name, path in models.items()}
        self.worker_args, self.models_max, self.keep_alive = worker_args, models_max, keep_alive

    async def ready(self, name: str) -> Worker:
        """The worker of `name`, started (and another one stopped) if needed."""
        w = self.workers[name]
        async with w.lock:
            if w.status == "loaded" and not w.alive():
                self._crashed(w)
            if w.status != "loaded":
                wait = w.not_before - time.monotonic()
                if wait > 0:
                    raise RuntimeError(f"model '{name}' crashed; restarting in {wait:.0f} s")
                await self._make_room(w)
                await self._start(w)
            w.last_used = time.monotonic()
            return w

    def _crashed(self, w: Worker) -> None:
        code = w.proc.poll() if w.proc else None
        log.warning("worker of %s exited (code %s)", w.name, code)
        w.crashes += 1
        w.not_before = time.monotonic() + min(BACKOFF[1], BACKOFF[0] * 2 ** (w.crashes - 1))
        w.status, w.url, w.proc = "unloaded", "", None

    async def _make_room(self, w: Worker) -> None:
        loaded = [o for o in self.workers.values() if o is not w and o.status != "unloaded"]
        while len(loaded) >= self.models_max:
            idle = [o for o in loaded if o.in_flight == 0]
            if not idle:
                raise RuntimeError(f"all {self.models_max} model slots are busy")
            oldest = min(idle, key=lambda o: o.last_used)
            await self.stop(oldest)
            loaded.remove(oldest)

    async def _start(self, w: Worker) -> None:
        w.status, w.failure = "loading", ""
        log.info("starting a worker for %s", w.name)
        argv = [sys.executable, "-m", "edgeinfer.server", str(w.path), *self.worker_args,
                "--host", "127.0.0.1", "--port", "0"]
        w.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                  preexec_fn=_die_with_parent)
        try:
            w.url = await asyncio.wait_for(asyncio.to_thread(self._await_ready, w),
                                           START_TIMEOUT)
        except (asyncio.TimeoutError, RuntimeError) as exc:
            self._kill(w)
            w.status, w.failure = "unloaded", str(exc) or "timed out"
            w.crashes += 1
            w.not_before = time.monotonic() + BACKOFF[0]
            raise RuntimeError(f"model '{w.name}' failed to load: {w.failure}") from None
        w.status, w.crashes = "loaded", 0

    def _await_ready(self, w: Worker) -> str:
        """Read the worker's log until it listens and its model is loaded; its lines go on
        to the router's stderr, prefixed with the model's name."""
        url, tail = "", []
        for line in w.proc.stderr:
            sys.stderr.write(f"[{w.name}] {line}")
            tail = (tail + [line.strip()])[-3:]
            if not url and (m := LISTENING.search(line)):
                url = m.group(1)
            if url and "model loaded" in line:
                break
        else:
            raise RuntimeError(tail[-1] if tail else "the worker exited")
        _wait_healthy(url, w)
        threading.Thread(target=self._relay, args=(w,), daemon=True).start()
        return url

    @staticmethod
    def _relay(w: Worker) -> None:
        for line in w.proc.stderr:
            sys.stderr.write(f"[{w.name}] {line}")

    async def stop(self, w: Worker) -> None:
        log.info("stopping the worker of %s", w.name)
        self._kill(w)
        w.status, w.url, w.proc, w.crashes = "unloaded", "", None, 0

    @staticmethod
    def _kill(w: Worker) -> None:
        if w.proc is not None and w.proc.poll() is None:
            w.proc.terminate()
            try:
                w.proc.wait(10)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()

    async def close(self) -> None:
        for w in self.workers.values():
            self._kill(w)


def _wait_healthy(url: str, w: Worker, timeout: float = 60.0) -> None:
    """Until the worker's /health answers 200 (it says 503 until its engine is ready)."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not w.alive():
            raise RuntimeError("the worker exited")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    raise RuntimeError("the worker never became healthy")


def _die_with_parent() -> None:
    """In the worker, before exec: SIGTERM when the router (or Ray replica) dies, however
    it dies (Linux; elsewhere the router's own shutdown stops its workers)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
