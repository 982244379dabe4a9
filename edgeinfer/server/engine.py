"""The engine thread: it alone owns the model and the KV cache, and runs continuous batching.

HTTP handlers `submit` a `Job` (prompt ids + validated `GenParams` + a thread-safe `sink`)
and read events from the sink; they never touch the model. The engine keeps the thread's
life: it loads the model, takes new jobs and cancellations from the inbox, refuses work
while shutting down, unloads the model after an idle time (--sleep-idle-seconds) and loads
it again when a request comes; each step in between is its `Scheduler`'s (scheduler.py:
admission, KV blocks, one batch, one forward, each sequence's decoder). A cancelled job
frees its slot at the next step.
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from edgeinfer.chat.model_chat import ModelChat, load_chat
from edgeinfer.server.errors import ApiError
from edgeinfer.server.events import ErrorEvent, FinalEvent, Job, ProgressEvent, TokenEvent
from edgeinfer.server.kv_slots import ServerKV
from edgeinfer.server.model_info import ModelInfo, model_info
from edgeinfer.server.options import ServerSettings
from edgeinfer.server.scheduler import Scheduler
from edgeinfer.server.slots import Slot, Stats

__all__ = ["Engine", "ErrorEvent", "FinalEvent", "Job", "ProgressEvent", "TokenEvent"]
log = logging.getLogger("edgeinfer.server")


WAKE = "wake"  # inbox item: load the model again after sleeping


class Engine(threading.Thread):
    """Loads the model, then serves jobs until `stop()`."""

    def __init__(self, model_path: Path, settings: ServerSettings | None = None,
                 on_fail: Callable[[BaseException], None] | None = None):
        super().__init__(name="edgeinfer-engine", daemon=True)
        self.model_path, self.settings = model_path, settings or ServerSettings()
        self.n_slots = max(1, self.settings.n_slots)
        self.on_fail = on_fail
        self.model = None
        self.ready = threading.Event()
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.waiting: deque[Job] = deque()
        self.slots = [Slot(i) for i in range(self.n_slots)]
        self.scheduler: Scheduler | None = None  # the loaded model's batch and KV pool
        self.kv_asleep = {"total": 0, "used": 0, "cached": 0}
        self.stats = Stats()
        self._running = True
        self.draining = False  # shutting down: waiting and new jobs are refused
        self.aborting = False  # the grace period is over: running jobs are ended too
        self.info: ModelInfo | None = None  # kept while the model sleeps
        self.chat: ModelChat | None = None  # the chat templates, likewise
        # sleeping (--sleep-idle-seconds): the model is unloaded until a request needs it
        self.sleeping = False
        self.awake = threading.Event()
        self.wake_error: ApiError | None = None
        self._holders = 0  # requests using the model right now (hold/release)
        self._waking = False
        self._last_active = time.monotonic()
        self._lock = threading.Lock()

    # -- public, called from HTTP threads ------------------------------------------------------
    def submit(self, job: Job) -> None:
        self.inbox.put(job)

    def cancel(self, job: Job) -> None:
        job.cancelled = True
        self.inbox.put(None)  # wake the loop if it is idle

    def drain(self) -> None:
        """Refuse (503) the jobs waiting for a slot and any submitted from now on; running
        jobs go on."""
        self.draining = True
        self.inbox.put(None)

    def abort_running(self) -> None:
        """End the running jobs too, with 503."""
        self.draining = self.aborting = True
        self.inbox.put(None)

    def stop(self) -> None:
        self._running = False
        self.inbox.put(None)

    def hold(self) -> bool:
        """A request starts using the model; True if it must wait for `awake` first (the
        engine is asked to load it again)."""
        with self._lock:
            self._holders += 1
            self._last_active = time.monotonic()
            if self.sleeping and not self._waking:
                self._waking = True
                self.awake.clear()
                self.inbox.put(WAKE)
            return self.sleeping

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            self._last_active = time.monotonic()

    @property
    def n_ctx(self) -> int:
        return self.info.n_ctx

    @property
    def kv(self) -> ServerKV | None:
        """The KV block pool (None while asleep or loading)."""
        return self.scheduler.kv if self.scheduler is not None else None

    @property
    def n_deferred(self) -> int:
        return len(self.waiting)

    def kv_figures(self) -> dict[str, int]:
        """The KV pool's cells: in all, held by sequences, kept only as cache."""
        kv = self.kv
        if kv is None:  # asleep, or not loaded yet
            return self.kv_asleep
        return {"total": kv.n_cells, "used": kv.pool.n_used * kv.block,
                "cached": kv.pool.n_evictable * kv.block}

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._load()
        except BaseException as exc:  # noqa: BLE001 - reported by serve(); the thread ends
            if self.on_fail:
                self.on_fail(exc)
            return
        self.ready.set()
        self.awake.set()
        if self.settings.kv_unified and self.settings.cache_idle_slots \
                and self.settings.cache_ram_mib > 0:
            log.debug("idle slots are saved to the RAM cache and cleared when a task starts "
                      "(__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__)")
        while self._running:
            self._take_inbox(block=not self._busy(), timeout=self._idle_left())
            if self._should_sleep():
                self._sleep()
            if self.sleeping:  # nothing runs until a request wakes the model
                continue
            try:
                self._step()
            except Exception as exc:  # a bug: fail the running jobs, keep serving
                log.exception("engine step failed")
                self.scheduler.fail_all(ApiError(500, f"internal error: {exc}"))

    # -- sleeping ------------------------------------------------------------------------------
    def _idle_left(self) -> float | None:
        """Seconds until an idle engine should sleep; None: wait for work indefinitely."""
        idle = self.settings.sleep_idle_seconds
        if idle <= 0 or self.sleeping:
            return None
        return max(0.05, idle - (time.monotonic() - self._last_active))

    def _should_sleep(self) -> bool:
        idle = self.settings.sleep_idle_seconds
        return (idle > 0 and not self.sleeping and not self._busy() and self._holders == 0
                and time.monotonic() - self._last_active >= idle)

    def _sleep(self) -> None:
        """Unload the model (weights, KV cache, RAM cache); info and counters stay."""
        with self._lock:
            if self._holders or self._busy():
                return
            self.sleeping = True
            self.awake.clear()
        self.kv_asleep = self.kv_figures()  # /metrics answers with these while asleep
        self.model = self.scheduler = None
        for slot in self.slots:
            slot.cache, slot.params, slot.decoder = [], None, None
        gc.collect()
        log.info("sleeping: the model was unloaded after %g s idle",
                 self.settings.sleep_idle_seconds)

    def _wake(self) -> None:
        t0 = time.perf_counter()
        try:
            self._load()
            self.wake_error = None
        except Exception as exc:  # noqa: BLE001 - the waiting requests get the reason
            log.error("loading the model again failed: %s", exc)
            self.wake_error = ApiError(503, f"the model could not be loaded again: {exc}")
        with self._lock:
            self.sleeping = self.wake_error is not None
            self._waking = False
            self._last_active = time.monotonic()
            self.awake.set()
        if not self.sleeping:
            log.info("awake: the model was loaded again in %.2f s", time.perf_counter() - t0)

    def _load(self) -> None:
        from edgeinfer.api import Model
        from edgeinfer.process import distinct_stages, settle_heap

        t0 = time.perf_counter()
        opts = self.settings
        self.model = Model.load(self.model_path, n_ctx=opts.n_ctx_slot or opts.n_ctx,
                                threads=opts.threads, n_slots=self.n_slots,
                                n_batch=opts.n_batch, progress=distinct_stages(log.info),
                                flash_attn=opts.flash_attn, compile_helper=True,
                                gpu_layers=opts.gpu_layers, notes=_log_note,
                                kv_cells=max(0, opts.n_ctx))
        if self.chat is None:  # the templates outlive a sleeping model
            c = self.settings.chat
            self.chat = load_chat(self.model, c.template, jinja=c.jinja, reasoning=c.reasoning,
                                  reasoning_format=c.reasoning_format)
        settle_heap()
        self.info = self.info or model_info(self.model, self.model_path)
        tf = self.model.transformer
        self.scheduler = Scheduler(self.model, opts, self.slots, self.stats, self.waiting)
        kv = self.kv
        log.info("model loaded in %.2f s: %d slots sharing a KV pool of %d cells (%d blocks "
                 "of %d), up to %d a request, flash attention %s", time.perf_counter() - t0,
                 self.n_slots, kv.n_cells, kv.pool.n_blocks, kv.block, tf.n_ctx,
                 "on" if tf.flash_attn else "off")

    def _busy(self) -> bool:
        return bool(self.waiting) or any(s.job is not None for s in self.slots)

    def _step(self) -> None:
        scheduler = self.scheduler
        scheduler.drop_cancelled()
        if self.draining:
            scheduler.refuse_for_shutdown(running_too=self.aborting)
        scheduler.step()

    def _take_inbox(self, block: bool, timeout: float | None = None) -> None:
        try:
            item = self.inbox.get(block=block, timeout=timeout if block else None)
            while True:
                if item == WAKE:
                    self._wake()
                elif item is not None:
                    self.waiting.append(item)
                item = self.inbox.get_nowait()
        except queue.Empty:
            pass

def _log_note(line: str) -> None:
    """A load's lines (where the layers went; a warning when they cannot go) in the log."""
    (log.warning if line.startswith("warning:") else log.info)(line)
