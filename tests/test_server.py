"""`edgeinfer serve` over a real socket: the openai client, llama-server's native routes, SSE
framing, errors, continuous batching (greedy identity) and prefix reuse, on a tiny model.

Most tests share one server (start-up costs seconds); the `server` fixture hands it over idle
and checks it is idle again after the test. Its KV cache and counters carry over from test to
test, so no test here expects a cold cache (it sends `cache_prompt: false` instead) or a
counter's total (gauges are read over the window since the scrape the test made itself).
"""

from __future__ import annotations

import json
import re
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from test_server_harness import ServerProcess, idle_around_test
from tiny_models import write_tiny_model

GREEDY = {"temperature": 0, "seed": 1}


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    model = write_tiny_model(tmp_path_factory.mktemp("srv") / "tiny.gguf")
    srv = ServerProcess(model, "-np", "4", "-c", "512", "--metrics", "-a", "tiny")
    yield srv
    srv.stop()


@pytest.fixture
def server(shared_server):
    yield from idle_around_test(shared_server)


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="sk-no-key-required")


@pytest.fixture(scope="module")
def shared_long_server(tmp_path_factory):
    """Two slots of 8192 tokens: a generation to the end of the context runs far longer than
    any test waits, so it ends only when the test cancels it."""
    model = write_tiny_model(tmp_path_factory.mktemp("long") / "tiny.gguf", n_ctx_train=8192)
    srv = ServerProcess(model, "-np", "2", "-c", "8192")
    yield srv
    srv.stop()


@pytest.fixture
def long_server(shared_long_server):
    yield from idle_around_test(shared_long_server)


def post(server, path, body, **kw):
    return httpx.post(server.url + path, json=body, timeout=60, **kw)


def sse_events(lines):
    """`data:` payloads of an SSE body (comments and blank lines skipped)."""
    return [line[len("data: "):] for line in lines if line.startswith("data: ")]


# -- basic routes --------------------------------------------------------------------------
def test_health_models_props(server, client):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert httpx.get(server.url + "/models").json()["data"][0]["id"] == "tiny"
    props = httpx.get(server.url + "/props").json()
    assert props["total_slots"] == 4
    assert props["default_generation_settings"]["n_ctx"] == 512
    assert props["default_generation_settings"]["params"]["seed"] == 4294967295
    assert "<|im_start|>" in props["chat_template"]


def test_tokenize_detokenize_apply_template(server):
    tokens = post(server, "/tokenize", {"content": "<|im_start|>hello"}).json()["tokens"]
    assert tokens[0] == 1  # special text parsed by default
    assert post(server, "/detokenize", {"tokens": tokens}).json()["content"] == \
        "<|im_start|>hello"
    pieces = post(server, "/tokenize", {"content": "hi", "with_pieces": True}).json()["tokens"]
    assert "".join(p["piece"] for p in pieces) == "hi"
    prompt = post(server, "/apply-template",
                  {"messages": [{"role": "user", "content": "hi"}]}).json()["prompt"]
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


# -- openai client -------------------------------------------------------------------------
def test_openai_chat(client):
    reply = client.chat.completions.create(
        model="anything", messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
        temperature=0)
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert reply.model == "tiny"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_openai_chat_stream_matches_non_stream(client):
    messages = [{"role": "user", "content": "Tell me"}]
    full = client.chat.completions.create(model="m", messages=messages, max_tokens=12,
                                          temperature=0)
    chunks = list(client.chat.completions.create(
        model="m", messages=messages, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        full.usage.completion_tokens


def test_openai_completions(client):
    reply = client.completions.create(model="m", prompt="The sky is", max_tokens=6,
                                      temperature=0)
    assert reply.object == "text_completion"
    assert reply.usage.completion_tokens <= 6
    streamed = client.completions.create(model="m", prompt="The sky is", max_tokens=6,
                                         temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == reply.choices[0].text


def test_chat_sse_framing(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
            **GREEDY}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = sse_events(raw.split("\n"))
    first = json.loads(events[0])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None}
    last = json.loads(events[-2])
    assert last["choices"][0]["finish_reason"] and "timings" in last


def test_chat_logprobs(client):
    reply = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], max_tokens=3, temperature=0,
        logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens or len(content) >= 1
    assert len(content[0].top_logprobs) == 3
    assert content[0].logprob == pytest.approx(content[0].top_logprobs[0].logprob)  # greedy


# -- native /completion --------------------------------------------------------------------
def test_native_completion_fields(server):
    r = post(server, "/completion", {"prompt": "Once upon", "n_predict": 5, "n_probs": 2,
                                     "return_tokens": True, **GREEDY}).json()
    assert r["stop"] is True and r["stop_type"] in ("eos", "limit")
    assert r["tokens_predicted"] == len(r["tokens"]) <= 5
    assert r["tokens_evaluated"] == r["timings"]["prompt_n"] + r["timings"]["cache_n"]
    assert len(r["completion_probabilities"]) == r["tokens_predicted"]
    assert len(r["completion_probabilities"][0]["top_logprobs"]) == 2
    assert r["generation_settings"]["temperature"] == 0


def test_native_stream_has_no_done(server):
    body = {"prompt": "abc", "n_predict": 4, "stream": True, **GREEDY}
    with httpx.stream("POST", server.url + "/completion", json=body) as r:
        events = sse_events(r.read().decode().split("\n"))
    assert "[DONE]" not in events
    chunks = [json.loads(e) for e in events]
    assert all(c["stop"] is False for c in chunks[:-1])
    assert chunks[-1]["stop"] is True and "timings" in chunks[-1]
    full = post(server, "/completion", {"prompt": "abc", "n_predict": 4, **GREEDY}).json()
    assert "".join(c["content"] for c in chunks) == full["content"]


def test_timings_per_token(server):
    body = {"prompt": "abc", "n_predict": 3, "stream": True, "timings_per_token": True,
            **GREEDY}
    with httpx.stream("POST", server.url + "/completion", json=body) as r:
        chunks = [json.loads(e) for e in sse_events(r.read().decode().split("\n"))]
    assert all("timings" in c for c in chunks)
    assert [c["timings"]["predicted_n"] for c in chunks[:-1]] == \
        list(range(1, len(chunks)))


def test_stop_string(server):
    base = post(server, "/completion", {"prompt": "Hello", "n_predict": 12, **GREEDY}).json()
    text = base["content"]
    if len(text) < 4:
        pytest.skip("the random model stopped too early")
    stop = text[2:4]
    r = post(server, "/completion", {"prompt": "Hello", "n_predict": 12, "stop": [stop],
                                     **GREEDY}).json()
    assert r["stop_type"] == "word" and r["stopping_word"] == stop
    assert r["content"] == text[: text.find(stop)]


def test_seeded_sampling_is_reproducible(server):
    body = {"prompt": "Hi", "n_predict": 10, "temperature": 1.0, "seed": 42}
    a = post(server, "/completion", body).json()["content"]
    assert post(server, "/completion", body).json()["content"] == a


# -- continuous batching and prefix reuse --------------------------------------------------
PROMPTS = ["The quick brown fox", "Once upon a time", "In the beginning", "Hello world",
           "A B C D E F", "Numbers: 1 2 3"]


def stream_chat(client, prompt, n=24):
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": prompt}], max_tokens=n,
        temperature=0, stream=True, extra_body={"cache_prompt": False})
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def metric(server, name: str) -> float:
    """One value of /metrics; a gauge covers the window since the previous scrape."""
    text = httpx.get(server.url + "/metrics").text
    values = [float(line.split()[1]) for line in text.splitlines()
              if line.startswith(f"llamacpp:{name} ")]
    assert len(values) == 1, text
    return values[0]


def test_concurrent_greedy_matches_alone(client):
    alone = [stream_chat(client, p) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # more requests than slots: some wait
        together = list(pool.map(lambda p: stream_chat(client, p), PROMPTS))
    assert together == alone


def test_prompts_of_one_request_share_forward_passes(server):
    """The prompts of one /completion request reach the engine together, so (unlike separate
    requests, whose overlap depends on timing) they are decoded in the same forward passes,
    each to the tokens it gives alone."""
    prompts = PROMPTS[:4]
    body = {"n_predict": 16, "ignore_eos": True, "cache_prompt": False, **GREEDY}
    alone = [post(server, "/completion", {**body, "prompt": p}).json()["content"]
             for p in prompts]
    metric(server, "n_busy_slots_per_decode")  # opens the window
    together = post(server, "/completion", {**body, "prompt": prompts}).json()
    assert metric(server, "n_busy_slots_per_decode") > 1.0
    assert [r["content"] for r in together] == alone


def test_prefix_reuse_in_timings(server):
    history = [{"role": "system", "content": "You are a helpful assistant. " * 8},
               {"role": "user", "content": "First question?"}]
    first = post(server, "/v1/chat/completions",
                 {"messages": history, "max_tokens": 4, **GREEDY}).json()
    history += [first["choices"][0]["message"], {"role": "user", "content": "And then?"}]
    second = post(server, "/v1/chat/completions",
                  {"messages": history, "max_tokens": 4, **GREEDY}).json()
    cached = second["timings"]["cache_n"]
    assert cached >= first["usage"]["prompt_tokens"] - 2
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
    assert second["timings"]["prompt_n"] == second["usage"]["prompt_tokens"] - cached


def test_prefix_shared_across_slots_gives_same_tokens(server):
    prefix = "Shared context " * 10
    body = {"prompt": prefix + "tail one", "n_predict": 8, **GREEDY}
    cold = post(server, "/completion", {**body, "cache_prompt": False}).json()
    post(server, "/completion", {"prompt": prefix + "other", "n_predict": 2, **GREEDY})
    warm = post(server, "/completion", body).json()
    assert warm["timings"]["cache_n"] > 10
    assert warm["content"] == cold["content"]


def test_cache_prompt_false_evaluates_everything(server):
    body = {"prompt": "Repeat me please", "n_predict": 2, **GREEDY}
    post(server, "/completion", body)
    r = post(server, "/completion", {**body, "cache_prompt": False}).json()
    assert r["timings"]["cache_n"] == 0


# -- errors --------------------------------------------------------------------------------
def error_of(response, status, type_):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and error["type"] == type_ and error["message"]
    return error


def test_malformed_json_is_400(server):
    r = httpx.post(server.url + "/v1/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    error_of(r, 400, "invalid_request_error")


@pytest.mark.parametrize("body", [
    {"messages": "hi"},
    {"messages": [{"role": "user"}]},  # llama-server: non-assistant messages need content
    {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a"},
                  {"role": "assistant", "content": "b"}]},  # two trailing assistant turns
    {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
    {"messages": [{"role": "user", "content": "x"}], "max_tokens": -5},
    {"messages": [{"role": "user", "content": "x"}], "stop": 3},
    {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
    {"messages": [{"role": "user", "content": "x"}], "n": 5},
    {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}},
    {"messages": [{"role": "user", "content": "x"}],  # found by tests/test_server_fuzz.py
     "response_format": {"type": "text", "schema": 0.0}},
])
def test_bad_fields_are_400(server, body):
    error_of(post(server, "/v1/chat/completions", body), 400, "invalid_request_error")


def test_bad_native_fields_are_400(server):
    error_of(post(server, "/completion", {}), 400, "invalid_request_error")
    error_of(post(server, "/completion", {"prompt": [1, 99999]}), 400, "invalid_request_error")
    error_of(post(server, "/v1/completions", {"prompt": "x", "echo": True}), 400,
             "invalid_request_error")


def test_prompt_too_long_is_400_with_sizes(server, client):
    long = "hello " * 600
    error = error_of(post(server, "/completion", {"prompt": long}), 400,
                     "exceed_context_size_error")
    assert error["n_ctx"] == 512 and error["n_prompt_tokens"] >= 512
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": long}],
                                       stream=True)


def test_unknown_route_is_404(server):
    error_of(httpx.get(server.url + "/v2/nothing"), 404, "not_found_error")
    error_of(httpx.post(server.url + "/health"), 404, "not_found_error")


def test_metrics_format(server):
    """llama-server's names, in its order, each with HELP and TYPE; the header in its case
    (raw bytes: clients that copy headers into a dict look it up so)."""
    r = httpx.get(server.url + "/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    assert b"Process-Start-Time-Unix" in [name for name, _ in r.headers.raw]
    names = [line.split()[2] for line in r.text.splitlines()
             if line.startswith("# TYPE llamacpp:")]
    assert names == [f"llamacpp:{n}" for n in (
        "prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total",
        "tokens_predicted_total", "tokens_predicted_seconds_total", "n_decode_total",
        "n_tokens_max", "spec_decode_num_draft_tokens_total",
        "spec_decode_num_accepted_tokens_total", "spec_decode_num_drafts_total",
        "prompt_tokens_seconds", "predicted_tokens_seconds", "requests_processing",
        "requests_deferred", "n_busy_slots_per_decode")]
    for name in names:
        assert f"# HELP {name} " in r.text and f"\n{name} " in r.text
    # then edgeinfer's own: the shared KV pool (-c 512: eight blocks of 64)
    assert "\nedgeinfer:kv_cells_total 512\n" in r.text
    used, peak = (float(re.search(rf"\nedgeinfer:{n} (\S+)", r.text)[1])
                  for n in ("kv_cells_used", "kv_cells_peak"))
    assert 0 <= used <= peak <= 512


# -- disconnects and keep-alive ------------------------------------------------------------
# On the long server: what ends these generations is the cancel, never their length.
FOREVER = {"prompt": "Go on forever", "n_predict": -1, "ignore_eos": True, **GREEDY}


def assert_cancelled_and_serving(server, log_mark: int):
    """The generation started after `log_mark` was cancelled (the engine logs it), every slot
    is free again, the hang-up cost one log line and no traceback (#32), and the server
    still answers."""
    server.wait_idle()
    assert re.search(r"task \d+ cancelled after \d+ tokens", server.log_text(log_mark)), \
        server.log_tail()
    server.poll("the disconnect line", lambda: "client disconnected" in server.log_text(log_mark),
                30)
    log = server.log_text(log_mark)
    assert log.count("client disconnected") == 1 and "Traceback" not in log, log
    r = post(server, "/completion", {"prompt": "still there?", "n_predict": 2,
                                     "ignore_eos": True, **GREEDY})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 2


def test_disconnect_cancels_a_stream(long_server):
    mark = len(long_server.log_text())
    with httpx.stream("POST", long_server.url + "/completion",
                      json={**FOREVER, "stream": True}, timeout=60) as r:
        next(line for line in r.iter_lines() if line.startswith("data: "))
    assert_cancelled_and_serving(long_server, mark)


def test_disconnect_cancels_a_non_stream_request(long_server):
    """The client hangs up while its request is generating (a plain socket: closed once
    /slots shows the request running, not after a client timeout that may come first)."""
    mark = len(long_server.log_text())
    body = json.dumps(FOREVER).encode()
    head = (f"POST /completion HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    url = httpx.URL(long_server.url)
    with socket.create_connection((url.host, url.port), timeout=30) as sock:
        sock.sendall(head + body)
        long_server.wait_busy()
    assert_cancelled_and_serving(long_server, mark)


def test_keep_alive_pings(long_server):
    """A request waiting for its slot (pinned behind a generation there) has nothing to send:
    `:` comments keep the connection alive every sse_ping_interval (here its 1 s floor). The
    generation in the way is cancelled once a ping came, so the wait ends by the test's doing,
    not the model's speed."""
    url = long_server.url + "/completion"
    busy = {**FOREVER, "id_slot": 1, "stream": True}
    body = {"prompt": "word " * 20, "n_predict": 2, "stream": True, "sse_ping_interval": 1,
            "id_slot": 1, **GREEDY}
    generating, pinged = threading.Event(), threading.Event()

    def hold_the_slot():
        with httpx.stream("POST", url, json=busy, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    generating.set()
                if pinged.is_set():
                    return  # closing the stream cancels the generation
        raise AssertionError("the generation holding the slot ended by itself")

    with ThreadPoolExecutor(1) as pool:
        holder = pool.submit(hold_the_slot)
        assert generating.wait(60), f"no token came: {holder}\n{long_server.log_tail()}"
        lines = []
        with httpx.stream("POST", url, json=body, timeout=60) as r:
            for line in r.iter_lines():
                lines.append(line)
                if line == ":":
                    pinged.set()
        holder.result(timeout=60)
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data: "))
    assert ":" in lines[:first_data]  # pings while it waited for slot 1
    assert json.loads(sse_events(lines)[-1])["stop"] is True


# -- API key -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    model = write_tiny_model(tmp_path_factory.mktemp("key") / "tiny.gguf")
    srv = ServerProcess(model, "--api-key", "secret1,secret2")
    yield srv
    srv.stop()


def test_api_key(keyed_server):
    url = keyed_server.url
    body = {"prompt": "x", "n_predict": 1}
    error_of(httpx.post(url + "/completion", json=body), 401, "authentication_error")
    error_of(httpx.post(url + "/completion", json=body,
                        headers={"Authorization": "Bearer wrong"}), 401, "authentication_error")
    ok = httpx.post(url + "/completion", json=body, headers={"Authorization": "Bearer secret2"})
    assert ok.status_code == 200
    assert httpx.post(url + "/completion", json=body,
                      headers={"X-Api-Key": "secret1"}).status_code == 200
    assert httpx.get(url + "/health").status_code == 200  # public
    assert httpx.get(url + "/v1/models").status_code == 200  # public
    good = openai.OpenAI(base_url=url + "/v1", api_key="secret1")
    assert good.completions.create(model="m", prompt="x", max_tokens=1).choices
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="nope").completions.create(
            model="m", prompt="x", max_tokens=1)


def test_id_slot_pins_the_slot(server):
    r = post(server, "/completion", {"prompt": "pin me", "n_predict": 1, "id_slot": 2}).json()
    assert r["id_slot"] == 2
    error_of(post(server, "/completion", {"prompt": "x", "id_slot": 9}), 400,
             "invalid_request_error")


def test_context_full_stops_with_truncated(server):
    r = post(server, "/completion", {"prompt": [100] * 511, "n_predict": 10,
                                     "ignore_eos": True, **GREEDY}).json()
    # positions 0..510 hold the prompt, 511 the first generated token; the second ends it
    assert (r["tokens_predicted"], r["stop_type"], r["truncated"]) == (2, "limit", True)
    error_of(post(server, "/completion", {"prompt": [100] * 512}), 400,
             "exceed_context_size_error")


def test_n_predict_zero_only_evaluates_the_prompt(server):
    r = post(server, "/completion", {"prompt": "just the prompt", "n_predict": 0}).json()
    assert r["content"] == "" and r["tokens_predicted"] == 0 and r["stop_type"] == "limit"
    assert r["timings"]["prompt_n"] + r["timings"]["cache_n"] == r["tokens_evaluated"]


@pytest.mark.parametrize("cache_ram", ["64", "0"])
def test_prompt_cache_in_ram_outlives_its_slot(tmp_path, cache_ram):
    """One slot and a KV pool of 256 cells: A, then B (which needs every block, so A's are
    evicted), then A again. With --cache-ram, A's KV was kept in RAM and comes back (nearly
    all of A is cached) with the same tokens as a cold run; with --cache-ram 0 only the
    prefix A shares with B is reused."""
    model = write_tiny_model(tmp_path / "tiny.gguf")
    srv = ServerProcess(model, "-np", "1", "-c", "256", "--cache-ram", cache_ram)
    try:
        a = {"prompt": "Alpha story " * 12, "n_predict": 8, **GREEDY}
        cold = post(srv, "/completion", {**a, "cache_prompt": False}).json()
        b = post(srv, "/completion", {"prompt": "Beta tale " * 22, "n_predict": 4, **GREEDY})
        assert b.json()["tokens_evaluated"] > 192  # four blocks of 64
        again = post(srv, "/completion", a).json()
    finally:
        srv.stop()
    n_prompt = again["tokens_evaluated"]
    if cache_ram == "0":
        assert again["timings"]["cache_n"] < n_prompt // 2
    else:
        assert again["timings"]["cache_n"] == n_prompt - 1
    assert again["content"] == cold["content"]


def test_flash_attention_flag_serves_the_flash_numerics(tmp_path):
    """`-fa on` reaches the model (the server says so once loaded) and serves the same greedy
    tokens as the Python API with flash_attn on."""
    from edgeinfer.api import Model

    model = write_tiny_model(tmp_path / "tiny.gguf")
    srv = ServerProcess(model, "-np", "2", "-c", "256", "-fa", "on")
    try:
        r = post(srv, "/completion", {"prompt": "Gamma note", "n_predict": 12, **GREEDY}).json()
        srv.log.flush()
        assert "flash attention on" in srv.log_path.read_text()
    finally:
        srv.stop()
    local = Model.load(model, n_ctx=256, flash_attn=True)
    expected = "".join(local.generate("Gamma note", max_tokens=12, temperature=0))
    assert r["tokens_predicted"] == 12 and r["content"] == expected


def test_servers_started_at_once_listen_on_their_own_ports(tmp_path):
    """Each server binds port 0 itself and names the port it got: two starting together
    cannot be handed the same one."""
    model = write_tiny_model(tmp_path / "tiny.gguf")
    with ThreadPoolExecutor(2) as pool:
        starts = [pool.submit(ServerProcess, model, "-np", "1", "-c", "128") for _ in range(2)]
    servers = [f.result() for f in starts if f.exception() is None]
    try:
        assert len(servers) == 2, [f.exception() for f in starts]
        assert servers[0].port != servers[1].port
        for srv in servers:
            assert f"listening on {srv.url} " in srv.log_text()
            r = post(srv, "/completion", {"prompt": "hi", "n_predict": 2, "ignore_eos": True})
            assert r.json()["tokens_predicted"] == 2
    finally:
        for srv in servers:
            srv.stop()
