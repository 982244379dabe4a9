"""Greedy answers over a real socket are the same bits alone and among concurrent requests
(issue 41): a long shared prefix (past the length where a lone decode row's keys are split
across threads), admitted all at once, its prompt chunks mixed with decoding sequences, at
several slot counts; the texts and the log-probabilities of every generated token must agree.
On a tiny model here; on SmolLM2 in the real-model suite (the issue's reproduction)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest
from test_server_harness import ServerProcess
from tiny_models import write_tiny_model

PREFIX_TOKENS = 1100  # a lone decode row past 1,024 keys is split across 2 threads
N_REQUESTS = 8


def answer(client, request: dict) -> tuple[str, list[float]]:
    """A greedy answer and its tokens' log-probabilities (/v1/completions reports them in
    llama-server's `content` list, which the openai client keeps as an extra field)."""
    if "messages" in request:
        reply = client.chat.completions.create(model="m", temperature=0, logprobs=True,
                                               **request)
        choice = reply.choices[0]
        return choice.message.content, [t.logprob for t in choice.logprobs.content]
    reply = client.completions.create(model="m", temperature=0, logprobs=1, **request)
    choice = reply.choices[0]
    return choice.text, [t["logprob"] for t in choice.logprobs.model_extra["content"]]


def passes(client, requests: list[dict]) -> dict[str, list]:
    """The requests one after another, then all at once, then one after another again."""
    first = [answer(client, r) for r in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(lambda r: answer(client, r), requests))
    again = [answer(client, r) for r in requests]
    return {"alone": first, "together": together, "alone again": again}


def assert_same(results: dict[str, list]) -> None:
    alone = results["alone"]
    assert all(logprobs for _, logprobs in alone)
    for name, got in results.items():
        for i, (expected, actual) in enumerate(zip(alone, got)):
            assert actual[0] == expected[0], f"request {i} {name}: text differs"
            assert actual[1] == expected[1], f"request {i} {name}: log-probabilities differ"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("conc") / "tiny.gguf", n_ctx_train=2048)


@pytest.mark.parametrize("n_slots", [2, 4, 8])
def test_shared_long_prefix_alone_and_together(tiny, n_slots):
    rng = np.random.default_rng(n_slots)
    prefix = rng.integers(10, 250, PREFIX_TOKENS).tolist()
    requests = [{"prompt": prefix + rng.integers(10, 250, 5 + i).tolist(), "max_tokens": 16}
                for i in range(N_REQUESTS)]
    server = ServerProcess(tiny, "-np", str(n_slots), "-c", "1280", "-t", "2")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        results = passes(client, requests)
    finally:
        server.stop()
    assert_same(results)


SMOLLM2 = [Path.home() / ".cache/edgeinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf",
           Path("/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf")]
SMOLLM2_MODEL = next((p for p in SMOLLM2 if p.exists()), None)


@pytest.mark.real
@pytest.mark.skipif(SMOLLM2_MODEL is None, reason="SmolLM2 not downloaded")
@pytest.mark.parametrize("n_slots", [4, 8])
def test_smollm2_issue_41_reproduction(n_slots):
    system = " ".join(f"Rule {i}: answer politely and briefly, and never mention the number "
                      f"{i}." for i in range(60))  # ~1,130 tokens
    requests = [{"messages": [{"role": "system", "content": system},
                              {"role": "user", "content": f"What is {i} plus {i}?"}],
                 "max_tokens": 24} for i in range(N_REQUESTS)]
    server = ServerProcess(SMOLLM2_MODEL, "-np", str(n_slots), "-c", "3072", "-t", "2")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        results = passes(client, requests)
    finally:
        server.stop()
    assert_same(results)
