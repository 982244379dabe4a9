"""Longer runs of the seeded GGUF fuzzer (tests/test_gguf_fuzz.py runs 2,000 cases in CI).

    python scripts/fuzz_gguf.py -n 20000 --seed 7 --cli 100 --out fuzz.json

Each case is a small valid model (llama, gemma3 or phi3) mutated by hypothesis
(tests/gguf_fuzz.py), checked in process (loader, checks, tokenizer tables, weight views,
`info` rendering) or, for --cli cases, through `edgeinfer info` and `edgeinfer run`
subprocesses. Failures do not stop the run: each file is kept in --keep (default:
./gguf-fuzz-failures, made on the first failure) and listed in the JSON summary, with the
counts per outcome and the most common refusals. Exit status 1 if any case failed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gguf_fuzz import (  # noqa: E402
    check_cli,
    check_in_process,
    mutate,
    mutate_mild,
    read_layout,
    write_base,
)
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ARCHES = ("llama", "gemma3", "phi3")


def run_cases(bases, folder: Path, keep: Path, n_cases: int, seed_value: int, check,
              mild: bool) -> dict:
    counts: Counter = Counter()
    refusals: Counter = Counter()
    failures: list[dict] = []
    case_path = folder / "case.gguf"

    @seed(seed_value)
    @settings(max_examples=n_cases, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def case(data):
        layout = bases[data.draw(st.sampled_from(ARCHES))]
        gentle = mild and data.draw(st.booleans())
        raw = (mutate_mild if gentle else mutate)(data.draw, layout)
        case_path.write_bytes(raw)
        outcome = check(case_path)
        counts[outcome.status] += 1
        if outcome.status == "refused":
            message = outcome.detail.removeprefix("error: ").replace(str(case_path) + ": ", "")
            refusals[re.sub(r"\d{3,}", "N", message)[:100]] += 1
        elif outcome.status == "failure":
            keep.mkdir(parents=True, exist_ok=True)
            saved = keep / f"seed{seed_value}-failure{len(failures):04d}.gguf"
            saved.write_bytes(raw)
            failures.append({"detail": outcome.detail, "file": str(saved)})

    case()
    return {"cases": sum(counts.values()), **{k: counts[k] for k in ("ok", "refused", "failure")},
            "top_refusals": refusals.most_common(25), "failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--cases", type=int, default=10_000, help="in-process cases")
    parser.add_argument("--cli", type=int, default=0, help="cases through the CLI")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the JSON summary here too")
    parser.add_argument("--keep", type=Path, default=Path("gguf-fuzz-failures"),
                        help="folder for failing files")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        keep = args.keep
        bases = {a: read_layout(write_base(folder / f"{a}.gguf", a)) for a in ARCHES}
        t0 = time.perf_counter()
        summary = {"seed": args.seed}
        summary["in_process"] = run_cases(bases, folder, keep, args.cases, args.seed,
                                          check_in_process, mild=False)
        if args.cli:
            def both(path):
                outcome = check_cli(path, "info", timeout=120)
                if outcome.status == "failure":
                    return outcome
                return check_cli(path, "run", timeout=300)

            summary["cli"] = run_cases(bases, folder, keep, args.cli, args.seed + 1, both,
                                       mild=True)
        summary["seconds"] = round(time.perf_counter() - t0, 1)
        text = json.dumps(summary, indent=2, ensure_ascii=False)
        print(text)
        if args.out:
            args.out.write_text(text + "\n")
        n_failed = sum(summary[k]["failure"] for k in ("in_process", "cli") if k in summary)
    sys.exit(1 if n_failed else 0)


if __name__ == "__main__":
    main()
