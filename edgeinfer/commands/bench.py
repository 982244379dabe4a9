"""`edgeinfer bench`: llama-bench's table (or its JSON rows) for one model."""

from __future__ import annotations

import json
import sys

from edgeinfer.errors import EdgeInferError


def bench_command(model: str | None, n_prompt: int, n_gen: int, threads: int | None,
                  reps: int, n_ctx: int, as_json: bool, depth: int = 0,
                  flash_attn: bool = False, gpu_layers: int | str = 0) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from edgeinfer.api import Model
    from edgeinfer.bench import run_bench
    from edgeinfer.commands.progress import note_printer, status
    from edgeinfer.process import set_threads, settle_heap
    from edgeinfer.pull import resolve_model

    if min(n_prompt, n_gen, depth) < 0:
        raise EdgeInferError("-p, -n and -d must not be negative")
    if reps < 1:
        raise EdgeInferError(f"-r must be at least 1, got {reps}")
    need = depth + max(n_prompt, n_gen)
    if n_ctx and n_ctx < need:
        depth_note = f" after -d {depth}" if depth else ""
        raise EdgeInferError(f"context size {n_ctx} is too small for the tests{depth_note} "
                             f"(needs {need})")
    path = resolve_model(model)
    with status(f"loading {path.name}") as update:
        loaded = Model.load(path, n_ctx=n_ctx or max(512, need), threads=threads,
                            progress=update, flash_attn=flash_attn,
                            compile_helper=True, gpu_layers=gpu_layers,
                            notes=note_printer())
    settle_heap()
    rows = run_bench(loaded, n_prompt, n_gen, reps, set_threads(threads), depth)
    if as_json:
        sys.stdout.write(json.dumps([r.as_json() for r in rows], indent=2) + "\n")
        return
    table = Table("model", "threads", "test", "t/s", "peak RSS")
    for r in rows:
        table.add_row(Text(path.name), str(r.n_threads), r.test,
                      f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}", f"{r.peak_rss_mb:.0f} MB")
    Console().print(table)
