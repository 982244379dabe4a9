"""Compare two runs of scripts/llama_server_suite.sh: a Markdown table per file, then the
tests that pass on the first server and not on the second, grouped by the flags the second
ignored (beyond those of almost every test) and by their failure line.

Usage: python scripts/llama_server_suite/compare.py [LLAMA_SERVER.json] EDGEINFER.json
LLAMA_SERVER.json defaults to baseline-llama-server.json beside this file: llama-server
0c1e570 (the sdist's) with SmolLM2-135M-Instruct Q4_1, `-m "not slow"`.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

BASELINE = Path(__file__).with_name("baseline-llama-server.json")


def table(base: dict, other: dict) -> list[str]:
    rows = ["| file | tests run | llama-server passed | edgeinfer passed |", "|---|---|---|---|"]
    totals = Counter()
    for name in sorted(set(base["files"]) | set(other["files"])):
        b, o = base["files"].get(name, {}), other["files"].get(name, {})
        run = sum(b.get(k, 0) for k in ("passed", "failed", "error"))
        counts = Counter(run=run, base=b.get("passed", 0), other=o.get("passed", 0))
        totals += counts
        rows.append(f"| {name.removeprefix('unit/')} | {run} | {counts['base']} | "
                    f"{counts['other']} |")
    rows.append(f"| total | {totals['run']} | {totals['base']} | {totals['other']} |")
    return rows


def regressions(base: dict, other: dict) -> list[str]:
    tests = other["tests"]
    usual = Counter(f for t in tests.values() for f in t.get("ignored_flags", []))
    common = {f for f, n in usual.items() if n > len(tests) / 4}
    groups: dict[str, list[str]] = defaultdict(list)
    for nodeid, entry in base["tests"].items():
        mine = tests.get(nodeid, {"outcome": "missing", "reason": ""})
        if entry["outcome"] != "passed" or mine["outcome"] == "passed":
            continue
        flags = sorted(set(mine.get("ignored_flags", [])) - common)
        key = ("ignored " + " ".join(flags)) if flags else mine["reason"][:110]
        groups[key].append(nodeid)
    lines = [f"common ignored flags: {' '.join(sorted(common))}", ""]
    for key, nodeids in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"{len(nodeids):4}  {key}")
        lines += [f"        {n}" for n in nodeids[:4]] + (["        ..."] * (len(nodeids) > 4))
    return lines


def main(argv: list[str]) -> None:
    paths = argv[:2] if len(argv) >= 2 else [BASELINE, *argv[:1]]
    base, other = (json.loads(Path(path).read_text(encoding="utf-8")) for path in paths)
    print("\n".join(table(base, other)))
    print()
    print("\n".join(regressions(base, other)))


if __name__ == "__main__":
    main(sys.argv[1:])
