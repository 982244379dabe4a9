"""Compliance on the JSONSchemaBench corpus (issue 34): each schema of ../shared/structured
given to a model in the prompt and enforced while it answers, greedily; every finished
output (the grammar ended it, not max_tokens) must parse and validate with `jsonschema`
(Draft 2020-12 unless the schema names its draft). JSON out.

    python scripts/structured_compliance.py MODEL.gguf [MODEL.gguf ...] --max-tokens 256 \
        -np 8 --json out.json

Schemas llguidance enforces only in part (see tests/data/structured_limits.json) are run
and counted apart: an output may break the keywords that were ignored.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import jsonschema

sys.path.insert(0, str(Path(__file__).parent))
from bench_structured import CORPUS, start_engine  # noqa: E402

from edgeinfer.errors import EdgeInferError  # noqa: E402
from edgeinfer.sampling import SamplingParams  # noqa: E402
from edgeinfer.server.engine import ErrorEvent, FinalEvent, Job, TokenEvent  # noqa: E402
from edgeinfer.server.params import GenParams  # noqa: E402
from edgeinfer.structured import Constraint, compile_constraint  # noqa: E402


def prompt_for(model, schema: dict) -> list[int]:
    text = ("Answer with a JSON value that matches this JSON schema, and nothing else.\n"
            + json.dumps(schema, ensure_ascii=False))
    ids = model.tokenize(model.apply_chat_template([{"role": "user", "content": text}]))
    return ids


def validator(schema: dict):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def run_corpus(engine, max_tokens: int, n_ctx: int) -> dict:
    model = engine.model
    outcomes, lock, pending = {}, threading.Lock(), threading.Semaphore(engine.n_slots)
    done = threading.Event()
    files = sorted(CORPUS.glob("*.json"))
    remaining = [len(files)]

    def finish(name: str, record: dict) -> None:
        with lock:
            outcomes[name] = record
            remaining[0] -= 1
            if remaining[0] == 0:
                done.set()
        pending.release()

    for path in files:
        schema = json.loads(path.read_text(encoding="utf-8"))["schema"]
        try:
            compiled = compile_constraint(model.tokenizer, Constraint.json_schema(schema),
                                          approximate=True)
        except EdgeInferError as exc:
            pending.acquire()
            finish(path.stem, {"outcome": "not compiled", "reason": str(exc)[:200]})
            continue
        ids = prompt_for(model, schema)
        if len(ids) + max_tokens > n_ctx:
            pending.acquire()
            finish(path.stem, {"outcome": "prompt too long", "exact": compiled.exact})
            continue
        pending.acquire()
        engine.submit(Job(ids, GenParams(sampling=SamplingParams(temperature=0),
                                         n_predict=max_tokens, cache_prompt=False),
                          _sink(path.stem, schema, compiled.exact, finish), compiled))
    done.wait()
    return outcomes


def _sink(name: str, schema: dict, exact: bool, finish):
    text = []

    def sink(event) -> None:
        if isinstance(event, TokenEvent):
            text.append(event.text)
        elif isinstance(event, ErrorEvent):
            finish(name, {"outcome": "error", "reason": event.error.message, "exact": exact})
        elif isinstance(event, FinalEvent):
            text.append(event.text)
            finish(name, judge("".join(text), event.stop_type, schema, exact))
    return sink


def judge(output: str, stop_type: str, schema: dict, exact: bool) -> dict:
    record = {"exact": exact, "tokens_stop": stop_type, "output": output[:300]}
    if stop_type != "eos":
        return {**record, "outcome": "unfinished"}
    try:
        value = json.loads(output)
    except ValueError as exc:
        return {**record, "outcome": "invalid", "reason": f"not JSON: {exc}"}
    errors = sorted(validator(schema).iter_errors(value), key=str)
    if errors:
        return {**record, "outcome": "invalid", "reason": errors[0].message[:200]}
    return {**record, "outcome": "valid"}


def summary(outcomes: dict) -> dict:
    counts: dict = {}
    for record in outcomes.values():
        key = ("exact" if record.get("exact") else "approximate") + ":" + record["outcome"]
        counts[key] = counts.get(key, 0) + 1
    finished_exact = [r for r in outcomes.values() if r.get("exact")
                      and r["outcome"] in ("valid", "invalid")]
    valid_exact = sum(r["outcome"] == "valid" for r in finished_exact)
    return {"counts": dict(sorted(counts.items())),
            "compliance_exact": valid_exact / len(finished_exact) if finished_exact else None,
            "invalid": {k: r for k, r in outcomes.items() if r["outcome"] == "invalid"}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("models", type=Path, nargs="+")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-np", "--parallel", type=int, default=8)
    p.add_argument("-c", "--ctx-size", type=int, default=4096)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    results = []
    for path in args.models:
        engine = start_engine(path, args.parallel, args.threads, n_ctx=args.ctx_size)
        try:
            t0 = time.perf_counter()
            outcomes = run_corpus(engine, args.max_tokens, args.ctx_size)
            results.append({"model": path.name, "seconds": time.perf_counter() - t0,
                            **summary(outcomes), "schemas": outcomes})
        finally:
            engine.stop()
    report = {"max_tokens": args.max_tokens, "results": results}
    for r in results:
        print(r["model"], r["counts"], "compliance (exact):", r["compliance_exact"])
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
