"""One decoder (edgeinfer/decoder.py) for `run` and the server: the same request through the
Python API's generation loop and through a real server process over HTTP gives the same
tokens, text and stop type, greedy and seeded, with penalties over the whole context
(repeat_last_n -1) and over more than 2,048 tokens, a grammar, stop strings and
speculation."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from test_server_harness import ServerProcess
from tiny_models import write_tiny_model

from edgeinfer.api import Model
from edgeinfer.generate import generate_step, start_decoder
from edgeinfer.sampling import make_sampler
from edgeinfer.sampling_params import SamplingParams
from edgeinfer.spec import SpecParams

N_CTX = 4096
SPEC_FLAGS = ("--spec-type", "ngram-simple", "--spec-draft-n-max", "8",
              "--spec-ngram-simple-size-n", "1")
NGRAM = SpecParams("ngram-simple", n_max=8, ngram_size_n=1)
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
                   "presence_penalty", "frequency_penalty", "seed")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("parity") / "tiny.gguf", n_ctx_train=N_CTX)


@pytest.fixture(scope="module")
def local(model_path):
    return Model.load(model_path, n_ctx=N_CTX, warm_up=False)


@pytest.fixture(scope="module")
def servers(model_path):
    """A plain server and a speculating one, one slot of the whole context each."""
    started = {}

    def get(spec: bool) -> ServerProcess:
        if spec not in started:
            flags = SPEC_FLAGS if spec else ()
            started[spec] = ServerProcess(model_path, "-c", str(N_CTX), "-np", "1", *flags)
        return started[spec]

    yield get
    for server in started.values():
        server.stop()


def run_local(model, prompt, sampling: SamplingParams, n: int, stop=(), grammar=None,
              spec=None) -> dict:
    decoder = start_decoder(model, prompt, make_sampler(sampling), n, stop,
                            constraint=model.compile_constraint(grammar), spec=spec)
    outs = list(generate_step(model, decoder))
    return {"tokens": [o.token for o in outs], "stop_type": decoder.finish.stop_type,
            "content": "".join(o.text for o in outs) + decoder.finish.tail}


def run_server(server, prompt, sampling: SamplingParams, n: int, stop=(), grammar=None) -> dict:
    body = {"prompt": list(prompt), "n_predict": n, "stop": list(stop), "return_tokens": True,
            "cache_prompt": False, **{f: getattr(sampling, f) for f in SAMPLING_FIELDS}}
    body["seed"] = -1 if sampling.seed is None else sampling.seed
    if grammar is not None:
        body["grammar"] = grammar
    reply = httpx.post(server.url + "/completion", json=body, timeout=600)
    assert reply.status_code == 200, reply.text
    return {k: reply.json()[k] for k in ("tokens", "stop_type", "content")}


def same(local, server, prompt, sampling, n, spec=False, **kw) -> dict:
    mine = run_local(local, prompt, sampling, n, spec=NGRAM if spec else None, **kw)
    theirs = run_server(server(spec), prompt, sampling, n, **kw)
    assert mine == theirs
    assert mine["tokens"], "nothing was generated: the comparison proves nothing"
    return mine


GREEDY = SamplingParams(temperature=0)
SEEDED = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)


def prompt_of(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 260, n).tolist()


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_plain_requests_agree(local, servers, sampling):
    for seed in range(3):
        same(local, servers, prompt_of(seed, 20), sampling, 48)
    api = "".join(local.generate(prompt_of(0, 20), max_tokens=48,
                                 **{f: getattr(sampling, f) for f in SAMPLING_FIELDS}))
    assert api == run_server(servers(False), prompt_of(0, 20), sampling, 48)["content"]


@pytest.mark.parametrize("last_n", [-1, 3000])
def test_penalty_window_over_the_whole_prompt(local, servers, last_n):
    """Every token but a few appears in the prompt's first 1,500 tokens, more than 2,048
    positions before the last; then 1,100 tokens of three others. A window of the whole
    context (or 3,000 tokens) penalises the early ones, so the greedy answer keeps to the few
    the prompt left out; a window cut to the last 1,024-2,048 tokens would not."""
    left_out = list(range(240, 250))
    early = [t for t in range(3, 267) if t not in left_out]
    prompt = (early * 6)[:1500] + [5, 6, 7] * 367
    sampling = SamplingParams(temperature=0, repeat_penalty=1.0, repeat_last_n=last_n,
                              frequency_penalty=2.0, presence_penalty=2.0)
    got = same(local, servers, prompt, sampling, 24)
    fresh = [t for t in got["tokens"][:10] if t in left_out]
    assert len(fresh) >= 8, got["tokens"]


def test_grammar_agrees(local, servers):
    grammar = 'root ::= ("ab" | "cd" | "e")+ "."'
    for sampling in (GREEDY, SEEDED):
        got = same(local, servers, prompt_of(3, 16), sampling, 40, grammar=grammar)
        text = got["content"]
        assert set(text.rstrip(".")) <= set("abcde") and text, text


def test_stop_strings_agree(local, servers):
    prompt = prompt_of(4, 16)
    full = run_local(local, prompt, GREEDY, 60)["content"]
    stop = full[len(full) // 2: len(full) // 2 + 2]
    got = same(local, servers, prompt, GREEDY, 60, stop=[stop])
    assert got["stop_type"] == "word" and got["content"] == full[: full.index(stop)]


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_speculation_agrees(local, servers, sampling):
    """Drafts on a repetitive prompt change nothing, locally or in the server."""
    phrase = prompt_of(5, 6)
    prompt = phrase * 6
    got = same(local, servers, prompt, sampling, 48, spec=True)
    assert got == run_local(local, prompt, sampling, 48)
