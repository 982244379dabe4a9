"""A reply whose generated text the chat format cannot parse (llama.cpp's "does not match the
expected format"), over a real socket: a 500 envelope when not streamed; when streamed, the
API's own SSE error frame as the stream's last bytes, as llama-server's stream loop sends it
(format_error: `data: {"error": ...}` for OpenAI, `event: error` with the bare error for
Anthropic), with no `[DONE]` after it. The prefilled assistant turn names a function the
request does not offer, so no continuation the model writes can parse."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from test_server_harness import ServerProcess, idle_around_test
from tiny_models import write_tiny_model

TEMPLATE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgeinfer" \
    / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
PREFILL = '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'
MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": PREFILL}]
PARAMS = {"type": "object", "properties": {"success": {"type": "boolean"}}}
ERROR = {"code": 500,  # format_error_response's key order
         "message": "could not parse the generated text: The model produced output that "
                    "does not match the expected peg-native format",
         "type": "server_error"}


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    if not TEMPLATE.exists():
        pytest.skip(f"{TEMPLATE} is absent (scripts/fetch_vocab_tests.py fetches it)")
    tiny = write_tiny_model(tmp_path_factory.mktemp("stream-errors") / "tiny.gguf")
    srv = ServerProcess(tiny, "-c", "2048", "--chat-template-file", str(TEMPLATE))
    yield srv
    srv.stop()


@pytest.fixture
def server(shared_server):
    yield from idle_around_test(shared_server)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=600)


def oai_body(stream: bool) -> dict:
    return {"stream": stream, "max_tokens": 3, "temperature": 0, "messages": MESSAGES,
            "continue_final_message": True, "add_generation_prompt": False,
            "tools": [{"type": "function", "function": {"name": "test", "description": "",
                                                        "parameters": PARAMS}}]}


def anthropic_body(stream: bool) -> dict:
    return {"stream": stream, "max_tokens": 3, "temperature": 0, "messages": MESSAGES,
            "tools": [{"name": "test", "input_schema": PARAMS}]}


def frame(data: dict, event: str | None = None) -> bytes:
    """An SSE frame as llama-server writes it (compact JSON), written here independently."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def test_unparsable_output_is_a_500_envelope(server):
    for path, body in (("/v1/chat/completions", oai_body(False)),
                       ("/v1/messages", anthropic_body(False))):
        reply = post(server, path, body)
        assert reply.status_code == 500, path
        assert reply.json() == {"error": ERROR}, path


@pytest.mark.parametrize("path,body,last", [
    ("/v1/chat/completions", oai_body(True), frame({"error": ERROR})),
    ("/v1/messages", anthropic_body(True), frame(ERROR, "error")),
], ids=["openai", "anthropic"])
def test_a_stream_ends_with_the_apis_error_frame(server, path, body, last):
    reply = post(server, path, body)
    assert reply.status_code == 200  # the stream had begun
    raw = reply.content
    assert raw.endswith(last), raw[-400:]
    assert b"[DONE]" not in raw
    frames = raw.split(b"\n\n")
    assert frames[-1] == b"" and all(f for f in frames[:-1])  # whole frames only
