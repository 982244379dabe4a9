"""llama-server's request fields and reply shapes over a real socket, on a tiny model:
logit_bias and ignore_eos, n (several choices), post_sampling_probs, return_progress,
JSON-object prompts, response_fields, verbose, /slots and system_fingerprint.

One server with two slots serves every test (the `server` fixture hands it over idle).
"""

from __future__ import annotations

import json
import math

import httpx
import pytest
from test_server_harness import ServerProcess, idle_around_test
from tiny_models import write_tiny_model

GREEDY = {"temperature": 0, "seed": 1, "cache_prompt": False}


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    model = write_tiny_model(tmp_path_factory.mktemp("fields") / "tiny.gguf")
    srv = ServerProcess(model, "-np", "2", "-c", "512")
    yield srv
    srv.stop()


@pytest.fixture
def server(shared_server):
    yield from idle_around_test(shared_server)


def post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=60)


def complete(server, **fields) -> dict:
    r = post(server, "/completion", {"prompt": "hello world", "n_predict": 4,
                                     "return_tokens": True, **GREEDY, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def stream_events(server, path, body) -> list[dict]:
    with httpx.stream("POST", server.url + path, json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def bad(response, match: str) -> None:
    assert response.status_code == 400, response.text
    assert match in response.json()["error"]["message"]


# -- logit_bias, ignore_eos ----------------------------------------------------------------
@pytest.mark.parametrize("form", ["pairs", "object", "false"])
def test_logit_bias_bans_the_greedy_token(server, form):
    first = complete(server, n_predict=1)["tokens"][0]
    bias = {"pairs": [[first, -1e9]], "object": {str(first): -1e9},
            "false": [[first, False]]}[form]
    reply = complete(server, n_predict=1, logit_bias=bias)
    assert reply["tokens"][0] != first
    expected = None if form == "false" else -1e9
    assert reply["generation_settings"]["logit_bias"] == [{"bias": expected, "token": first}]


def test_logit_bias_boost_makes_a_token_greedy(server):
    reply = complete(server, logit_bias={"7": 1e4})
    assert reply["tokens"] == [7, 7, 7, 7]


def test_logit_bias_string_is_tokenized_without_specials(server):
    text = " world"
    ids = post(server, "/tokenize", {"content": text, "parse_special": False}).json()["tokens"]
    reply = complete(server, logit_bias=[[text, False]])
    assert [e["token"] for e in reply["generation_settings"]["logit_bias"]] == ids
    assert not set(ids) & set(reply["tokens"])


@pytest.mark.parametrize("bias,match", [
    ("x", "'logit_bias' must be"),
    ([[1, 2, 3]], "'logit_bias' must be"),
    ([[1, "high"]], "bias must be a number or false"),
    ({"1": True}, "bias must be a number or false"),
    ([[10**6, 1.0]], "outside the vocabulary"),
    ({"-1": 1.0}, "outside the vocabulary"),
])
def test_bad_logit_bias_is_400(server, bias, match):
    bad(post(server, "/completion", {"prompt": "hi", "logit_bias": bias}), match)


def test_ignore_eos_lists_the_eog_tokens_as_minus_inf(server):
    with_eos = complete(server, ignore_eos=True)["generation_settings"]
    assert with_eos["ignore_eos"] is True
    assert with_eos["logit_bias"] and all(e["bias"] is None for e in with_eos["logit_bias"])
    assert complete(server)["generation_settings"]["logit_bias"] == []


def test_generation_settings_have_llama_servers_fields(server):
    settings = complete(server)["generation_settings"]
    for key in ("dynatemp_range", "top_n_sigma", "xtc_probability", "typical_p",
                "dry_multiplier", "dry_sequence_breakers", "mirostat", "n_discard",
                "min_keep", "grammar", "samplers", "timings_per_token",
                "post_sampling_probs", "backend_sampling", "lora"):
        assert key in settings, key
    assert settings["mirostat"] == 0 and settings["post_sampling_probs"] is False


# -- n: several choices --------------------------------------------------------------------
def test_chat_n_gives_n_choices(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "n": 2, **GREEDY}
    reply = post(server, "/v1/chat/completions", body).json()
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    assert reply["choices"][0]["message"] == reply["choices"][1]["message"]  # greedy
    assert reply["system_fingerprint"].startswith("b")
    events = stream_events(server, "/v1/chat/completions", {**body, "stream": True})
    finished = [c["index"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert sorted(finished) == [0, 1]
    roles = [c["index"] for e in events for c in e["choices"] if c["delta"].get("role")]
    assert sorted(roles) == [0, 1]


def test_completion_n_cmpl_repeats_each_prompt(server):
    replies = post(server, "/completion", {"prompt": ["a b", "c d"], "n_cmpl": 2,
                                           "n_predict": 2, **GREEDY}).json()
    assert [r["index"] for r in replies] == [0, 1, 2, 3]
    assert replies[0]["content"] == replies[1]["content"]
    assert replies[2]["content"] == replies[3]["content"]
    oai = post(server, "/v1/completions", {"prompt": "a b", "n": 2, "max_tokens": 2,
                                           **GREEDY}).json()
    assert [c["index"] for c in oai["choices"]] == [0, 1]


def test_n_beyond_the_slots_is_400(server):
    bad(post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                              "n": 3}), "n_cmpl")
    bad(post(server, "/completion", {"prompt": "x", "n_cmpl": 0}), "'n_cmpl'")


# -- probabilities -------------------------------------------------------------------------
def test_post_sampling_probs_are_the_chains_distribution(server):
    reply = complete(server, temperature=1.0, top_k=5, min_p=0.0, top_p=1.0, n_probs=10,
                     post_sampling_probs=True)
    assert reply["generation_settings"]["post_sampling_probs"] is True
    for entry in reply["completion_probabilities"]:
        assert "logprob" not in entry and "top_logprobs" not in entry
        probs = [t["prob"] for t in entry["top_probs"]]
        assert len(probs) == 5 and probs == sorted(probs, reverse=True)  # top_k 5 < n_probs
        assert sum(probs) == pytest.approx(1.0)
        assert entry["prob"] in probs


def test_post_sampling_probs_greedy_is_certain(server):
    reply = complete(server, n_probs=3, post_sampling_probs=True)
    for token, entry in zip(reply["tokens"], reply["completion_probabilities"], strict=True):
        assert entry["prob"] == 1.0
        assert [(t["id"], t["prob"]) for t in entry["top_probs"]] == [(token, 1.0)]


def test_pre_sampling_probs_ignore_the_bias(server):
    """n_probs without post_sampling_probs: the model's probabilities, before logit_bias
    (llama-server reads them from the raw logits)."""
    plain = complete(server, n_predict=1, n_probs=3)["completion_probabilities"][0]
    first = plain["id"]
    biased = complete(server, n_predict=1, n_probs=3, logit_bias=[[first, False]])
    top = biased["completion_probabilities"][0]["top_logprobs"]
    assert top[0]["id"] == first and top[0]["logprob"] == pytest.approx(plain["logprob"])


# -- return_progress -----------------------------------------------------------------------
def test_return_progress_streams_prompt_progress(server):
    body = {"prompt": "one two three four " * 8, "n_predict": 2, "stream": True,
            "return_progress": True, **GREEDY}
    events = stream_events(server, "/completion", body)
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    assert len(progress) >= 2
    assert progress[0]["cache"] == progress[0]["processed"] == 0
    assert progress[-1]["processed"] == progress[-1]["total"] > 0
    first_token = next(i for i, e in enumerate(events) if e.get("tokens"))
    assert all("prompt_progress" in e for e in events[:first_token])
    plain = stream_events(server, "/completion", {**body, "return_progress": False})
    assert not any("prompt_progress" in e for e in plain)


def test_return_progress_in_chat_repeats_the_role(server):
    events = stream_events(server, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 2,
        "stream": True, "return_progress": True, **GREEDY})
    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["choices"][0]["delta"]["role"] == "assistant" for e in progress)


# -- prompts and reply shapes --------------------------------------------------------------
def test_json_object_prompt(server):
    as_text = complete(server)["content"]
    assert complete(server, prompt={"prompt_string": "hello world"})["content"] == as_text
    assert complete(server, prompt=[{"prompt_string": "hello world"}])["content"] == as_text
    bad(post(server, "/completion", {"prompt": {"prompt_string": "x",
                                                "multimodal_data": ["aGk="]}}), "Multimodal")


def test_response_fields_pick_and_unnest(server):
    reply = complete(server, response_fields=["content", "generation_settings/n_predict",
                                              "no/such"])
    assert set(reply) == {"content", "generation_settings/n_predict"}
    assert reply["generation_settings/n_predict"] == 4
    bad(post(server, "/completion", {"prompt": "x", "response_fields": "content"}),
        "response_fields")


def test_verbose_adds_the_native_reply(server):
    body = {"messages": [{"role": "user", "content": "Book"}], "max_tokens": 2, **GREEDY}
    reply = post(server, "/v1/chat/completions", {**body, "verbose": True}).json()
    assert "Book" in reply["__verbose"]["prompt"]
    assert reply["__verbose"]["content"] == reply["choices"][0]["message"]["content"]
    assert "__verbose" not in post(server, "/v1/chat/completions", body).json()


def test_slots_show_the_last_task_as_llama_server(server):
    complete(server, n_predict=3)
    slots = httpx.get(server.url + "/slots", timeout=10).json()
    used = [s for s in slots if "params" in s]
    assert used
    for slot in used:
        (next_token,) = slot["next_token"]  # a list of one, as llama-server sends it
        assert set(next_token) == {"has_next_token", "has_new_line", "n_remain", "n_decoded"}
        assert (next_token["has_next_token"], next_token["n_remain"],
                next_token["n_decoded"]) == (False, -1, 0)  # idle: no budget left over
        assert "logit_bias" not in slot["params"]  # the metrics-only form
        assert slot["n_prompt_tokens_cache"] + slot["n_prompt_tokens_processed"] <= \
            slot["n_prompt_tokens"]
    for slot in slots:
        if "params" not in slot:
            assert set(slot) == {"id", "n_ctx", "speculative", "is_processing"}


def test_bias_is_finite_json(server):
    """-inf biases travel as null: the reply is strict JSON (no -Infinity)."""
    r = post(server, "/completion", {"prompt": "hi", "n_predict": 1, "ignore_eos": True,
                                     **GREEDY})
    json.loads(r.text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert not any(isinstance(e["bias"], float) and math.isinf(e["bias"])
                   for e in r.json()["generation_settings"]["logit_bias"])
