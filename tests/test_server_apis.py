"""The chat APIs beside OpenAI's chat completions, over a real socket with their own clients
on a tiny model: Anthropic Messages (the `anthropic` SDK), OpenAI Responses (the `openai`
SDK), the token counts, and Vertex AI's /predict. Each reply's text is checked against an
independent path: the greedy /completion of the prompt /apply-template renders.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from test_server_harness import ServerProcess, idle_around_test
from tiny_models import write_tiny_model

GREEDY = {"temperature": 0, "seed": 1}
MESSAGES = [{"role": "user", "content": "hello world"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("apis") / "tiny.gguf")


@pytest.fixture(scope="module")
def shared_server(tiny):
    srv = ServerProcess(tiny, "-np", "2", "-c", "512")
    yield srv
    srv.stop()


@pytest.fixture
def server(shared_server):
    yield from idle_around_test(shared_server)


def post(server, path, body, **kwargs):
    return httpx.post(server.url + path, json=body, timeout=60, **kwargs)


def expected_text(server, messages, n_predict: int, system: str | None = None) -> str:
    """The greedy continuation of the rendered chat prompt, through /completion."""
    if system is not None:
        messages = [{"role": "system", "content": system}, *messages]
    prompt = post(server, "/apply-template", {"messages": messages}).json()["prompt"]
    reply = post(server, "/completion", {"prompt": prompt, "n_predict": n_predict,
                                         "cache_prompt": False, **GREEDY})
    return reply.json()["content"]


def n_prompt_tokens(server, messages) -> int:
    prompt = post(server, "/apply-template", {"messages": messages}).json()["prompt"]
    return len(post(server, "/tokenize", {"content": prompt, "add_special": True})
               .json()["tokens"])


# -- Anthropic Messages ----------------------------------------------------------------------
def anthropic_client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)


def test_anthropic_message_is_the_greedy_continuation(server):
    msg = anthropic_client(server).messages.create(
        model="tiny", max_tokens=6, system="be brief", messages=MESSAGES, extra_body=GREEDY)
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.content[0].type == "text"
    assert msg.content[0].text == expected_text(server, MESSAGES, 6, system="be brief")
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 6
    n = n_prompt_tokens(server, [{"role": "system", "content": "be brief"}, *MESSAGES])
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) == n


def test_anthropic_stream_events_and_text(server):
    client = anthropic_client(server)
    with client.messages.stream(model="tiny", max_tokens=6, messages=MESSAGES,
                                extra_body=GREEDY) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_start" in events and "content_block_stop" in events
    assert final.content[0].text == expected_text(server, MESSAGES, 6)
    assert final.stop_reason == "max_tokens"


def test_anthropic_count_tokens(server):
    count = anthropic_client(server).messages.count_tokens(model="tiny", messages=MESSAGES)
    assert count.input_tokens == n_prompt_tokens(server, MESSAGES)


def test_anthropic_stop_sequence(server):
    text = expected_text(server, MESSAGES, 6)
    stop = text[2:4]
    msg = anthropic_client(server).messages.create(
        model="tiny", max_tokens=6, messages=MESSAGES, extra_body=GREEDY, stop_sequences=[stop])
    assert msg.content[0].text == text[:text.index(stop)]
    assert msg.stop_sequence == stop and msg.stop_reason == "end_turn"


def test_anthropic_bad_requests(server):
    r = post(server, "/v1/messages", {"max_tokens": 4})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}
    r = post(server, "/v1/messages", {"max_tokens": 4, "messages": [
        {"role": "user", "content": [image]}]})
    assert r.status_code == 500  # llama-server's answer for a model without vision
    assert "image input is not supported" in r.json()["error"]["message"]


# -- OpenAI Responses ----------------------------------------------------------------------------
def openai_client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_responses_output_is_the_greedy_continuation(server):
    response = openai_client(server).responses.create(
        model="tiny", input="hello world", instructions="be brief", max_output_tokens=6,
        temperature=0)
    assert response.object == "response" and response.status == "completed"
    assert response.output_text == expected_text(server, MESSAGES, 6, system="be brief")
    assert response.usage.output_tokens == 6


def test_responses_stream(server):
    stream = openai_client(server).responses.create(
        model="tiny", input=MESSAGES, max_output_tokens=6, temperature=0, stream=True)
    events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == expected_text(server, MESSAGES, 6)
    assert events[-1].response.output_text == deltas


def test_responses_input_tokens_and_chat_input_tokens(server):
    n = n_prompt_tokens(server, MESSAGES)
    r = post(server, "/v1/responses/input_tokens", {"input": "hello world"})
    assert r.json() == {"input_tokens": n, "object": "response.input_tokens"}
    r = post(server, "/v1/chat/completions/input_tokens", {"messages": MESSAGES})
    assert r.json()["input_tokens"] == n


def test_responses_refuse_previous_response_id(server):
    r = post(server, "/v1/responses", {"input": "hi", "previous_response_id": "resp_1"})
    assert r.status_code == 400


# -- Vertex AI ----------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vertex_predict(tiny, monkeypatch):
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    monkeypatch.setenv("AIP_HTTP_PORT", str(_free_port()))
    monkeypatch.setenv("AIP_HEALTH_ROUTE", "/ping")
    srv = ServerProcess(tiny, "-np", "2", "-c", "256")
    try:
        assert srv.port == int(os.environ["AIP_HTTP_PORT"])
        assert httpx.get(srv.url + "/ping").json() == {"status": "ok"}
        chat = {"@requestFormat": "chatCompletions", "messages": MESSAGES, "max_tokens": 4,
                **GREEDY}
        tokens = {"@requestFormat": "/tokenize", "content": "hello"}
        r = httpx.post(srv.url + "/predict", json={"instances": [
            chat, tokens, {"@requestFormat": "noSuchRoute"}]}, timeout=60)
        assert r.status_code == 200
        first, second, third = r.json()["predictions"]
        assert first["choices"][0]["message"]["content"] == expected_text(srv, MESSAGES, 4)
        assert second == httpx.post(srv.url + "/tokenize", json={"content": "hello"}).json()
        assert third["error"]["code"] == 400
        r = httpx.post(srv.url + "/predict", json={"instances": "x"})
        assert r.status_code == 400
    finally:
        srv.stop()


# -- reasoning through every API -------------------------------------------------------------
TEMPLATES = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "edgeinfer" \
    / "templates"
R1 = TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"


@pytest.fixture(scope="module")
def thinking_server(tiny):
    """DeepSeek-R1's template: its generation prompt opens <think>, so whatever a random
    model generates without a </think> is reasoning, and the content stays empty."""
    if not R1.exists():
        pytest.skip(f"{R1} is absent (scripts/fetch_vocab_tests.py fetches it)")
    srv = ServerProcess(tiny, "-np", "1", "-c", "512", "--chat-template-file", str(R1))
    yield srv
    srv.stop()


def test_reasoning_comes_back_apart_on_every_api(thinking_server):
    srv = thinking_server
    messages = [{"role": "user", "content": "tell me a story"}]  # no early EOS on this one
    prompt = post(srv, "/apply-template", {"messages": messages}).json()["prompt"]
    assert prompt.endswith("<think>\n")
    completion = post(srv, "/completion", {"prompt": prompt, "n_predict": 6, **GREEDY}).json()
    generated = completion["content"]
    assert completion["stop_type"] == "limit" and "</think>" not in generated
    # the parser re-reads the generation prompt's "<think>\n": its newline is reasoning
    reasoning = "\n" + generated
    body = {"messages": messages, "max_tokens": 6, **GREEDY}
    message = post(srv, "/v1/chat/completions", body).json()["choices"][0]["message"]
    assert (message["content"], message["reasoning_content"]) == ("", reasoning)
    stream = openai_client(srv).chat.completions.create(
        model="m", messages=messages, max_tokens=6, stream=True, extra_body=GREEDY)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == reasoning
    assert not "".join(d.content or "" for d in deltas)
    msg = anthropic_client(srv).messages.create(model="m", max_tokens=6, messages=messages,
                                                extra_body=GREEDY)
    assert [b.type for b in msg.content] == ["thinking"]
    assert msg.content[0].thinking == reasoning
    response = openai_client(srv).responses.create(model="m", input="tell me a story",
                                                   max_output_tokens=6, extra_body=GREEDY)
    assert [item.type for item in response.output] == ["reasoning"]
    # reasoning_format none: all in the content, the opening tag the prompt gave included
    r = post(srv, "/v1/chat/completions", {**body, "reasoning_format": "none"})
    assert r.json()["choices"][0]["message"] == {"role": "assistant",
                                                 "content": "<think>" + reasoning}
