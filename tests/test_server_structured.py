"""Structured output over a real socket (issue 34): grammars, JSON schemas and OpenAI's
response_format on every route, checked with the `jsonschema` package and the `openai`
client's own parsing (pydantic), on SmolLM2 (real outputs that must parse) and a tiny model
(the error cases)."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pydantic
import pytest
from test_server_harness import ServerProcess, idle_around_test
from tiny_models import write_tiny_model

pytest.importorskip("llguidance", reason="the 'structured' extra")

GREEDY = {"temperature": 0, "seed": 1}
PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"], "additionalProperties": False}


class Person(pydantic.BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def shared_server(real_model):
    srv = ServerProcess(real_model("SmolLM2-135M-Instruct.Q4_1.gguf"), "-np", "2", "-c", "1024")
    yield srv
    srv.stop()


@pytest.fixture
def server(shared_server):
    yield from idle_around_test(shared_server)


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    srv = ServerProcess(write_tiny_model(tmp_path_factory.mktemp("st") / "tiny.gguf"),
                        "-np", "2", "-c", "512")
    yield srv
    srv.stop()


def post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=120)


def ask(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


@pytest.mark.real
def test_json_schema_output_validates_streamed_and_not(server):
    body = {"messages": ask("Describe a person as JSON."), "max_tokens": 80, **GREEDY,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "person", "schema": PERSON}}}
    reply = post(server, "/v1/chat/completions", body).json()["choices"][0]
    assert reply["finish_reason"] == "stop"
    jsonschema.validate(json.loads(reply["message"]["content"]), PERSON)
    with httpx.stream("POST", server.url + "/v1/chat/completions",
                      json={**body, "stream": True}, timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                   if e["choices"])
    assert text == reply["message"]["content"]


@pytest.mark.real
def test_openai_client_parses_into_a_pydantic_model(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    completion = client.chat.completions.parse(
        model="m", messages=ask("Invent a person."), response_format=Person, max_tokens=60,
        temperature=0)
    person = completion.choices[0].message.parsed
    assert isinstance(person, Person) and person.name


@pytest.mark.real
@pytest.mark.parametrize("route,field", [
    ("/completion", {"grammar": 'root ::= ("yes" | "no") "."'}),
    ("/completion", {"json_schema": {"type": "array", "items": {"type": "integer"},
                                     "maxItems": 3}}),
    ("/v1/completions", {"response_format": {"type": "json_object"}}),
    ("/completion", {"grammar": "%llguidance {}\nstart: /[a-z]+/ \".\""}),
])
def test_constraints_on_the_completion_routes(server, route, field):
    body = {"prompt": "Answer: ", "max_tokens": 40, "n_predict": 40, **GREEDY, **field}
    reply = post(server, route, body).json()
    text = reply["content"] if route == "/completion" else reply["choices"][0]["text"]
    if "grammar" in field and "llguidance" in field["grammar"]:
        assert re.fullmatch(r"[a-z]+\.", text)
    elif "grammar" in field:
        assert text in ("yes.", "no.")
    elif "json_schema" in field:
        jsonschema.validate(json.loads(text), field["json_schema"])
    else:
        assert isinstance(json.loads(text), dict)


def test_greedy_constrained_is_the_masked_argmax(tiny_server):
    """One constrained token, checked against the unconstrained distribution: the answer is
    the most likely of the allowed tokens (n_probs reports the raw distribution)."""
    raw = post(tiny_server, "/completion", {"prompt": "hello", "n_predict": 1, "n_probs": 50,
                                            **GREEDY}).json()
    top = [(t["token"], t["logprob"]) for t in raw["completion_probabilities"][0]
           ["top_logprobs"]]
    allowed = [tok for tok, _ in top if re.fullmatch(r"[a-z]", tok)][:3]
    assert allowed, top
    grammar = "root ::= " + " | ".join(f'"{t}"' for t in allowed)
    got = post(tiny_server, "/completion", {"prompt": "hello", "n_predict": 4,
                                            "grammar": grammar, **GREEDY}).json()
    assert got["content"] == allowed[0] and got["stop_type"] == "eos"


@pytest.mark.parametrize("body,match", [
    ({"grammar": "root ::= foo"}, "Rule 'foo' not found"),
    ({"grammar": 'root ::= "a"', "json_schema": {"type": "string"}},
     "Cannot use both grammar and json_schema"),
    ({"json_schema": {"type": "object", "uniqueItems": True, "not": {"type": "null"}},
      "response_format": {"type": "text"}}, "Cannot use both"),
    ({"json_schema": [1, 2]}, "must be a JSON schema object"),
    ({"response_format": {"type": "yaml"}}, "response_format type must be one of"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "strict": True, "schema": {"type": "array", "uniqueItems": True}}}}, "uniqueItems"),
])
def test_bad_constraints_are_400(tiny_server, body, match):
    r = post(tiny_server, "/v1/chat/completions", {"messages": ask("hi"), "max_tokens": 2,
                                                   **body})
    assert r.status_code == 400, r.text
    assert match in r.json()["error"]["message"]


def test_unsupported_keyword_is_approximated_without_strict(tiny_server):
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True,
              "maxItems": 2}
    r = post(tiny_server, "/completion", {"prompt": "x", "n_predict": 12, "json_schema": schema,
                                          **GREEDY})
    assert r.status_code == 200
    value = json.loads(r.json()["content"]) if r.json()["stop_type"] == "eos" else None
    assert value is None or (isinstance(value, list) and len(value) <= 2)
    assert "enforced in part" in tiny_server.log_text()
