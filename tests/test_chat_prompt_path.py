"""One chat-prompt path: the Python API (`Model.apply_chat_template`, which `run` and the REPL
use) and a real server's /apply-template give the same prompt for every template of
llama.cpp's corpus (models/templates/*.jinja, fetched by scripts/fetch_vocab_tests.py),
each written into a tiny GGUF's tokenizer.chat_template, and for a GGUF without one.

Each side is a separate process reading the same file: the test's own `Model.load` and
`python -m edgeinfer.server`. A request one side refuses must be refused by the other with
the same message.
"""

from __future__ import annotations

import httpx
import pytest
from test_chat_refs import templates_dir
from test_server_harness import ServerProcess
from tiny_models import write_tiny_model

from edgeinfer.api import Model
from edgeinfer.commands.run import RunOptions, build_prompt
from edgeinfer.errors import EdgeInferError

SYSTEM_USER = [{"role": "system", "content": "You are a test."},
               {"role": "user", "content": "Hi there"}]
MULTI_TURN = [*SYSTEM_USER, {"role": "assistant", "content": "Hello! How can I help?"},
              {"role": "user", "content": "What is 2+2?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TOOL_TURN = [*SYSTEM_USER, {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
PLAIN_CASES = {"system+user": (SYSTEM_USER, {}), "multi-turn": (MULTI_TURN, {})}
TOOL_CASES = {"tools": (SYSTEM_USER, {"tools": [WEATHER]}),
              "tool call and result": (TOOL_TURN, {"tools": [WEATHER]})}
THINKING_OFF = {"thinking off": (SYSTEM_USER, {"enable_thinking": False})}

_FOLDER = templates_dir()
CORPUS = sorted(p.stem for p in _FOLDER.glob("*.jinja")) if _FOLDER else []


def _body(messages: list[dict], extra: dict) -> dict:
    """The request the server gets for apply_chat_template(messages, **extra)."""
    body = {"messages": messages, **{k: v for k, v in extra.items() if k == "tools"}}
    kwargs = {k: v for k, v in extra.items() if k != "tools"}
    return {**body, "chat_template_kwargs": kwargs} if kwargs else body


def api_prompt(model: Model, messages: list[dict], extra: dict) -> tuple[str, str]:
    """("prompt", text) or ("error", message) from the Python API."""
    try:
        return "prompt", model.apply_chat_template(messages, **extra)
    except EdgeInferError as exc:
        return "error", str(exc)


def server_prompt(server: ServerProcess, body: dict) -> tuple[str, str]:
    """("prompt", text) or ("error", message) from POST /apply-template."""
    reply = httpx.post(server.url + "/apply-template", json=body, timeout=60)
    if reply.status_code == 200:
        return "prompt", reply.json()["prompt"]
    return "error", reply.json()["error"]["message"]


@pytest.fixture
def model_and_server(request, tmp_path):
    """A tiny GGUF with `request.param` (a template's source, or None) in its metadata,
    loaded here and served by a server process."""
    path = write_tiny_model(tmp_path / "tiny.gguf", n_layer=1, chat_template=request.param)
    model = Model.load(path, n_ctx=256, warm_up=False)
    server = ServerProcess(path, "-np", "1", "-c", "256")
    yield model, server
    server.stop()


def _source(name: str) -> str:
    return (_FOLDER / f"{name}.jinja").read_text(encoding="utf-8")


@pytest.mark.skipif(not CORPUS, reason="llama.cpp's chat templates absent "
                                       "(run scripts/fetch_vocab_tests.py)")
@pytest.mark.parametrize("model_and_server", [_source(n) for n in CORPUS], ids=CORPUS,
                         indirect=True)
def test_api_and_server_render_the_corpus_alike(model_and_server):
    model, server = model_and_server
    cases = {**PLAIN_CASES, **THINKING_OFF}
    if model.chat.caps()["supports_tools"]:
        cases.update(TOOL_CASES)
    results = {}
    for label, (messages, extra) in cases.items():
        results[label] = api_prompt(model, messages, extra)
        assert server_prompt(server, _body(messages, extra)) == results[label], label
    rendered = [label for label, (kind, _) in results.items() if kind == "prompt"]
    assert rendered, f"no message list rendered: {results}"  # a comparison of prompts


@pytest.mark.parametrize("model_and_server", [None], ids=["no template"], indirect=True)
def test_a_gguf_without_template_gets_chatml_in_run_and_server(model_and_server):
    """llama.cpp's common_chat_templates_init falls back to ChatML; `run` renders with it
    too, and --raw still feeds the text as it is."""
    model, server = model_and_server
    opts = RunOptions(model=None, prompt="Hi there", system="You are a test.")
    expected = ("<|im_start|>system\nYou are a test.<|im_end|>\n"
                "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    assert build_prompt(model, opts) == expected
    assert server_prompt(server, {"messages": SYSTEM_USER}) == ("prompt", expected)
    assert model.apply_chat_template(SYSTEM_USER) == expected
    raw = RunOptions(model=None, prompt="Hi there", system="You are a test.", raw=True)
    assert build_prompt(model, raw) == "Hi there"


def test_request_fields_and_template_kwargs_reach_the_template(tmp_path):
    """apply_chat_template's `tools` is the request's; other keywords are template
    variables (chat_template_kwargs), as the server reads them. enable_thinking defaults to
    false for a template without reasoning markers, as in llama-server."""
    source = ("{{ tools | length if tools is defined else 'none' }}|{{ colour }}|"
              "{{ enable_thinking }}{% if add_generation_prompt %}|gen{% endif %}")
    model = Model.load(write_tiny_model(tmp_path / "t.gguf", n_layer=1, chat_template=source),
                       n_ctx=256, warm_up=False)
    user = [{"role": "user", "content": "x"}]
    assert model.apply_chat_template(user, colour="red") == "none|red|False|gen"
    assert model.apply_chat_template(user, add_generation_prompt=False, tools=[WEATHER],
                                     colour="blue", enable_thinking=True) == "1|blue|True"


def test_bad_messages_are_a_one_line_error(tmp_path):
    model = Model.load(write_tiny_model(tmp_path / "t.gguf", n_layer=1), n_ctx=256,
                       warm_up=False)
    with pytest.raises(EdgeInferError, match="All non-assistant messages must contain"):
        model.apply_chat_template([{"role": "user"}])
