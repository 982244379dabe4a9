"""Score structured output on the JSON-schema corpus with the real models' tokenizers.

    python scripts/structured_corpus.py [--corpus DIR] [--out structured-corpus.json] [NAME ...]

NAME is a known model (default: smollm2 and gemma3-270m, pulled by scripts/fetch_models.py);
only its tokenizer is read. For each: the seconds to build llguidance's tokenizer, coverage
(schemas compiled, exactly or ignoring keywords llguidance does not implement), correctness
(valid instances accepted token by token, invalid ones stopped; tests/structured_corpus.py),
compile and first-mask times per schema (p50, p99), and every failure. The JSON goes to --out,
a one-line summary per model to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from structured_corpus import CORPUS, load_corpus, score_corpus, summarize  # noqa: E402

from edgeinfer.gguf_file import GGUFFile  # noqa: E402
from edgeinfer.pull import KNOWN_MODELS, models_dir  # noqa: E402
from edgeinfer.structured import ll_tokenizer  # noqa: E402
from edgeinfer.tokenizer import Tokenizer  # noqa: E402

DEFAULT_MODELS = ("smollm2", "gemma3-270m")


def score_model(name: str, cases: list) -> dict:
    path = models_dir() / KNOWN_MODELS[name].filename
    tokenizer = Tokenizer.from_metadata(GGUFFile(path).metadata)
    started = time.perf_counter()
    ll_tokenizer(tokenizer)
    built = time.perf_counter() - started
    started = time.perf_counter()
    summary = summarize(score_corpus(tokenizer, cases))
    return {"model": name, "n_vocab": tokenizer.n_vocab, "ll_tokenizer_s": built,
            "score_s": time.perf_counter() - started, **summary}


def one_line(result: dict) -> str:
    exact, approx = result["correctness_exact"], result["correctness_approximate"]
    return (f"{result['model']}: coverage {result['compiled']}/{result['schemas']} "
            f"({result['compiled_exact']} exact); exact schemas {exact['right']}/"
            f"{exact['instances']} instances right, approximate {approx['right']}/"
            f"{approx['instances']}; compile p50 {result['compile_ms']['p50']:.2f} ms, "
            f"p99 {result['compile_ms']['p99']:.2f} ms; llguidance tokenizer "
            f"{result['ll_tokenizer_s']:.2f} s")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--out", type=Path, default=Path("structured-corpus.json"))
    args = parser.parse_args(argv)
    cases = load_corpus(args.corpus)
    if not cases:
        print(f"error: no schema files in {args.corpus}", file=sys.stderr)
        return 1
    results = []
    for name in args.models:
        results.append(score_model(name, cases))
        print(one_line(results[-1]), file=sys.stderr)
    args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
