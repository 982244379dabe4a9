"""Server options that llama-server has, over a real socket on a tiny model: sleeping when
idle, --no-slots, alias lists and tags, several listening addresses, the request defaults
(--seed, --temp, -n, --verbose) and --kv-unified's idle slots."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from test_server_harness import ServerProcess
from tiny_models import write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("options") / "tiny.gguf")


def get(srv, path):
    return httpx.get(srv.url + path, timeout=60)


def post(srv, path, body):
    return httpx.post(srv.url + path, json=body, timeout=60)


def wait_sleeping(srv, value: bool, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while get(srv, "/props").json()["is_sleeping"] != value:
        assert time.monotonic() < deadline, f"is_sleeping never became {value}"
        time.sleep(0.1)


def test_sleep_unloads_and_wakes_with_the_same_answers(tiny):
    srv = ServerProcess(tiny, "-np", "1", "-c", "256", "--sleep-idle-seconds", "1",
                        "--metrics")
    try:
        body = {"prompt": "hello world", "n_predict": 6, "temperature": 0}
        before = post(srv, "/completion", body).json()
        wait_sleeping(srv, True)
        assert "sleeping: the model was unloaded" in srv.log_text()
        # what answers from the snapshot does not wake it
        for path in ("/health", "/props", "/models", "/metrics"):
            assert get(srv, path).status_code == 200
        assert get(srv, "/props").json()["is_sleeping"] is True
        tokens = post(srv, "/tokenize", {"content": "hello"})  # needs the model: wakes it
        assert tokens.status_code == 200 and tokens.json()["tokens"]
        assert get(srv, "/props").json()["is_sleeping"] is False
        wait_sleeping(srv, True)
        after = post(srv, "/completion", body).json()
        assert after["content"] == before["content"]
        assert after["timings"]["cache_n"] == 0  # the KV cache went with the model
    finally:
        srv.stop()


def test_no_slots_alias_list_tags_and_request_defaults(tiny):
    srv = ServerProcess(tiny, "-np", "2", "-c", "256", "--no-slots", "--alias", "zeta,alpha",
                        "--tags", "chat,small", "--seed", "42", "--temp", "0", "-n", "3",
                        "--verbose")
    try:
        r = get(srv, "/slots")
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
        entry = get(srv, "/models").json()["data"][0]
        assert entry["id"] == "alpha"  # the first in sorted order, as llama-server's std::set
        assert (entry["aliases"], entry["tags"]) == (["alpha", "zeta"], ["chat", "small"])
        props = get(srv, "/props").json()
        assert props["default_generation_settings"]["params"]["seed"] == 42
        assert props["model_alias"] == "alpha"
        reply = post(srv, "/completion", {"prompt": "hello"}).json()
        assert reply["tokens_predicted"] == 3  # -n is the default of n_predict
        assert reply["generation_settings"]["temperature"] == 0
        chat = post(srv, "/v1/chat/completions",
                    {"messages": [{"role": "user", "content": "hi"}]}).json()
        assert "__verbose" in chat  # --verbose: every reply carries the native one
    finally:
        srv.stop()


def _has_ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6(), reason="no IPv6 loopback")
def test_several_addresses_on_one_port(tiny):
    srv = ServerProcess(tiny, "-np", "1", "-c", "256", "--host", "127.0.0.1,::1")
    try:
        for host in ("127.0.0.1", "[::1]"):
            r = httpx.get(f"http://{host}:{srv.port}/health", timeout=10)
            assert r.status_code == 200
    finally:
        srv.stop()


def test_kv_unified_moves_idle_slots_to_the_ram_cache(tiny):
    srv = ServerProcess(tiny, "-np", "2", "-c", "512", "--kv-unified", "--verbose")
    try:
        long_prompt = "hello world " * 20
        first = post(srv, "/completion", {"prompt": long_prompt, "n_predict": 2, "id_slot": 0,
                                          "temperature": 0}).json()
        post(srv, "/completion", {"prompt": "bye", "n_predict": 2, "id_slot": 1})
        assert "slot 0: idle slot saved to the RAM cache" in srv.log_text()
        again = post(srv, "/completion", {"prompt": long_prompt, "n_predict": 2,
                                          "temperature": 0}).json()
        assert again["timings"]["cache_n"] > 0  # restored from RAM, not prefilled again
        assert again["content"] == first["content"]
    finally:
        srv.stop()
