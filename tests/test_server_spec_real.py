"""Speculative decoding through a real server process (issue 39) on SmolLM2: llama-server's
flags, the openai client, the same greedy text as a server without speculation, drafted and
accepted counts in /completion's timings and /metrics, and one-line errors for bad input."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import httpx
import openai
import pytest
from test_server_harness import ROOT, ServerProcess
from test_server_real import MODEL

pytestmark = [pytest.mark.real,
              pytest.mark.skipif(MODEL is None, reason="SmolLM2 not downloaded")]

DOC = ("The meeting is moved from Tuesday at 10 am to Thursday at 2 pm in room 4B. "
       "Please bring the quarterly report, the budget draft and your laptop. "
       "Lunch will be served after the meeting in the main hall.")
QUESTIONS = [f"Repeat this text exactly:\n{DOC}",
             f"Rewrite this text, changing Thursday to Friday:\n{DOC}",
             "Write a haiku about autumn.",
             f"Summarise in one sentence:\n{DOC}"]


@pytest.fixture(scope="module")
def servers():
    plain = ServerProcess(MODEL, "-np", "4", "-c", "4096")
    spec = None
    try:
        spec = ServerProcess(MODEL, "-np", "4", "-c", "4096", "--spec-type", "ngram-simple",
                             "--spec-ngram-simple-size-n", "3", "--metrics")
        yield plain, spec
    finally:
        plain.stop()
        if spec is not None:
            spec.stop()


def chat(url: str, question: str, stream: bool) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    messages = [{"role": "user", "content": question}]
    if not stream:
        return client.chat.completions.create(model="m", messages=messages, max_tokens=80,
                                              temperature=0).choices[0].message.content
    chunks = client.chat.completions.create(model="m", messages=messages, max_tokens=80,
                                            temperature=0, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_same_text_with_and_without_speculation(servers):
    plain, spec = servers
    for stream in (False, True):
        with ThreadPoolExecutor(4) as pool:  # all four in one batch
            got = list(pool.map(lambda q: chat(spec.url, q, stream), QUESTIONS))
        want = [chat(plain.url, q, stream) for q in QUESTIONS]
        assert got == want
    lines = httpx.get(spec.url + "/metrics", timeout=10).text.splitlines()
    value = dict(line.split() for line in lines if not line.startswith("#"))
    drafted = float(value["llamacpp:spec_decode_num_draft_tokens_total"])
    assert 0 < float(value["llamacpp:spec_decode_num_accepted_tokens_total"]) <= drafted


def test_completion_timings_count_drafts(servers):
    _, spec = servers
    prompt = f"<|im_start|>user\nRepeat this text exactly:\n{DOC}<|im_end|>\n" \
             "<|im_start|>assistant\n"
    body = {"prompt": prompt, "n_predict": 48, "temperature": 0, "cache_prompt": False}
    timings = httpx.post(spec.url + "/completion", json=body, timeout=60).json()["timings"]
    assert 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    off = httpx.post(spec.url + "/completion", json={**body, "speculative.n_max": 0},
                     timeout=60).json()["timings"]
    assert "draft_n" not in off


@pytest.mark.parametrize("field,value", [("speculative.n_max", -2), ("speculative.n_min", "x"),
                                         ("speculative.p_min", 1.5)])
def test_bad_speculative_fields_are_400(servers, field, value):
    _, spec = servers
    reply = httpx.post(spec.url + "/completion", json={"prompt": "hi", field: value},
                       timeout=30)
    assert reply.status_code == 400 and field in reply.json()["error"]["message"]


def test_a_draft_of_another_vocabulary_is_one_line(real_model):
    gemma = real_model("gemma-3-270m-q4_k_m.gguf")
    run = subprocess.run([sys.executable, "-m", "edgeinfer.server", str(MODEL), "--port", "0",
                          "-md", str(gemma)], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "cannot draft for this model: vocabulary type spm differs" in run.stderr


@pytest.mark.parametrize("filename", ["SmolLM2-135M-Instruct.Q4_1.gguf",
                                      "gemma-3-270m-q4_k_m.gguf"])
def test_eight_at_once_on_real_models(real_model, filename):
    """Both real models, eight prompts of different lengths at once (the batch goes from
    eight plain rows to drafting ones as they finish): the greedy tokens without
    speculation."""
    from test_server_spec import GREEDY, run_together, tokens

    from edgeinfer.api import Model
    from edgeinfer.server.engine import Engine
    from edgeinfer.server.options import ServerSettings
    from edgeinfer.spec import SpecParams

    path = real_model(filename)
    model = Model.load(path, n_ctx=256, warm_up=False)
    prompts = [model.tokenize(model.apply_chat_template([{"role": "user", "content": q}]))
               for q in QUESTIONS * 2]
    del model
    params = [replace(GREEDY, n_predict=8 + 6 * i) for i in range(8)]
    results = []
    for spec in (SpecParams(), SpecParams("ngram-simple")):
        eng = Engine(path, ServerSettings(n_slots=8, n_ctx=8192, spec=spec))
        eng.start()
        try:
            assert eng.ready.wait(300)
            results.append(tokens(run_together(eng, prompts, params)))
            drafted = eng.stats.draft_tokens
        finally:
            eng.stop()
            eng.join(10)
    assert results[0] == results[1] and drafted > 0
