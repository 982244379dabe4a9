"""One benchmark in two checkouts of edgeinfer, alternating: a refactor's before and after.

    python scripts/bench_ab.py BEFORE_DIR AFTER_DIR [-r 3] [--json out.json] -- \
        scripts/bench_batch.py MODEL --json {out}

Each round runs the command once in each checkout (its cwd and PYTHONPATH), one after the
other, so both see the same machine load; `{out}` is replaced by a JSON file the benchmark
writes. Every numeric leaf of that JSON is reported as the median over the rounds for each
side and the ratio after / before, next to the median of the rounds' own ratios (paired).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def leaves(doc: object, path: str = "") -> dict[str, float]:
    """Numeric leaves of a JSON document by their dotted path (lists by index)."""
    if isinstance(doc, bool):
        return {}
    if isinstance(doc, int | float):
        return {path: float(doc)}
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) \
        else ()
    out: dict[str, float] = {}
    for key, value in items:
        out.update(leaves(value, f"{path}.{key}" if path else str(key)))
    return out


def run_once(tree: Path, command: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        argv = [sys.executable] + [a.replace("{out}", str(out)) for a in command]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run(argv, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
        return leaves(json.loads(out.read_text()))


def compare(before: list[dict[str, float]], after: list[dict[str, float]]) -> dict[str, dict]:
    """Per leaf: each side's median, their ratio, and the median of the paired ratios."""
    rows = {}
    for key in before[0]:
        a = [r[key] for r in before if key in r]
        b = [r[key] for r in after if key in r]
        if len(a) != len(before) or len(b) != len(after):
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        paired = [y / x for x, y in zip(a, b, strict=True) if x]
        rows[key] = {"before": ma, "after": mb, "ratio": mb / ma if ma else None,
                     "paired_ratio": statistics.median(paired) if paired else None}
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("-r", "--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, help="also write the comparison here")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, command = p.parse_args(argv[:cut]), argv[cut + 1:]
    if not command or not any("{out}" in a for a in command):
        p.error("give the benchmark after --, with {out} where its JSON goes")
    before, after = [], []
    for r in range(args.rounds):
        before.append(run_once(args.before.resolve(), command))
        after.append(run_once(args.after.resolve(), command))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    rows = compare(before, after)
    for key, row in rows.items():
        ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "-"
        print(f"{key:60s} {row['before']:12.3f} {row['after']:12.3f} {ratio:>7s}")
    report = {"command": command, "rounds": args.rounds, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
