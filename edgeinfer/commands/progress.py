"""Terminal progress for the commands: everything goes to stderr, so stdout stays clean.

Messages are plain text (rich `Text`), never markup: they hold file names."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.text import Text

stderr = Console(stderr=True, highlight=False)


@contextmanager
def byte_progress(quiet: bool = False) -> Iterator[Callable[[str, int, int], None]]:
    """A callback (stage, done, total) drawing one bar per stage (download, verify); the bars
    appear only once something is reported, so a model already in place prints nothing."""
    if quiet:
        yield lambda stage, done, total: None
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                   TransferSpeedColumn(), TimeRemainingColumn(), console=stderr,
                   transient=True)
    tasks: dict[str, int] = {}

    def report(stage: str, done: int, total: int) -> None:
        if not tasks:
            bar.start()
        if stage not in tasks:
            tasks[stage] = bar.add_task(stage, total=total or None)
        bar.update(tasks[stage], completed=done, total=total or None)

    try:
        yield report
    finally:
        if tasks:
            bar.stop()


@contextmanager
def status(message: str, quiet: bool = False) -> Iterator[Callable[[str], None]]:
    """A spinner on a terminal, plain lines otherwise; yields a function to update it."""
    if quiet:
        yield lambda text: None
        return
    if not stderr.is_terminal:
        from edgeinfer.process import distinct_stages

        def line(text: str) -> None:
            sys.stderr.write(f"{text}\n")
            sys.stderr.flush()

        yield distinct_stages(line)
        return
    from edgeinfer.process import COMPILED

    with stderr.status(Text(message)) as spinner:
        def update(text: str) -> None:
            if text.startswith(COMPILED + " "):  # a result worth keeping, not a state
                stderr.print(Text(text))
            spinner.update(Text(text))

        yield update


def note_printer(quiet: bool = False) -> Callable[[str], None]:
    """Lines a load wants kept (where the layers went), on stderr; warnings even if quiet."""
    def note(line: str) -> None:
        if not quiet or line.startswith("warning:"):
            stderr.print(Text(line))

    return note
