"""Longer runs of the schema-driven HTTP fuzz (tests/test_server_fuzz.py runs 50 cases per
operation and mode in CI).

    python scripts/fuzz_http.py -n 1000 --seed 7 --out http-fuzz.json

Starts `edgeinfer serve` on a tiny model (or --model), then, for every operation in its
/openapi.json, sends -n valid and -n invalid requests drawn by schemathesis
(tests/http_fuzz.py). A failed operation does not stop the run: its shrunk failure is listed
in the JSON summary, with the statuses counted per operation and mode, whether the server's
log holds a traceback, and the commonest refusals of valid requests (where the description
is looser than the server: a prompt over the context, say). Exit status 1 if anything failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from http_fuzz import MODES, fuzz_operation, has_input, operations  # noqa: E402
from test_server_harness import ServerProcess  # noqa: E402
from tiny_models import write_tiny_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--cases", type=int, default=1000, help="per operation and mode")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", type=Path, help="a GGUF to serve (default: a tiny one)")
    ap.add_argument("--server-args", default="-np 2 -c 256 --metrics")
    ap.add_argument("--out", type=Path, help="write the JSON summary here too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model = args.model or write_tiny_model(Path(folder) / "tiny.gguf")
        server = ServerProcess(model, *args.server_args.split())
        try:
            summary = run(server, args.cases, args.seed)
        finally:
            server.stop()
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 1 if summary["failures"] or summary["traceback_in_log"] else 0


def run(server: ServerProcess, n_cases: int, seed_value: int) -> dict:
    start, statuses, failures, refusals = time.monotonic(), {}, [], Counter()
    for mode, generation in MODES.items():
        for operation in operations(server.url):
            if mode == "invalid" and not has_input(operation):
                continue
            key = f"{mode} {operation.label}"
            try:
                counts = fuzz_operation(server.url, operation, generation, n_cases, seed_value,
                                        refusals if mode == "valid" else None)
            except Exception as exc:  # noqa: BLE001 - listed, and the run goes on
                failures.append({"operation": key, "error": str(exc)[:2000]})
                counts = Counter()
            statuses[key] = dict(sorted(counts.items()))
            print(f"{key}: {sum(counts.values())} requests {dict(counts)}", file=sys.stderr)
    return {"seed": seed_value, "cases_per_operation": n_cases,
            "requests": sum(sum(c.values()) for c in statuses.values()),
            "seconds": round(time.monotonic() - start, 1), "statuses": statuses,
            "failures": failures, "traceback_in_log": "Traceback" in server.log_text(),
            "valid_requests_refused": dict(refusals.most_common(20))}


if __name__ == "__main__":
    sys.exit(main())
