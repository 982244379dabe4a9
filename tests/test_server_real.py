"""`edgeinfer serve` on SmolLM2-135M-Instruct (skipped when the model is not present).

The tests share one server, idle before and after each; its KV cache carries over, which
changes no greedy text (cached or not, batched or not, a sequence gives the same tokens) and
only adds to the cached-token counts a test checks from below."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from test_server_harness import ServerProcess, idle_around_test

SMOLLM2 = [Path.home() / ".cache/edgeinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf",
           Path("/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf")]
MODEL = next((p for p in SMOLLM2 if p.exists()), None)

pytestmark = [pytest.mark.real,
              pytest.mark.skipif(MODEL is None, reason="SmolLM2 not downloaded")]


@pytest.fixture(scope="module")
def shared_server():
    srv = ServerProcess(MODEL, "-np", "4", "-c", "1024")
    yield srv
    srv.stop()


@pytest.fixture
def server(shared_server):
    yield from idle_around_test(shared_server)


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none")


def ask(client, question: str, n: int = 24, stream: bool = False) -> str:
    messages = [{"role": "user", "content": question}]
    if not stream:
        reply = client.chat.completions.create(model="m", messages=messages, max_tokens=n,
                                               temperature=0)
        return reply.choices[0].message.content
    chunks = client.chat.completions.create(model="m", messages=messages, max_tokens=n,
                                            temperature=0, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_chat_matches_single_sequence_generation(server, client):
    """The server's batched engine gives the CLI path's greedy text (edgeinfer.generate)."""
    from edgeinfer.api import Model

    model = Model.load(MODEL, n_ctx=1024)
    question = "What is the capital of France?"
    ids = model.tokenize(model.apply_chat_template([{"role": "user", "content": question}]))
    expected = "".join(model.generate(ids, max_tokens=24, temperature=0))
    reply = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": question}], max_tokens=24,
        temperature=0, extra_body={"cache_prompt": False})
    assert reply.choices[0].message.content == expected
    assert reply.usage.prompt_tokens == len(ids)


# Needs batch-invariant kernels: a token's dot products are summed in the same order whether
# it runs alone or in a tile (tests/test_linear.py checks it bit for bit).
def test_concurrent_streams_match_alone(client):
    questions = ["What is the capital of France?", "Name a primary color.",
                 "What is 2 + 2?", "Say hello in Spanish.", "What do bees make?"]
    alone = [ask(client, q, stream=True) for q in questions]
    with ThreadPoolExecutor(len(questions)) as pool:
        together = list(pool.map(lambda q: ask(client, q, stream=True), questions))
    assert together == alone


def test_multi_turn_reuses_history(server):
    messages = [{"role": "system", "content": "You are a concise assistant."},
                {"role": "user", "content": "List three fruits."}]
    url = server.url + "/v1/chat/completions"
    first = httpx.post(url, json={"messages": messages, "max_tokens": 16, "temperature": 0},
                       timeout=120).json()
    messages += [first["choices"][0]["message"], {"role": "user", "content": "And vegetables?"}]
    second = httpx.post(url, json={"messages": messages, "max_tokens": 8, "temperature": 0},
                        timeout=120).json()
    assert second["timings"]["cache_n"] >= first["usage"]["prompt_tokens"]
    assert second["timings"]["prompt_n"] < second["usage"]["prompt_tokens"] / 2
