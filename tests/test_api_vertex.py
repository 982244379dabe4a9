"""Vertex AI's prediction protocol (server/apis/vertex.py) against llama-server's code.

Expected values are read off tools/server/server-http.cpp (gcp_params, path_to_gcp_format,
parse_gcp_predict_response, register_gcp_compat), server.cpp's route table and
tests/unit/test_compat_gcp.py (llama-cpp-python 0.3.36 sdist).
"""

from __future__ import annotations

import pytest

from edgeinfer.server.apis.vertex import (
    MAX_INSTANCES,
    PredictRoutes,
    VertexSettings,
    instances,
    prediction,
    predictions_reply,
    request_format,
)
from edgeinfer.server.errors import ApiError

# part of llama-server's table (server.cpp), in its registration order
ROUTES = [
    ("GET", "/health", "health"), ("GET", "/v1/health", "health"),
    ("GET", "/metrics", "metrics"),
    ("GET", "/props", "get_props"), ("POST", "/props", "post_props"),
    ("GET", "/models", "models"), ("GET", "/v1/models", "models"),
    ("POST", "/completion", "completions"), ("POST", "/completions", "completions"),
    ("POST", "/v1/completions", "completions_oai"),
    ("POST", "/chat/completions", "chat"), ("POST", "/v1/chat/completions", "chat"),
    ("POST", "/v1/responses", "responses"), ("POST", "/responses", "responses"),
    ("POST", "/v1/messages", "anthropic"), ("POST", "/apply-template", "apply_template"),
    ("POST", "/v1/messages/count_tokens", "anthropic_count"),
    ("POST", "/v1/responses/input_tokens", "responses_tok"),
    ("POST", "/slots/:id_slot", "post_slots"),
]


def refused(call, *args) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(*args)
    assert info.value.status == 400 and info.value.type == "invalid_request_error"
    return info.value


def test_settings_defaults():
    # gcp_params(): AIP_MODE must be "PREDICTION"; /predict, no extra health route, port 8080
    assert VertexSettings.from_env({}) == VertexSettings(False, "", "/predict", 8080)
    assert VertexSettings.from_env({"AIP_MODE": "prediction"}).enabled is False
    off = VertexSettings.from_env({"AIP_HTTP_PORT": "9000"})
    assert off.listen_port(8081) == 8081  # the port is only used in prediction mode


def test_settings_from_the_environment():
    env = {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "9000", "AIP_HEALTH_ROUTE": "healthz",
           "AIP_PREDICT_ROUTE": "v1/endpoints/e1:predict"}
    settings = VertexSettings.from_env(env)
    # getenv(..., ensure_leading_slash = true) for both routes; the port overrides --port
    assert settings == VertexSettings(True, "/healthz", "/v1/endpoints/e1:predict", 9000)
    assert settings.listen_port(8081) == 9000
    # an empty variable reads as unset
    empty = VertexSettings.from_env({"AIP_MODE": "PREDICTION", "AIP_PREDICT_ROUTE": "",
                                     "AIP_HTTP_PORT": ""})
    assert (empty.predict_route, empty.port) == ("/predict", 8080)


def test_port_is_read_like_stoi():
    assert VertexSettings.from_env({"AIP_HTTP_PORT": " 8090xyz"}).port == 8090
    with pytest.raises(ValueError):
        VertexSettings.from_env({"AIP_HTTP_PORT": "http"})


@pytest.mark.parametrize(("path", "alias"), [
    ("/v1/chat/completions", "chatCompletions"),  # path_to_gcp_format's own examples
    ("/apply-template", "applyTemplate"),
    ("/chat/completions", "chatCompletions"),
    ("/v1/messages/count_tokens", "messagesCountTokens"),
    ("/v1/responses/input_tokens", "responsesInputTokens"),
    ("/slots/:id_slot", "slots"),  # stops at ':'
    ("/v1", "v1"),  # only a longer path loses "/v1"
    ("/v1beta/x", "betaX"),  # the prefix test is on characters, not a segment
    ("/a--b", "aB"),
    ("/metrics", "metrics"),
])
def test_request_format(path, alias):
    assert request_format(path) == alias


def test_routes_first_registration_wins():
    routes = PredictRoutes.from_routes(ROUTES)
    # handlers.emplace keeps a path's first handler: GET /props
    assert routes.handlers["/props"] == "get_props"
    assert routes.aliases["chatCompletions"] == "/chat/completions"
    assert routes.aliases["completions"] == "/completions"
    assert routes.aliases["responses"] == "/v1/responses"
    assert routes.aliases["slots"] == "/slots/:id_slot"


def test_resolve_alias_and_path():
    routes = PredictRoutes.from_routes(ROUTES)
    instance = {"@requestFormat": "chatCompletions", "max_tokens": 8,
                "messages": [{"role": "user", "content": "What is the meaning of life?"}]}
    assert routes.resolve(instance) == ("/chat/completions", {
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "What is the meaning of life?"}]})
    assert "@requestFormat" in instance  # the instance itself is left alone
    # a path is accepted when no alias has that name
    path, payload = routes.resolve({"@requestFormat": "/v1/chat/completions", "stream": True,
                                    "messages": []})
    assert path == "/v1/chat/completions"
    assert payload == {"stream": False, "messages": []}  # stream forced off, in place
    assert list(payload) == ["stream", "messages"]
    assert routes.resolve({"@requestFormat": "responses", "input": "x"})[1] == {"input": "x"}


@pytest.mark.parametrize(("instance", "message"), [
    ("text", "each instance must be a JSON object"),
    ([], "each instance must be a JSON object"),
    ({}, "each instance must include a string @requestFormat"),
    ({"@requestFormat": 3}, "each instance must include a string @requestFormat"),
    ({"@requestFormat": "embeddings"}, "no handler registered for @requestFormat: embeddings"),
    ({"@requestFormat": "/predict"}, "no handler registered for @requestFormat: /predict"),
])
def test_resolve_refuses(instance, message):
    error = refused(PredictRoutes.from_routes(ROUTES).resolve, instance)
    assert error.message == message
    # build_error: the instance's prediction is {"error": format_error_response(...)}
    assert error.body() == {"error": {"code": 400, "message": message,
                                      "type": "invalid_request_error"}}


def test_predict_route_conflict():
    routes = PredictRoutes.from_routes(ROUTES)
    routes.check(VertexSettings(True, "", "/predict", 8080))
    with pytest.raises(ValueError, match="AIP_PREDICT_ROUTE=/metrics conflicts"):
        routes.check(VertexSettings(True, "", "/metrics", 8080))
    routes.check(VertexSettings(False, "", "/metrics", 8080))  # not registered when off


def test_body_checks():
    assert instances({"instances": [{"a": 1}], "parameters": {}}) == [{"a": 1}]
    assert instances({"instances": [None] * MAX_INSTANCES}) == [None] * 128
    assert refused(instances, []).message == "request body must be a JSON object"
    for body in ({}, {"instances": {"a": 1}}, {"instances": None}):
        assert refused(instances, body).message == \
            "request body must include an array field named instances"
    assert refused(instances, {"instances": [{}] * 129}).message == \
        "instances array exceeds maximum size of 128"


def test_prediction_parses_whatever_the_route_answered():
    # parse_gcp_predict_response: JSON of any status, raw text, null for an empty body
    error = b'{"error":{"code":400,"message":"m","type":"invalid_request_error"}}'
    assert prediction(error) == {"error": {"code": 400, "message": "m",
                                           "type": "invalid_request_error"}}
    assert prediction('{"choices":[]}') == {"choices": []}
    assert prediction(b"# HELP llamacpp:prompt_tokens_total\n") == \
        "# HELP llamacpp:prompt_tokens_total\n"
    assert prediction(b"") is None
    assert refused(prediction, b"data: {}\n\n", True).message == \
        "predict route does not support streaming responses"


def test_predictions_reply():
    assert predictions_reply([{"choices": []}, None]) == {"predictions": [{"choices": []}, None]}
