"""Speculative decoding against plain decoding: generated tokens/s, acceptance, same tokens.

    python scripts/bench_spec.py MODEL.gguf [MODEL2.gguf] -t 2 -n 128 --rounds 3 \\
        [--llama-server /path/to/llama-server] --json out.json

For each model and each prompt of scripts/spec_prompts.json (rewrite, summarise, code edit,
extract: input-grounded; free: nothing to copy), greedy, chat template applied: plain
decoding and `--spec-type ngram-simple` alternate in one process, --rounds times; reported
are median generation tokens/s, the speed-up, the acceptance rate and whether the tokens
were the same. With --llama-server, the same prompt text (rendered by our template) goes to
llama-server's /completion without and with its `--spec-type ngram-simple` (same file and
threads), alternating, for its speed-up and absolute tokens/s next to ours.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PROMPTS = Path(__file__).with_name("spec_prompts.json")


def ours(model, text: str, n: int, spec) -> tuple[list[int], float, int, int]:
    from edgeinfer.generate import Timings, generate_step
    from edgeinfer.sampling import make_sampler
    from edgeinfer.sampling_params import SamplingParams

    ids = model.tokenize(text)
    timings, out = Timings(), []
    for token in generate_step(model, ids, make_sampler(SamplingParams(temperature=0)),
                               timings, spec=spec):
        if model.tokenizer.is_eog(token):
            break
        out.append(token)
        if len(out) == n:
            break
    tps = 1e3 * (timings.predicted_n - 1) / timings.predicted_ms if timings.predicted_ms else 0
    return out, tps, timings.draft_n, timings.draft_n_accepted


def llama_run(server: str, model: str, threads: int, prompts: list[str], n: int,
              spec: bool) -> list[dict]:
    import httpx
    from bench_kv_pool import Server

    command = f"{server} -m {{model}} -t {threads} -np 1 -c 4096"
    if spec:
        command += " --spec-type ngram-simple"
    srv = Server(command, model)
    try:
        out = []
        for prompt in prompts:
            body = {"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": False}
            r = httpx.post(srv.url + "/completion", json=body, timeout=600).json()
            t = r["timings"]
            out.append({"tps": t["predicted_per_second"], "draft_n": t.get("draft_n", 0),
                        "accepted": t.get("draft_n_accepted", 0), "tokens": r.get("tokens")})
        return out
    finally:
        srv.stop()


def main() -> None:
    from edgeinfer.api import Model
    from edgeinfer.spec import SpecParams

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-n", "--n-predict", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--llama-server")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    cases = json.loads(PROMPTS.read_text())
    spec = SpecParams("ngram-simple")
    report = {"threads": args.threads, "n_predict": args.n_predict, "models": {}}
    for path in args.models:
        model = Model.load(path, n_ctx=4096, threads=args.threads)
        texts = [model.apply_chat_template([{"role": "user", "content": c["prompt"]}])
                 for c in cases]
        rows = []
        for case, text in zip(cases, texts):
            plain_tps, spec_tps, drafted, accepted, same = [], [], 0, 0, True
            for _ in range(args.rounds):
                a, tps_a, _, _ = ours(model, text, args.n_predict, None)
                b, tps_b, d, acc = ours(model, text, args.n_predict, spec)
                plain_tps.append(tps_a)
                spec_tps.append(tps_b)
                drafted, accepted, same = drafted + d, accepted + acc, same and a == b
            row = {"kind": case["kind"], "plain_tps": statistics.median(plain_tps),
                   "spec_tps": statistics.median(spec_tps),
                   "acceptance": accepted / drafted if drafted else 0.0,
                   "drafted": drafted // args.rounds, "same_tokens": same}
            row["speedup"] = row["spec_tps"] / row["plain_tps"]
            rows.append(row)
            print(f"{Path(path).name} {json.dumps(row)}", file=sys.stderr)
        entry = {"prompts": rows}
        if args.llama_server:
            plain, with_spec = [], []
            for _ in range(args.rounds):
                plain.append(llama_run(args.llama_server, path, args.threads, texts,
                                       args.n_predict, False))
                with_spec.append(llama_run(args.llama_server, path, args.threads, texts,
                                           args.n_predict, True))
            for i, row in enumerate(rows):
                row["llama_plain_tps"] = statistics.median(r[i]["tps"] for r in plain)
                row["llama_spec_tps"] = statistics.median(r[i]["tps"] for r in with_spec)
                d = sum(r[i]["draft_n"] for r in with_spec)
                row["llama_acceptance"] = (sum(r[i]["accepted"] for r in with_spec) / d
                                           if d else 0.0)
                row["llama_speedup"] = row["llama_spec_tps"] / row["llama_plain_tps"]
        grounded = [r for r in rows if r["kind"] != "free"]
        entry["grounded_speedup"] = statistics.median(r["speedup"] for r in grounded)
        entry["free_speedup"] = statistics.median(r["speedup"] for r in rows
                                                  if r["kind"] == "free")
        report["models"][Path(path).name] = entry
        del model
        time.sleep(0.1)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
