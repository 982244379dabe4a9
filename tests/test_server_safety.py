"""Safe defaults of `edgeinfer serve` over a real socket (#32): the Host guard against DNS
rebinding, CORS for allowed origins only, no model path in any reply, the API key forms, and
the bounded SIGTERM drain. The policy functions of security.py are checked in process too.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from test_server_harness import ServerProcess, idle_around_test
from tiny_models import write_tiny_model

from edgeinfer.errors import ModelFault
from edgeinfer.server.errors import ApiError
from edgeinfer.server.security import (
    AccessPolicy,
    host_name,
    key_matches,
    path_redactor,
    public_error,
    request_key,
)

KEY = {"Authorization": "Bearer secret1"}
FOREVER = {"prompt": "Go on forever", "n_predict": -1, "ignore_eos": True, "temperature": 0}


class KeyedServer(ServerProcess):
    """The harness's server, reading /slots with the key."""

    def slots(self) -> list[dict]:
        return httpx.get(self.url + "/slots", headers=KEY, timeout=10).json()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    model = write_tiny_model(tmp_path_factory.mktemp("safety") / "tiny.gguf")
    srv = KeyedServer(model, "-np", "2", "-c", "512", "--metrics", "--api-key",
                        "secret1,secret2", "--allowed-hosts", "llm.lan")
    srv.model = model
    yield srv
    srv.stop()


@pytest.fixture
def server(shared_server):
    yield from idle_around_test(shared_server)


def get(server, path, **headers):
    return httpx.get(server.url + path, headers=headers, timeout=30)


def assert_error(r: httpx.Response, status: int, type_: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert (error["code"], error["type"]) == (status, type_)
    return error


def cors_headers(r: httpx.Response) -> dict:
    return {k: v for k, v in r.headers.items() if k.startswith("access-control-")}


# -- Host (DNS rebinding) --------------------------------------------------------------------
@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "evil.example.",
                                  "localhost.evil.example", "127.0.0.1.nip.io"])
def test_foreign_host_is_refused(server, host):
    error = assert_error(get(server, "/health", Host=host), 403, "permission_error")
    assert "--allowed-hosts" in error["message"]


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:1234", "127.0.0.1", "[::1]:8080",
                                  "10.1.2.3:8080", "app.localhost", "llm.lan", "llm.lan:80"])
def test_local_hosts_and_allowed_names_are_served(server, host):
    assert get(server, "/health", Host=host).json() == {"status": "ok"}


# -- CORS ------------------------------------------------------------------------------------
def test_no_cors_headers_without_an_origin(server):
    assert cors_headers(get(server, "/health")) == {}


def test_localhost_origins_are_allowed_by_default(server):
    for origin in ("http://localhost:5173", "http://127.0.0.1", "https://[::1]:8443"):
        r = get(server, "/props", Origin=origin, **KEY)
        assert r.status_code == 200
        assert cors_headers(r) == {"access-control-allow-origin": origin}
        assert r.headers["vary"] == "Origin"
    # an error reply to an allowed origin is readable by the page, still without credentials
    r = get(server, "/props", Origin="http://localhost:5173")
    assert_error(r, 401, "authentication_error")
    assert cors_headers(r) == {"access-control-allow-origin": "http://localhost:5173"}


@pytest.mark.parametrize("origin", ["https://evil.example", "http://localhost.evil.example",
                                    "null", "http://127.0.0.2"])
def test_other_origins_are_refused_without_cors_headers(server, origin):
    for r in (get(server, "/health", Origin=origin),
              get(server, "/props", Origin=origin),  # no key: still 403, not a 401 to read
              httpx.post(server.url + "/completion", json={"prompt": "x", "n_predict": 1},
                         headers={"Origin": origin, **KEY}, timeout=30)):
        error = assert_error(r, 403, "permission_error")
        assert "--cors-origins" in error["message"]
        assert cors_headers(r) == {}


def test_preflight(server):
    ask = {"Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization,content-type"}
    r = httpx.options(server.url + "/v1/chat/completions",
                      headers={"Origin": "http://localhost:3000", **ask}, timeout=30)
    assert r.status_code == 200  # answered before the key check: browsers send no key here
    headers = cors_headers(r)
    assert headers["access-control-allow-origin"] == "http://localhost:3000"
    assert headers["access-control-allow-headers"] == "authorization,content-type"
    assert "POST" in headers["access-control-allow-methods"]
    assert "access-control-allow-credentials" not in headers
    r = httpx.options(server.url + "/v1/chat/completions",
                      headers={"Origin": "https://evil.example", **ask}, timeout=30)
    assert_error(r, 403, "permission_error")
    assert cors_headers(r) == {}


def test_cors_origins_flag(tmp_path):
    model = write_tiny_model(tmp_path / "tiny.gguf")
    srv = ServerProcess(model, "--cors-origins", "https://app.example, http://tool.example:81")
    try:
        r = get(srv, "/health", Origin="https://app.example")
        assert cors_headers(r) == {"access-control-allow-origin": "https://app.example"}
        assert get(srv, "/health", Origin="http://tool.example:81").status_code == 200
        assert_error(get(srv, "/health", Origin="http://tool.example"), 403, "permission_error")
        # localhost is only a default: a list without it refuses localhost pages
        assert_error(get(srv, "/health", Origin="http://localhost:3000"), 403,
                     "permission_error")
        # a page this server served (the chat page) is same-origin: let through, no CORS
        r = get(srv, "/health", Origin=srv.url)
        assert r.status_code == 200 and cors_headers(r) == {}
    finally:
        srv.stop()


def test_origin_policy():
    anyone = AccessPolicy(cors_origins="*")
    assert anyone.origin_allowed("https://evil.example")
    assert anyone.allow_origin_value("https://evil.example") == "*"  # never an echo
    mixed = AccessPolicy(cors_origins="localhost,https://App.Example/")
    assert mixed.origin_allowed("https://app.example")
    assert mixed.allow_origin_value("https://app.example") == "https://app.example"
    assert mixed.origin_allowed("http://localhost:1")
    assert not mixed.origin_allowed("https://app.example.evil")
    assert not mixed.origin_allowed("http://[::1")  # unparsable


def test_same_origin_requests():
    """The chat page reached by a network address sends an Origin --cors-origins does not
    list; it is same-origin, unless --allowed-hosts * makes the Host meaningless."""
    policy = AccessPolicy("https://app.example", "", "0.0.0.0")
    assert not policy.origin_allowed("http://192.168.1.5:8080")
    assert policy.same_origin("http://192.168.1.5:8080", "192.168.1.5:8080")
    assert policy.same_origin("https://[fe80::1]", "[FE80::1]")
    assert not policy.same_origin("http://192.168.1.5:8081", "192.168.1.5:8080")
    assert not policy.same_origin("http://evil.example", "192.168.1.5:8080")
    assert not policy.same_origin("null", "null")
    assert not policy.same_origin("http://192.168.1.5", None)
    assert not AccessPolicy("localhost", "*").same_origin("http://any.example", "any.example")


def test_host_policy():
    assert host_name("[::1]:80") == "::1" and host_name("Example.COM.:1") == "example.com"
    policy = AccessPolicy(allowed_hosts="a.lan", bound_host="myhost.example")
    assert policy.host_allowed("myhost.example:8080") and policy.host_allowed("a.lan")
    assert policy.host_allowed(None)  # HTTP/1.0 without Host: not a browser
    assert not policy.host_allowed("b.lan")
    assert AccessPolicy(allowed_hosts="*").host_allowed("anything.example")


# -- model paths -----------------------------------------------------------------------------
def test_no_reply_shows_the_model_path(server):
    folder = str(Path(server.model).parent)
    replies = [get(server, path, **KEY) for path in
               ("/v1/models", "/models", "/props", "/health", "/metrics", "/slots")]
    replies.append(get(server, "/v1/models"))  # public: no key
    replies.append(httpx.post(server.url + "/completion", json={"prompt": "x", "n_predict": 1},
                              headers=KEY, timeout=30))
    replies.append(httpx.post(server.url + "/completion", json={"prompt": 5}, headers=KEY,
                              timeout=30))
    for r in replies:
        assert folder not in r.text, r.request.url
    models = get(server, "/v1/models").json()
    assert models["data"][0]["id"] == "tiny.gguf"
    assert get(server, "/props", **KEY).json()["model_path"] == "tiny.gguf"


def test_errors_are_redacted(tmp_path):
    model = tmp_path / "models" / "m.gguf"
    redact = path_redactor(model)
    exc = public_error(ModelFault(f"cannot read {model}: truncated"), redact)
    assert isinstance(exc, ModelFault) and str(exc) == "cannot read m.gguf: truncated"
    exc = public_error(ApiError(400, f"bad file in {model.parent}"), redact)
    assert isinstance(exc, ApiError) and str(tmp_path) not in exc.message
    exc = public_error(KeyError(str(model)), redact)
    assert isinstance(exc, ApiError) and exc.status == 500 and str(tmp_path) not in exc.message
    plain = ValueError("nothing private")
    assert public_error(plain, redact) is plain


# -- API key ---------------------------------------------------------------------------------
@pytest.mark.parametrize("headers", [
    {"Authorization": "Bearer secret1"}, {"Authorization": "Bearer secret2"},
    {"X-Api-Key": "secret1"}])
def test_key_forms_accepted(server, headers):
    assert get(server, "/props", **headers).status_code == 200


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "secret1"}, {"Authorization": "bearer secret1"},
    {"Authorization": "Bearer"}, {"Authorization": "Bearer  secret1"},
    {"Authorization": "Basic c2VjcmV0MQ=="}, {"Authorization": "Bearer secret"},
    {"Authorization": "Bearer secret1,secret2"},
    {"Authorization": "Bearer wrong", "X-Api-Key": "secret1"},  # Authorization is read first
    {"X-Api-Key": "Bearer secret1"}])
def test_key_forms_refused(server, headers):
    r = get(server, "/props", **headers)
    assert_error(r, 401, "authentication_error")
    assert r.json()["error"]["message"] == "Invalid API Key"


def test_key_functions():
    assert request_key({"authorization": "Bearer k"}) == "k"
    assert request_key({"authorization": "k"}) is None
    assert request_key({"x-api-key": "k"}) == "k"
    assert request_key({}) is None
    assert key_matches(("a", "bb"), "bb") and not key_matches(("a", "bb"), "b")
    assert not key_matches(("a",), None) and not key_matches((), "a")
    assert not key_matches(("a",), "\udcff")  # a lone surrogate is a wrong key, not an error


# -- SIGTERM ---------------------------------------------------------------------------------
def stream_lines(url: str, body: dict, lines: list, first: threading.Event) -> None:
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as r:
        for line in r.iter_lines():
            lines.append(line)
            if line.startswith("data: "):
                first.set()


def data_events(lines: list[str]) -> list:
    return [json.loads(x[6:]) if x != "data: [DONE]" else "[DONE]"
            for x in lines if x.startswith("data: ")]


def test_sigterm_ends_a_long_stream_and_refuses_the_rest(tmp_path):
    """One slot: a stream that would run for many seconds holds it and a second request waits
    for it. SIGTERM: the waiting request and new ones get 503, the stream its grace second and
    then a final error event; the process exits 0, soon."""
    model = write_tiny_model(tmp_path / "long.gguf", n_ctx_train=16384)
    srv = ServerProcess(model, "-np", "1", "-c", "16384", "--shutdown-timeout", "1",
                        "--metrics")
    try:
        lines, first = [], threading.Event()
        streamer = threading.Thread(target=stream_lines,
                                    args=(srv.url + "/v1/completions", FOREVER, lines, first))
        streamer.start()
        assert first.wait(60), srv.log_tail()
        queued: list[httpx.Response] = []
        waiter = threading.Thread(target=lambda: queued.append(httpx.post(
            srv.url + "/completion", json={"prompt": "next", "n_predict": 4}, timeout=60)))
        waiter.start()
        srv.poll("the second request to wait for the slot",
                 lambda: "llamacpp:requests_deferred 1" in get(srv, "/metrics").text, 30)
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        srv.poll("new requests refused with 503",
                 lambda: get(srv, "/health").status_code == 503, 5)
        assert_error(get(srv, "/health"), 503, "unavailable_error")
        waiter.join(30)
        assert_error(queued[0], 503, "unavailable_error")
        assert srv.proc.wait(30) == 0
        elapsed = time.monotonic() - t0
        streamer.join(30)
        assert 0.9 < elapsed < 10, elapsed
        last = data_events(lines)[-1]
        assert last["error"]["code"] == 503 and last["error"]["type"] == "unavailable_error"
        assert "shutting down" in last["error"]["message"]
        assert "Traceback" not in srv.log_text()
    finally:
        srv.stop()


def test_sigterm_lets_a_running_request_finish(tmp_path):
    """A request that ends within the grace period finishes normally; the process exits as
    soon as it is done, not at the deadline."""
    model = write_tiny_model(tmp_path / "tiny.gguf", n_ctx_train=2048)
    srv = ServerProcess(model, "-np", "1", "-c", "2048", "--shutdown-timeout", "60")
    try:
        lines, first = [], threading.Event()
        body = {**FOREVER, "n_predict": 600}
        streamer = threading.Thread(target=stream_lines,
                                    args=(srv.url + "/v1/completions", body, lines, first))
        streamer.start()
        assert first.wait(60), srv.log_tail()
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(30) == 0
        assert time.monotonic() - t0 < 30
        streamer.join(30)
        events = data_events(lines)
        assert events[-1] == "[DONE]", events[-2:]
        assert events[-2]["choices"][0]["finish_reason"] == "length"
    finally:
        srv.stop()


def test_sigterm_when_idle_exits_0_at_once(tmp_path):
    srv = ServerProcess(write_tiny_model(tmp_path / "tiny.gguf"))
    try:
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(15) == 0
        assert time.monotonic() - t0 < 10
    finally:
        srv.stop()
