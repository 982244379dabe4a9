"""Integration against llama.cpp's own outputs on the real models (shared/golden).

Bounds from the issues: teacher-forced on llama.cpp's greedy continuations, our top-1 equals
llama.cpp's wherever its top-2 margin is above 0.3 and at >= 95% of all steps; the median
|difference| of our logits for llama.cpp's top-8 tokens is <= 0.2; perplexity by the golden
file's method within 1.5% of llama.cpp's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

GOLDEN = Path(__file__).resolve().parents[2] / "shared" / "golden"
MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}

pytestmark = pytest.mark.real


def load_case(name, real_model, flash_attn=False):
    golden_file = GOLDEN / f"{name}.json"
    if not golden_file.exists():
        pytest.skip(f"no golden file {golden_file}")
    from edgeinfer.api import Model

    model = Model.load(real_model(MODELS[name]), n_ctx=512, flash_attn=flash_attn)
    return name, model, json.loads(golden_file.read_text())


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request, real_model):
    return load_case(request.param, real_model)


def test_golden_file_matches_model(case):
    _, model, golden = case
    digest = hashlib.sha256(model.path.read_bytes()).hexdigest()
    assert digest == golden["model_sha256"]
    assert model.tokenizer.add_bos == golden["add_bos"]


def assert_greedy_bounds(golden, logits_of) -> None:
    """The issues' bounds over every greedy step; logits_of(item) gives that item's logits
    rows for its steps."""
    agree, strong_misses, diffs = [], [], []
    for item in golden["greedy"]:
        for j, (row, step) in enumerate(zip(logits_of(item), item["steps"])):
            top, margin = step[0][0], step[0][1] - step[1][1]
            agree.append(int(row.argmax()) == top)
            if not agree[-1] and margin > 0.3:
                strong_misses.append((item["prompt"][:30], j, margin))
            diffs.extend(abs(float(row[t]) - v) for t, v in step)
    assert not strong_misses, strong_misses
    assert np.mean(agree) >= 0.95
    assert np.median(diffs) <= 0.2


def test_teacher_forced_greedy(case):
    _, model, golden = case

    def logits_of(item):
        prompt, ids = item["prompt_ids"], item["ids"]
        first = len(prompt) - 1
        return model.logits(prompt + ids, rows=range(first, first + len(item["steps"])))

    assert_greedy_bounds(golden, logits_of)


def test_prompt_logits(case):
    """At every prompt position our top-1 is among llama.cpp's top 4 logits and the
    logits of those 4 tokens agree within the same median bound."""
    _, model, golden = case
    diffs, in_top4 = [], []
    for item in golden["logits"]:
        logits = model.logits(item["prompt_ids"])
        for row, top4 in zip(logits, item["top_per_position"]):
            in_top4.append(int(row.argmax()) in {t for t, _ in top4})
            diffs.extend(abs(float(row[t]) - v) for t, v in top4)
    assert np.mean(in_top4) >= 0.95
    assert np.median(diffs) <= 0.2


def test_perplexity(case):
    _, model, golden = case
    ppl = golden["ppl"]
    text = (GOLDEN / "GPL-3.txt").read_text(encoding="utf-8")
    assert hashlib.sha256(text.encode()).hexdigest() == ppl["text_sha256"]
    tokens = model.tokenize(text, add_special=False, parse_special=False)
    n_ctx = ppl["n_ctx"]
    nll = []
    for c in range(ppl["n_chunks"]):
        chunk = tokens[c * n_ctx : (c + 1) * n_ctx]
        if model.tokenizer.add_bos:
            chunk = [model.tokenizer.bos_id] + chunk[1:]
        first = n_ctx // 2
        logits = model.logits(chunk, rows=range(first, n_ctx - 1)).astype(np.float64)
        for pos, row in zip(range(first, n_ctx - 1), logits):
            log_z = row.max() + np.log(np.exp(row - row.max()).sum())
            nll.append(log_z - row[chunk[pos + 1]])
    ours = float(np.exp(np.mean(nll)))
    assert abs(ours / ppl["ppl"] - 1) <= 0.015, (ours, ppl["ppl"])


@pytest.fixture(scope="module", params=sorted(MODELS))
def flash_case(request, real_model):
    return load_case(request.param, real_model, flash_attn=True)


def test_flash_attention_decode_within_bounds(flash_case):
    """-fa on (llama.cpp's flash numerics: f32 online softmax for the >= 64-token prefill,
    F16 accumulators for one-token steps) stays within the same bounds, teacher-forced token
    by token as generation runs: the prompt prefilled, then each greedy token decoded.
    These bounds are at the edge of what -fa on numerics allow against the -fa off golden
    files: llama.cpp's own -fa on (0c1e570 built for AVX-512, same decode loop through
    libllama) misses gemma-3's 'The three primary colors are' step 2 (golden margin 0.41;
    the margin is 0.21 with its AVX2 build, -0.02 with AVX-512), so any change of f32
    summation order in the layers can flip that step here too."""
    _, model, golden = flash_case
    tf, n_vocab = model.transformer, model.config.n_vocab

    def logits_of(item):
        prompt, ids, steps = item["prompt_ids"], item["ids"], item["steps"]
        seq = prompt + ids
        rows = np.zeros((len(steps), n_vocab), np.float32)
        n = len(prompt)
        pos = np.arange(n, dtype=np.int32)
        tf.forward(np.asarray(prompt, np.int32), pos, np.zeros(n, np.int32),
                   np.array([n - 1], np.int32), rows[:1])
        for j in range(1, len(steps)):
            p = np.array([n - 1 + j], np.int32)
            tf.forward(np.asarray(seq[n - 1 + j : n + j], np.int32), p, np.zeros(1, np.int32),
                       np.zeros(1, np.int32), rows[j : j + 1])
        return rows

    assert_greedy_bounds(golden, logits_of)
