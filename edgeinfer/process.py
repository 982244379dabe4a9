"""Process-wide utilities the CLI and the server share around a model load: compile
progress from Numba's events, the collector paused while loading and frozen after, and the
worker thread count."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from edgeinfer.errors import EdgeInferError

COMPILING = "compiling kernels (first run only; cached afterwards)"
COMPILED = "compiled"  # the summary: "compiled 154 kernels in 39.7 s (cached for next runs)"


@contextmanager
def reporting_compiles(progress: Callable[[str], None],
                       on_first: Callable[[], None] | None = None) -> Iterator[None]:
    """Name each kernel as Numba compiles it, then say how long compiling took. Numba raises
    its "numba:compile" event (numba.core.event) only on a cache miss, so a warm start says
    nothing. Messages read COMPILING + ": module.kernel". `on_first` runs at the first
    compile. The listener is process-wide: concurrent loads would see each other's."""
    from numba.core import event

    class CompileReporter(event.Listener):
        count, t_start = 0, 0.0

        def on_start(self, ev) -> None:
            if not self.count:
                self.t_start = time.perf_counter()
                if on_first is not None:
                    on_first()
            self.count += 1
            fn = ev.data["dispatcher"].py_func
            progress(f"{COMPILING}: {fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}")

        def on_end(self, ev) -> None:
            pass

    with event.install_listener("numba:compile", CompileReporter()) as listener:
        yield
    if listener.count:
        n = listener.count
        progress(f"{COMPILED} {n} kernel{'s' if n != 1 else ''} in "
                 f"{time.perf_counter() - listener.t_start:.1f} s (cached for next runs)")


def distinct_stages(write: Callable[[str], None]) -> Callable[[str], None]:
    """For logs and pipes: pass a message on only when its stage (the text before ': ')
    changed, so the compile messages make one line, not one per kernel."""
    last = [None]

    def report(message: str) -> None:
        stage = message.split(": ", 1)[0]
        if stage != last[0]:
            last[0] = stage
            write(message)

    return report


class GcPause:
    """Pauses the collector while a model loads: a warm load creates about a million
    long-lived objects (mostly Numba's typing registries) that full passes would walk again
    and again. A first run resumes it at the first compile, which makes garbage in bulk
    (docs/performance.md, "Collector paused while loading")."""

    def __enter__(self) -> GcPause:
        self.was_enabled = gc.isenabled()
        gc.disable()
        return self

    def resume(self) -> None:
        if self.was_enabled:
            gc.enable()

    def __exit__(self, *exc) -> None:
        self.resume()


def settle_heap() -> None:
    """For a process that keeps its model until it exits (the CLI, the server): take what
    exists now out of the collector's reach, so its full passes stop re-walking Numba's
    object graph while generating, and interpreter exit stops walking it too. The
    young garbage of the load is collected first, so it is not frozen with the rest."""
    gc.collect(0)
    gc.freeze()


def set_threads(threads: int | None) -> int:
    """Numba's worker count: llama.cpp's default is the number of physical cores."""
    import numba
    import psutil

    available = numba.config.NUMBA_NUM_THREADS
    if threads is None:
        threads = psutil.cpu_count(logical=False) or available
    if threads < 1:
        raise EdgeInferError(f"threads must be >= 1, got {threads}")
    numba.set_num_threads(min(threads, available))
    return min(threads, available)
