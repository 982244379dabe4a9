"""Structured output on the JSON-schema corpus (shared/structured), with the real models'
tokenizers: coverage and correctness (tests/structured_corpus.py says how they are scored;
scripts/structured_corpus.py writes the figures).

Asserted: at least 90% of the schemas compile (exactly, or approximately where llguidance
ignores a keyword it does not implement); on exactly compiled schemas every valid instance is
accepted token by token and every invalid one stopped, and nothing accepted is invalid to
jsonschema; on every schema the masks agree with the matcher. The schemas that do not compile
and the approximate ones with wrong instances are listed, with why, in
tests/data/structured_limits.json: the lists must match exactly, so a new failure and a stale
entry both fail.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llguidance", reason="the structured extra is not installed")

from structured_corpus import CORPUS, LIMITS, load_corpus, score_corpus  # noqa: E402

from edgeinfer.gguf_file import GGUFFile  # noqa: E402
from edgeinfer.tokenizer import Tokenizer  # noqa: E402

MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]
MIN_COVERAGE = 0.90
MIN_EXACT_COVERAGE = 0.85  # 202 of 235 with llguidance 1.9


@pytest.fixture(scope="module")
def corpus():
    cases = load_corpus(CORPUS)
    if not cases:
        pytest.skip(f"no JSON-schema corpus in {CORPUS}")
    return cases


@pytest.fixture(scope="module")
def limits():
    return json.loads(LIMITS.read_text(encoding="utf-8"))


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_corpus_coverage_and_correctness(real_model, corpus, limits, model):
    tokenizer = Tokenizer.from_metadata(GGUFFile(real_model(model)).metadata)
    results = score_corpus(tokenizer, corpus)
    compiled = [r for r in results if r.status != "error"]
    exact = [r for r in compiled if r.status == "exact"]
    assert len(compiled) / len(results) >= MIN_COVERAGE
    assert len(exact) / len(results) >= MIN_EXACT_COVERAGE

    not_compiled = {r.name: r.reason for r in results if r.status == "error"}
    assert set(not_compiled) == set(limits["not_compiled"]), not_compiled

    for r in exact:
        assert not r.wrong, (r.name, r.wrong)
        assert not r.accepted_invalid, (r.name, r.accepted_invalid)
    mismatches = {r.name: [i.mismatch for i in r.instances if i.mismatch] for r in compiled}
    assert not any(mismatches.values()), mismatches

    wrong = {r.name: r.status for r in compiled if r.wrong}
    assert set(wrong) == set(limits["approximate_wrong"]), wrong
    assert set(wrong.values()) <= {"approximate"}
