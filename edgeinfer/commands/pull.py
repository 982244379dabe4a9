"""`edgeinfer pull NAME`: fetch a known model into the cache, with a progress bar."""

from __future__ import annotations

import sys


def pull_command(name: str) -> None:
    from edgeinfer.commands.progress import byte_progress
    from edgeinfer.pull import pull

    with byte_progress() as report:
        path = pull(name, report)
    sys.stdout.write(f"{path}\n")
