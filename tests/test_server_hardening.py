"""Regression tests for the HTTP cases of issue 32, over a real socket: each was a 500, a flood
or a traceback before. Every refusal is a one-line JSON error envelope and the server goes on
serving. (A client that hangs up mid-generation is checked by test_server.py's disconnect
tests, which also assert its single log line.)"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from test_server_harness import ServerProcess, idle_around_test
from tiny_models import write_tiny_model

from edgeinfer.server.json_body import MAX_DEPTH, nested_deeper_than
from edgeinfer.server.params import MAX_PROMPTS, gen_params

MAX_BODY = 1 << 20  # the server's --max-body-bytes here
JSON_ROUTES = ("/completion", "/completions", "/v1/completions", "/chat/completions",
               "/v1/chat/completions", "/tokenize", "/detokenize", "/apply-template")
GET_ROUTES = ("/health", "/v1/health", "/models", "/v1/models", "/props", "/slots",
              "/metrics", "/openapi.json")
SAMPLING_FIELDS = ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty",
                   "frequency_penalty")
ONE_TOKEN = {"n_predict": 1, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    model = write_tiny_model(tmp_path_factory.mktemp("hard") / "tiny.gguf")
    srv = ServerProcess(model, "-np", "2", "-c", "256", "--metrics",
                        "--max-body-bytes", str(MAX_BODY))
    yield srv
    assert "Traceback" not in srv.log_text(), srv.log_tail()
    srv.stop()


@pytest.fixture
def server(shared_server):
    yield from idle_around_test(shared_server)


def post_raw(server, path: str, body: bytes | object, **headers: str) -> httpx.Response:
    return httpx.post(server.url + path, content=body, timeout=60,
                      headers={"content-type": "application/json", **headers})


def refused(response: httpx.Response, status: int = 400) -> str:
    """The message of a one-line JSON error envelope with `status`."""
    assert response.status_code == status, response.text[:300]
    assert "\n" not in response.text
    error = response.json()["error"]
    assert error["code"] == status and error["type"] == "invalid_request_error"
    return error["message"]


def still_serving(server) -> None:
    r = httpx.post(server.url + "/completion", json={"prompt": "hi", **ONE_TOKEN}, timeout=60)
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 1


# -- non-finite numbers --------------------------------------------------------------------
@pytest.mark.parametrize("literal", ["Infinity", "-Infinity", "NaN", "1e400", "-1e400"])
@pytest.mark.parametrize("field", SAMPLING_FIELDS)
def test_non_finite_sampling_field_is_400(server, field, literal):
    """These were generated with, then the reply failed to encode (500)."""
    body = f'{{"prompt": "hi", "n_predict": 1, "{field}": {literal}}}'.encode()
    assert "Invalid JSON" in refused(post_raw(server, "/completion", body))


def test_non_finite_number_on_every_json_route_is_400(server):
    for path in JSON_ROUTES:
        refused(post_raw(server, path, b'{"prompt": "hi", "x": [1, -Infinity]}'))
    still_serving(server)


# -- nesting -------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", ["array", "object"])
def test_json_nested_100000_deep_is_400_on_every_json_route(server, shape):
    """json.loads recursed into a RecursionError (500)."""
    depth = 100_000
    body = (b"[" * depth + b"]" * depth if shape == "array"
            else b'{"a":' * depth + b"1" + b"}" * depth)
    for path in JSON_ROUTES:
        assert "nested deeper" in refused(post_raw(server, path, body))
    still_serving(server)


def test_nesting_is_measured_outside_strings():
    deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    assert nested_deeper_than(deep.encode(), MAX_DEPTH)
    assert not nested_deeper_than(json.dumps({"prompt": deep}).encode(), MAX_DEPTH)
    assert not nested_deeper_than(json.dumps({"a\\": "[" * 999, "b": "\\\"["}).encode(),
                                  MAX_DEPTH)
    at_limit = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert not nested_deeper_than(at_limit.encode(), MAX_DEPTH)


# -- chat template kwargs, surrogates ------------------------------------------------------
@pytest.mark.parametrize("key", ["messages", "add_generation_prompt", "bos_token", "eos_token",
                                 "tools", "strip_bos", "template", "self"])
def test_chat_template_kwargs_naming_the_templates_variables(server, key):
    """A kwarg may override a template variable, as in llama-server (once, such names
    collided with the renderer's own arguments: a 500). The template then renders (200)
    or fails with a one-line 400, never a 500."""
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {key: 1},
            **ONE_TOKEN}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code in (200, 400), r.text
    if key == "messages":  # an int where the template iterates a list
        assert "chat template" in refused(r)


@pytest.mark.parametrize("body", [
    b'{"prompt": "hi", "n_predict": 1, "stop": "\\udcff"}',
    b'{"prompt": "hi", "n_predict": 1, "stop": ["ok", "a\\ud800b"]}',
    b'{"prompt": "ab\\udcffc", "n_predict": 1}',
    b'{"prompt": "hi", "n_predict": 1, "\\udc00": 1}',
], ids=["stop", "stop-array", "prompt", "key"])
def test_lone_surrogate_is_400(server, body):
    """Half a surrogate pair is valid JSON but no text (it failed to encode: 500)."""
    for path in ("/completion", "/v1/completions"):
        assert "not valid UTF-8" in refused(post_raw(server, path, body))


def test_surrogate_pair_is_text(server):
    body = b'{"prompt": "hi", "n_predict": 1, "stop": "\\ud83d\\ude00"}'
    assert post_raw(server, "/completion", body).status_code == 200


# -- sse_ping_interval ---------------------------------------------------------------------
def test_sse_ping_interval_is_clamped_to_its_floor(server):
    """1e-9 s sent 12,285 pings for a 16-token answer; the floor is 1 s."""
    assert gen_params({"sse_ping_interval": 1e-9}).sse_ping_interval == 1.0
    assert gen_params({"sse_ping_interval": 0}).sse_ping_interval == 0.0
    assert gen_params({"sse_ping_interval": -1}).sse_ping_interval == 0.0
    assert gen_params({}).sse_ping_interval is None  # the server's --sse-ping-interval
    body = {"prompt": "hi", "n_predict": 16, "ignore_eos": True, "stream": True,
            "sse_ping_interval": 1e-9}
    start = time.monotonic()
    with httpx.stream("POST", server.url + "/completion", json=body, timeout=60) as r:
        lines = list(r.iter_lines())
    elapsed = time.monotonic() - start
    assert sum(line.startswith("data: ") for line in lines) == 17  # 16 tokens, the last reply
    assert lines.count(":") <= elapsed + 1
    for bad in (-2, "1", True):
        refused(httpx.post(server.url + "/completion", timeout=60,
                           json={"prompt": "hi", "sse_ping_interval": bad}))


# -- HEAD ----------------------------------------------------------------------------------
@pytest.mark.parametrize("path", GET_ROUTES)
def test_head_is_answered_where_get_is(server, path):
    """HEAD was a 404 on every route."""
    get, head = httpx.get(server.url + path), httpx.head(server.url + path)
    assert head.status_code == get.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]


def test_head_on_a_post_route_is_404(server):
    r = httpx.head(server.url + "/completion")
    assert r.status_code == 404 and r.content == b""


# -- sizes ---------------------------------------------------------------------------------
def test_body_over_max_body_bytes_is_413(server):
    body = b'{"prompt": "' + b"a" * MAX_BODY + b'"}'
    assert "limit" in refused(post_raw(server, "/completion", body), 413)

    def chunks():  # no Content-Length: counted while it is read
        for _ in range(MAX_BODY // 65536 + 1):
            yield b" " * 65536
        yield b"{}"
    refused(post_raw(server, "/tokenize", chunks()), 413)
    still_serving(server)


def test_body_at_max_body_bytes_is_read(server):
    body = json.dumps({"content": "hi"}).encode()
    r = post_raw(server, "/tokenize", body + b" " * (MAX_BODY - len(body)))
    assert r.status_code == 200 and r.json()["tokens"]


@pytest.mark.parametrize("path", ["/completion", "/v1/completions"])
def test_more_than_256_prompts_is_400(server, path):
    for prompts in (["hi"] * (MAX_PROMPTS + 1), [[1]] * (MAX_PROMPTS + 1)):
        body = {"prompt": prompts, **ONE_TOKEN}
        r = httpx.post(server.url + path, json=body, timeout=60)
        assert f"at most {MAX_PROMPTS} prompts" in refused(r)
    r = httpx.post(server.url + path, json={"prompt": [[1]] * MAX_PROMPTS, **ONE_TOKEN},
                   timeout=120)
    assert r.status_code == 200


# -- disconnects ---------------------------------------------------------------------------
def test_client_gone_while_sending_its_body_is_one_log_line(server):
    """The request is read no further; no traceback (the module fixture checks the log)."""
    mark = len(server.log_text())
    url = httpx.URL(server.url)
    head = (b"POST /completion HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n")
    with socket.create_connection((url.host, url.port), timeout=30) as sock:
        sock.sendall(head + b'{"prompt": ')
    line = server.poll("the disconnect line",
                       lambda: "client disconnected" in server.log_text(mark), 30)
    assert line
    still_serving(server)
    log = server.log_text(mark)
    assert log.count("client disconnected") == 1 and "Traceback" not in log, log
