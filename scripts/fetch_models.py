"""Fetch the known models (for CI and integration tests) into edgeinfer's models directory.

Usage: python scripts/fetch_models.py [NAME ...]   (default: every known model)

Idempotent: a model already in place and verified is not downloaded again. Progress goes to
stderr; each model's path is printed to stdout as `NAME<TAB>PATH`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

# Run from a checkout without installing the package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgeinfer.errors import EdgeInferError
from edgeinfer.pull import KNOWN_MODELS, pull


class ProgressLines:
    """A `pull` progress callback printing a line per stage start, every ~10%, and at the end."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.stage = ""
        self.next_percent = 0
        self.started = time.monotonic()

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage != self.stage:
            self.stage, self.next_percent = stage, 0
            print(f"[{self.name}] {stage}", file=sys.stderr, flush=True)
        if total <= 0:
            return
        percent = 100 * done // total
        if percent >= self.next_percent:
            elapsed = time.monotonic() - self.started
            mib = done / (1 << 20)
            print(
                f"[{self.name}]   {percent:3d}%  {mib:7.1f} MiB  {elapsed:6.1f}s",
                file=sys.stderr,
                flush=True,
            )
            self.next_percent = percent - percent % 10 + 10


def main(argv: list[str]) -> int:
    names = argv or list(KNOWN_MODELS)
    for name in names:
        try:
            path = pull(name, progress=ProgressLines(name))
        except EdgeInferError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"[{name}] ready: {path}", file=sys.stderr)
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
