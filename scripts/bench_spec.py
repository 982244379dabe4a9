"""Speculative decoding against plain decoding: generated tokens/s, acceptance, same tokens.

    python scripts/bench_spec.py MODEL.gguf [MODEL2.gguf] -t 2 -n 128 --rounds 3 \\
        [--draft DRAFT.gguf] [--batch] [--llama-server /path/to/llama-server] --json out.json

For each model and each prompt of scripts/spec_prompts.json (rewrite, summarise, code edit,
extract: input-grounded; free: nothing to copy), greedy, chat template applied: plain
decoding and `--spec-type ngram-simple` alternate in one process, --rounds times; reported
are median generation tokens/s, the speed-up, the acceptance rate and whether the tokens
were the same. With --llama-server, the same prompt text (rendered by our template) goes to
llama-server's /completion without and with its `--spec-type ngram-simple` (same file and
threads), alternating, for its speed-up and absolute tokens/s next to ours. --draft adds
draft-simple with that draft model; --batch our server with all eight prompts at once.
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
    from edgeinfer.generate import generate_step, start_decoder
    from edgeinfer.sampling import make_sampler
    from edgeinfer.sampling_params import SamplingParams

    ids = model.tokenize(text)
    decoder = start_decoder(model, ids, make_sampler(SamplingParams(temperature=0)), n,
                            spec=spec)
    out = [piece.token for piece in generate_step(model, decoder)]
    timings = decoder.timings
    tps = 1e3 * (timings.predicted_n - 1) / timings.predicted_ms if timings.predicted_ms else 0
    return out, tps, timings.draft_n, timings.draft_n_accepted


def llama_run(server: str, model: str, threads: int, prompts: list[str], n: int,
              spec: str) -> list[dict]:
    import httpx
    from bench_kv_pool import Server

    command = f"{server} -m {{model}} -t {threads} -np 1 -c 4096"
    if spec:
        command += " " + spec
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


def batch_run(model: str, threads: int, prompts: list[str], n: int, spec: str,
              rounds: int) -> dict:
    """Our server with -np len(prompts), every prompt at once, without and with `spec`
    flags alternating: generated tokens/s over all requests, and the same texts."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    from bench_kv_pool import Server

    base = (f"{sys.executable} -P -m edgeinfer.server {{model}} -t {threads} "
            f"-np {len(prompts)} -c {len(prompts) * 1024}")
    servers = [Server(base, model), Server(f"{base} {spec}", model)]
    rates, texts = [[], []], [None, None]

    def one(url: str, prompt: str) -> tuple[str, int]:
        body = {"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": False}
        r = httpx.post(url + "/completion", json=body, timeout=600).json()
        return r["content"], r["tokens_predicted"]

    try:
        for _ in range(rounds):
            for i, srv in enumerate(servers):
                t0 = time.perf_counter()
                with ThreadPoolExecutor(len(prompts)) as pool:
                    out = list(pool.map(lambda p, u=srv.url: one(u, p), prompts))
                rates[i].append(sum(k for _, k in out) / (time.perf_counter() - t0))
                texts[i] = [t for t, _ in out]
    finally:
        for srv in servers:
            srv.stop()
    plain, with_spec = (statistics.median(r) for r in rates)
    return {"clients": len(prompts), "plain_tps": plain, "spec_tps": with_spec,
            "speedup": with_spec / plain, "same_text": texts[0] == texts[1]}


def main() -> None:
    from edgeinfer.api import Model
    from edgeinfer.spec import SpecParams

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-n", "--n-predict", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ngram-n", type=int, default=SpecParams.ngram_size_n,
                   help="--spec-ngram-simple-size-n (ours and llama-server's)")
    p.add_argument("--ngram-m", type=int, default=SpecParams.ngram_size_m)
    p.add_argument("--n-max", type=int, default=SpecParams.n_max, help="--spec-draft-n-max")
    p.add_argument("--draft", help="also draft-simple with this draft model (-md), for the "
                                   "models whose vocabulary it matches")
    p.add_argument("--batch", action="store_true",
                   help="also our server with every prompt at once (-np 8), without and "
                        "with speculation")
    p.add_argument("--llama-server")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    cases = json.loads(PROMPTS.read_text())
    spec = SpecParams("ngram-simple", n_max=args.n_max, ngram_size_n=args.ngram_n,
                      ngram_size_m=args.ngram_m)
    report = {"threads": args.threads, "n_predict": args.n_predict, "ngram_n": args.ngram_n,
              "ngram_m": args.ngram_m, "n_max": args.n_max, "models": {}}
    for path in args.models:
        model = Model.load(path, n_ctx=4096, threads=args.threads)
        texts = [model.apply_chat_template([{"role": "user", "content": c["prompt"]}])
                 for c in cases]
        rows, with_draft = [], None
        if args.draft:
            from edgeinfer.spec.draft_model import vocab_mismatch

            draft_model = Model.load(args.draft, n_ctx=64, warm_up=False)
            if vocab_mismatch(model.tokenizer, draft_model.tokenizer) is None:
                with_draft = SpecParams("draft-simple", n_max=args.n_max,
                                        draft_model=args.draft)
            del draft_model
        for case, text in zip(cases, texts):
            plain_tps, spec_tps, draft_tps, drafted, accepted, same = [], [], [], 0, 0, True
            draft_acc = [0, 0]
            for _ in range(args.rounds):
                a, tps_a, _, _ = ours(model, text, args.n_predict, None)
                b, tps_b, d, acc = ours(model, text, args.n_predict, spec)
                plain_tps.append(tps_a)
                spec_tps.append(tps_b)
                drafted, accepted, same = drafted + d, accepted + acc, same and a == b
                if with_draft is not None:
                    c, tps_c, d, acc = ours(model, text, args.n_predict, with_draft)
                    draft_tps.append(tps_c)
                    draft_acc = [draft_acc[0] + d, draft_acc[1] + acc]
                    same = same and c == a
            row = {"kind": case["kind"], "plain_tps": statistics.median(plain_tps),
                   "spec_tps": statistics.median(spec_tps),
                   "acceptance": accepted / drafted if drafted else 0.0,
                   "drafted": drafted // args.rounds, "same_tokens": same}
            row["speedup"] = row["spec_tps"] / row["plain_tps"]
            if draft_tps:
                row["draft_model_speedup"] = statistics.median(draft_tps) / row["plain_tps"]
                row["draft_model_acceptance"] = draft_acc[1] / max(1, draft_acc[0])
            rows.append(row)
            print(f"{Path(path).name} {json.dumps(row)}", file=sys.stderr)
        entry = {"prompts": rows}
        if args.llama_server:
            flags = (f"--spec-type ngram-simple --spec-draft-n-max {args.n_max} "
                     f"--spec-ngram-simple-size-n {args.ngram_n} "
                     f"--spec-ngram-simple-size-m {args.ngram_m}")
            plain, with_spec = [], []
            for _ in range(args.rounds):
                plain.append(llama_run(args.llama_server, path, args.threads, texts,
                                       args.n_predict, ""))
                with_spec.append(llama_run(args.llama_server, path, args.threads, texts,
                                           args.n_predict, flags))
            for i, row in enumerate(rows):
                row["llama_plain_tps"] = statistics.median(r[i]["tps"] for r in plain)
                row["llama_spec_tps"] = statistics.median(r[i]["tps"] for r in with_spec)
                d = sum(r[i]["draft_n"] for r in with_spec)
                row["llama_acceptance"] = (sum(r[i]["accepted"] for r in with_spec) / d
                                           if d else 0.0)
                row["llama_speedup"] = row["llama_spec_tps"] / row["llama_plain_tps"]
        if args.batch:
            entry["batch"] = batch_run(
                path, args.threads, texts, args.n_predict,
                f"--spec-type ngram-simple --spec-draft-n-max {args.n_max} "
                f"--spec-ngram-simple-size-n {args.ngram_n} "
                f"--spec-ngram-simple-size-m {args.ngram_m}", args.rounds)
            print(f"{Path(path).name} batch {json.dumps(entry['batch'])}", file=sys.stderr)
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
