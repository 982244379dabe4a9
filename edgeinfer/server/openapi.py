"""The OpenAPI 3.1 description served at /openapi.json, written by hand from params.py.

Request schemas carry the limits the parser enforces (params.py, json_body.py), so a client
generator or a schema-driven fuzzer (tests/test_server_fuzz.py) produces requests the server
accepts; fields the server refuses (grammar, tools, ...) are left out, and so is
`response_fields`, which reshapes the reply beyond its schema. Unknown fields
are allowed, as llama-server ignores them. Reply schemas name the fields clients rely on and
allow more. The bounds that depend on the loaded model (vocabulary size, slots) are filled in
per server by `openapi_schema`.
"""

from __future__ import annotations

from typing import Any

from edgeinfer import __version__
from edgeinfer.server.json_body import MAX_DEPTH
from edgeinfer.server.params import INT32_MAX, MAX_PROMPTS, UNSUPPORTED

JSON = "application/json"
SSE = "text/event-stream"
EMPTY = {"enum": ["", 0, False, [], {}]}  # what an unsupported field may be (params.py)


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _int(lo: int, hi: int = INT32_MAX, **extra: Any) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi, **extra}


def _obj(properties: dict, required: tuple[str, ...] = (), **extra: Any) -> dict:
    return {"type": "object", "properties": properties, "required": list(required), **extra}


def _logit_bias(n_vocab: int) -> dict:
    """{token: bias} or [[token, bias]]: a token is an id or a string (its tokens), a bias a
    number or false (-inf). An object's integer keys must be ids in the vocabulary too."""
    bias = {"anyOf": [{"type": "number"}, {"const": False}]}
    pair = {"type": "array", "minItems": 2, "maxItems": 2,
            "prefixItems": [{"anyOf": [_int(0, n_vocab - 1), {"type": "string"}]}, bias]}
    return {"anyOf": [{"type": "object", "additionalProperties": bias},
                      {"type": "array", "items": pair}]}


def _generation_fields(n_slots: int, n_vocab: int) -> dict:
    """Fields every completion route takes (params.gen_params); out-of-range numbers of the
    clamped sampling fields are accepted and clamped, as llama-server does."""
    n_predict = _int(-1, description="tokens to generate; -1: until EOS or the context fills")
    return {
        "n_predict": n_predict, "max_tokens": n_predict, "max_completion_tokens": n_predict,
        "temperature": {"type": "number", "description": "<= 0: greedy (clamped to 0)"},
        "top_k": _int(-INT32_MAX - 1, description="<= 0: off"),
        "top_p": {"type": "number", "description": "clamped to [0, 1]; 1: off"},
        "min_p": {"type": "number", "description": "clamped to [0, 1]; 0: off"},
        "repeat_penalty": {"type": "number", "exclusiveMinimum": 0},
        "repeat_last_n": _int(-1, description="-1: the whole context, 0: off"),
        "presence_penalty": {"type": "number"},
        "frequency_penalty": {"type": "number"},
        "seed": _int(-1, 2**64 - 1, description="-1: random"),
        "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "stream": {"type": "boolean"},
        "stream_options": _obj({"include_usage": {"type": "boolean"}}),
        "n_probs": _int(0, 100),
        "cache_prompt": {"type": "boolean"},
        "ignore_eos": {"type": "boolean"},
        "id_slot": _int(-1, n_slots - 1),
        "return_tokens": {"type": "boolean"},
        "timings_per_token": {"type": "boolean"},
        "sse_ping_interval": {"type": "number", "minimum": -1, "maximum": INT32_MAX,
                              "description": "seconds, at least 1; <= 0: no pings"},
        "n": _int(1, description="completions of each prompt, at most the slots"),
        "n_cmpl": _int(1, n_slots, description="completions of each prompt (wins over n)"),
        "logit_bias": _logit_bias(n_vocab),
        "post_sampling_probs": {"type": "boolean"},
        "return_progress": {"type": "boolean"},
        "verbose": {"type": "boolean"},
        "speculative.n_max": _int(0, description="most tokens drafted a step (at most the "
                                                 "server's --spec-draft-n-max)"),
        "speculative.n_min": _int(0, description="shorter drafts are not checked"),
        "speculative.p_min": {"type": "number", "minimum": 0, "maximum": 1},
        # refused unless empty (params._reject_unsupported): a constraint silently ignored
        # would be worse than a 400
        **{key: EMPTY for key in UNSUPPORTED},
        "grammar": {"type": "string", "description": "GBNF, or Lark after %llguidance"},
        "json_schema": {"type": "object", "description": "{}: any JSON object"},
    }


def _prompt(n_vocab: int) -> dict:
    token = _int(0, n_vocab - 1)
    text = {"type": "string", "minLength": 1}  # "" is no prompt (400: the prompt is empty)
    one = {"anyOf": [text,
                     {"type": "array", "minItems": 1,
                      "items": {"anyOf": [token, {"type": "string"}]}}]}
    text_object = {"type": "object", "required": ["prompt_string"],  # no multimodal_data
                   "properties": {"prompt_string": one, "multimodal_data": {"type": "null"}}}
    many = {"type": "array", "minItems": 1, "maxItems": MAX_PROMPTS,
            "items": {"anyOf": [text, one["anyOf"][1], text_object]}}
    # an array of more than MAX_PROMPTS strings (or arrays) is that many prompts: refused
    too_many = {"type": "array", "minItems": MAX_PROMPTS + 1,
                "items": {"type": ["string", "array", "object"]}}
    return {"anyOf": [*one["anyOf"], text_object, many], "not": too_many}


def _message() -> dict:
    part = _obj({"type": {"const": "text"}, "text": {"type": "string"}}, ("type", "text"))
    # null: no text (an assistant turn with tool calls), taken as "" as llama-server does
    content = {"anyOf": [{"type": "string"}, {"type": "array", "items": part},
                         {"type": "null"}]}
    return _obj({"role": {"type": "string"}, "content": content}, ("role", "content"))


def _null_is_default(schema: dict) -> dict:
    """`null` in an optional field means its default (llama-server's json_value)."""
    if schema.get("type") == "object" and "properties" in schema:
        required = set(schema.get("required", ()))
        schema["properties"] = {
            key: value if key in required else {"anyOf": [_null_is_default(value),
                                                          {"type": "null"}]}
            for key, value in schema["properties"].items()}
    return schema


def _request_schemas(n_vocab: int, n_slots: int) -> dict:
    gen = _generation_fields(n_slots, n_vocab)
    messages = {"type": "array", "items": _ref("Message")}
    template_kwargs = {"type": "object", "description": "variables of the chat template"}
    top_logprobs_needs_logprobs = {
        "if": {"required": ["top_logprobs"],
               "properties": {"top_logprobs": {"not": {"type": "null"}}}},
        "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}}
    return {name: _null_is_default(schema) for name, schema in {
        "Message": _message(),
        "CompletionRequest": _obj({"prompt": _prompt(n_vocab), **gen}, ("prompt",)),
        "OaiCompletionRequest": _obj(
            {"prompt": _prompt(n_vocab), "model": {"type": "string"},
             "echo": {"const": False}, "logprobs": _int(0, 100), "best_of": {"type": "null"},
             "suffix": {"type": "null"}, **gen}, ("prompt",)),
        "ChatRequest": _obj(
            {"messages": messages, "model": {"type": "string"}, "logprobs": {"type": "boolean"},
             "top_logprobs": _int(0, 100, description="needs logprobs: true"),
             "response_format": {"anyOf": [
                 _obj({"type": {"enum": ["text", "json_object"]}, "schema": {"type": "object"}},
                      ("type",)),
                 _obj({"type": {"const": "json_schema"}, "json_schema": _obj(
                     {"name": {"type": "string"}, "schema": {"type": "object"},
                      "strict": {"type": "boolean"}})}, ("type",))]},
             "chat_template_kwargs": template_kwargs,
             "add_generation_prompt": {"type": "boolean"}, "tools": EMPTY,
             "continue_final_message": {"type": ["boolean", "string"]},
             "echo": {"type": "boolean"}, "parallel_tool_calls": {"type": "boolean"},
             "reasoning_format": {"enum": ["none", "deepseek", "deepseek-legacy", "auto"]},
             **gen},
            ("messages",), **top_logprobs_needs_logprobs),
        "TokenizeRequest": _obj(
            {"content": {"anyOf": [{"type": "string"}, _prompt(n_vocab)["anyOf"][1],
                                   {"type": "array", "maxItems": 0}]},
             "add_special": {"type": "boolean"}, "parse_special": {"type": "boolean"},
             "with_pieces": {"type": "boolean"}}, ("content",)),
        "DetokenizeRequest": _obj({"tokens": {"type": "array", "items": _int(0, n_vocab - 1)}}),
        "ApplyTemplateRequest": _obj(
            {"messages": messages, "tools": {"type": "array"},
             "chat_template_kwargs": template_kwargs,
             "add_generation_prompt": {"type": "boolean"},
             "continue_final_message": {"type": ["boolean", "string"]},
             "reasoning_format": {"enum": ["none", "deepseek", "deepseek-legacy", "auto"]}},
            ("messages",)),
        # the converters of apis/ take what llama-server takes; only the shape is checked
        "MessagesRequest": _obj({"messages": {"type": "array"}, "max_tokens": _int(-1),
                                 "stream": {"type": "boolean"}}, ("messages",)),
        "ResponsesRequest": _obj({"input": {"anyOf": [{"type": "string"}, {"type": "array"}]},
                                  "max_output_tokens": _int(-1),
                                  "stream": {"type": "boolean"}}, ("input",)),
        # the token counts render the prompt and read no generation field
        "MessagesCountRequest": _obj({"messages": {"type": "array"}}, ("messages",)),
        "ResponsesCountRequest": _obj(
            {"input": {"anyOf": [{"type": "string"}, {"type": "array"}]}}, ("input",)),
    }.items()}


def _reply_schemas() -> dict:
    number, string, integer = {"type": "number"}, {"type": "string"}, {"type": "integer"}
    usage = _obj({"completion_tokens": integer, "prompt_tokens": integer,
                  "total_tokens": integer},
                 ("completion_tokens", "prompt_tokens", "total_tokens"))
    timings = _obj({k: number for k in ("prompt_n", "prompt_ms", "predicted_n",
                                          "predicted_ms", "predicted_per_second", "draft_n",
                                          "draft_n_accepted")})
    finish = {"enum": ["stop", "length"]}
    head = {"id": string, "object": string, "created": integer, "model": string}
    native = _obj({"content": string, "stop": {"const": True}, "tokens": {"type": "array"},
                   "tokens_predicted": integer, "tokens_evaluated": integer,
                   "stop_type": {"enum": ["eos", "word", "limit"]}, "stopping_word": string,
                   "truncated": {"type": "boolean"}, "generation_settings": {"type": "object"},
                   "timings": timings},
                  ("content", "stop", "tokens_predicted", "tokens_evaluated", "stop_type",
                   "timings"))
    oai_choice = _obj({"text": string, "index": integer, "finish_reason": finish},
                      ("text", "index", "finish_reason"))
    message = _obj({"role": {"const": "assistant"}, "content": string}, ("role", "content"))
    chat_choice = _obj({"index": integer, "finish_reason": finish, "message": message},
                       ("index", "finish_reason", "message"))
    piece = {"anyOf": [string, {"type": "array", "items": _int(0, 255)}]}
    model = _obj({"id": string, "object": {"const": "model"}, "owned_by": string,
                  "meta": {"type": "object"}}, ("id", "object"))
    return {
        "Error": _obj({"error": _obj({"code": integer, "message": string, "type": string},
                                     ("code", "message", "type"))}, ("error",)),
        "NativeReply": native,
        "OaiCompletionReply": _obj({**head, "choices": {"type": "array", "items": oai_choice},
                                    "usage": usage}, ("id", "object", "choices", "usage")),
        "ChatReply": _obj({**head, "choices": {"type": "array", "items": chat_choice},
                           "usage": usage}, ("id", "object", "choices", "usage")),
        "TokenizeReply": _obj({"tokens": {"type": "array", "items": {"anyOf": [
            integer, _obj({"id": integer, "piece": piece}, ("id", "piece"))]}}}, ("tokens",)),
        "DetokenizeReply": _obj({"content": string}, ("content",)),
        "ApplyTemplateReply": _obj({"prompt": string}, ("prompt",)),
        "InputTokens": _obj({"input_tokens": integer, "object": string}, ("input_tokens",)),
        "AnthropicMessage": _obj({"id": string, "type": {"const": "message"},
                                  "content": {"type": "array"}, "stop_reason": string,
                                  "usage": {"type": "object"}},
                                 ("id", "type", "content", "usage")),
        "Response": _obj({"id": string, "object": {"const": "response"},
                          "output": {"type": "array"}, "usage": {"type": "object"}},
                         ("id", "object", "output")),
        "Health": _obj({"status": {"const": "ok"}}, ("status",)),
        "Models": _obj({"object": {"const": "list"}, "data": {"type": "array", "items": model}},
                       ("object", "data")),
        "Props": _obj({"default_generation_settings": {"type": "object"},
                       "total_slots": integer, "chat_template": string, "build_info": string},
                      ("default_generation_settings", "total_slots")),
        "Slots": {"type": "array", "items": _obj({"id": integer, "is_processing": {
            "type": "boolean"}}, ("id", "is_processing"))},
    }


def _errors(*statuses: int) -> dict:
    text = {400: "invalid request", 401: "invalid API key", 413: "request body too large",
            500: "an image for a model without vision (llama-server's answer)",
            501: "not enabled on this server", 503: "loading, or no slot is free"}
    return {str(s): {"description": text[s], "content": {JSON: {"schema": _ref("Error")}}}
            for s in statuses}


def _post(summary: str, request: str, reply: dict, stream: bool = False,
          errors: tuple[int, ...] = (400, 413, 503)) -> dict:
    content = {JSON: {"schema": reply}}
    if stream:
        # before OpenAPI 3.2 (`itemSchema`), `schema` describes each event
        event = _obj({"data": {"type": "string", "description": "a JSON chunk or [DONE]"}},
                     ("data",))
        content[SSE] = {"schema": event}
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {JSON: {"schema": _ref(request)}}},
        "responses": {"200": {"description": "OK", "content": content},
                      **_errors(*errors)}}}


def _get(summary: str, reply: dict, media: str = JSON, errors: tuple[int, ...] = (503,),
         parameters: tuple[dict, ...] = ()) -> dict:
    op = {"summary": summary, "parameters": list(parameters),
          "responses": {"200": {"description": "OK", "content": {media: {"schema": reply}}},
                        **_errors(*errors)}}
    return {"get": op}


def openapi_schema(n_vocab: int, n_slots: int, metrics: bool = False,
                   api_key: bool = False, public: frozenset[str] = frozenset()) -> dict:
    """The description of this server's routes, for a model of `n_vocab` tokens served in
    `n_slots` slots; with `api_key`, every route but the `public` ones needs it."""
    native = {"anyOf": [_ref("NativeReply"), {"type": "array", "items": _ref("NativeReply"),
                                               "maxItems": MAX_PROMPTS * n_slots}]}
    completion = _post("llama-server's native completion", "CompletionRequest", native, True)
    chat = _post("OpenAI chat completion", "ChatRequest", _ref("ChatReply"), True)
    fail_on_no_slot = {"name": "fail_on_no_slot", "in": "query", "schema": {"type": "string"}}
    paths = {
        "/health": _get("200 once the model is loaded", _ref("Health")),
        "/models": _get("the model list", _ref("Models")),
        "/props": {**_get("server properties", _ref("Props")),
                   "post": {"summary": "not supported",
                            "responses": _errors(501, 503)}},
        "/slots": _get("the slots", _ref("Slots"), errors=(501, 503),
                       parameters=(fail_on_no_slot,)),
        "/metrics": _get("Prometheus metrics", {"type": "string"}, "text/plain",
                         (503,) if metrics else (501, 503)),
        "/completion": completion,
        "/v1/completions": _post("OpenAI completion", "OaiCompletionRequest",
                                 _ref("OaiCompletionReply"), True),
        "/v1/chat/completions": chat,
        "/v1/chat/completions/input_tokens": _post(
            "the chat prompt's length in tokens", "ApplyTemplateRequest", _ref("InputTokens")),
        "/v1/messages": _post("Anthropic Messages", "MessagesRequest",
                              _ref("AnthropicMessage"), True, errors=(400, 413, 500, 503)),
        "/v1/messages/count_tokens": _post("Anthropic token count", "MessagesCountRequest",
                                           _ref("InputTokens"), errors=(400, 413, 500, 503)),
        "/v1/responses": _post("OpenAI Responses", "ResponsesRequest", _ref("Response"), True),
        "/v1/responses/input_tokens": _post("OpenAI Responses token count",
                                            "ResponsesCountRequest", _ref("InputTokens")),
        "/tokenize": _post("text to token ids", "TokenizeRequest", _ref("TokenizeReply")),
        "/detokenize": _post("token ids to text", "DetokenizeRequest", _ref("DetokenizeReply")),
        "/apply-template": _post("the chat template alone", "ApplyTemplateRequest",
                                 _ref("ApplyTemplateReply")),
        "/openapi.json": _get("this description", {"type": "object"}),
    }
    for alias, path in (("/v1/health", "/health"), ("/v1/models", "/models"),
                        ("/completions", "/completion"),
                        ("/chat/completions", "/v1/chat/completions"),
                        ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"),
                        ("/responses", "/v1/responses"),
                        ("/responses/input_tokens", "/v1/responses/input_tokens")):
        paths[alias] = paths[path]
    schema = {
        "openapi": "3.1.0",
        "info": {"title": "edgeinfer", "version": __version__,
                 "description": "llama-server and OpenAI compatible API. Request bodies "
                                "are strict JSON: no NaN or Infinity, integers within 64 "
                                "bits, strings valid Unicode (no lone surrogates), at most "
                                f"{MAX_DEPTH} levels deep."},
        "paths": paths,
        "components": {"schemas": {**_request_schemas(n_vocab, n_slots), **_reply_schemas()}},
    }
    if api_key:
        for path, item in paths.items():
            for op in item.values():
                if path not in public:
                    op["responses"] = {**op["responses"], **_errors(401)}
        schema["components"]["securitySchemes"] = {"bearer": {"type": "http",
                                                              "scheme": "bearer"}}
        schema["security"] = [{"bearer": []}]
    return schema
