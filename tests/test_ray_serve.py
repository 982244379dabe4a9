"""Scale-out on Ray Serve (edgeinfer/ray/): a real local Ray cluster on 127.0.0.1, two
engine replicas of a tiny model behind Ray Serve's HTTP proxy and our ingress, the openai
client through it, conversations kept on one replica by their prompt prefix, and a
replica's process killed, then started again by Ray while requests keep being answered."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import openai
import pytest
from tiny_models import write_tiny_model

ray = pytest.importorskip("ray", reason="Ray Serve not installed (extra: ray)")
serve = pytest.importorskip("ray.serve")
HELLO = [{"role": "user", "content": "hello"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from edgeinfer.ray import build_app

    model = write_tiny_model(tmp_path_factory.mktemp("ray") / "tiny.gguf")
    port = free_port()
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             _node_ip_address="127.0.0.1", ignore_reinit_error=True,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}})
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app([model], ("-np", "2", "-c", "512", "-t", "1"), num_replicas=2,
                        num_cpus=0.5), route_prefix="/", name="edgeinfer")
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


def answer(url) -> str:
    r = client(url).chat.completions.create(model="tiny", messages=HELLO, temperature=0,
                                            max_tokens=4)
    return r.choices[0].message.content


def replica_pids() -> list[int]:
    """Ray titles a replica's process `ray::ServeReplica:APP:DEPLOYMENT`."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any("ServeReplica:edgeinfer:edgeinfer-engine" in a
               for a in p.info["cmdline"] or ()):
            found.append(p.pid)
    return found


def test_openai_client_through_ray_serve(cluster):
    first = answer(cluster)
    assert first and all(answer(cluster) == first for _ in range(3))  # greedy, any replica
    stream = client(cluster).chat.completions.create(model="tiny", messages=HELLO,
                                                     temperature=0, max_tokens=4, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == first
    models = client(cluster).models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_prefix_chain_links_whole_blocks():
    from edgeinfer.ray.routing import BLOCK, matched_links, prefix_chain

    def body(*turns):
        return json.dumps({"model": "tiny", "messages": [
            {"role": "user", "content": t} for t in turns]}).encode()

    one, two = prefix_chain(body("a" * 300)), prefix_chain(body("a" * 300, "b" * 300))
    assert len(one) == len("tiny\nuser: " + "a" * 300) // BLOCK
    assert two[:len(one)] == one and len(two) > len(one)  # a later turn extends the chain
    assert matched_links(two, set(one)) == len(one)
    assert prefix_chain(body("c" + "a" * 299))[0] != one[0]
    assert prefix_chain(b"not json") == () == prefix_chain(b"[1, 2]") == prefix_chain(b"")
    completion = prefix_chain(json.dumps({"prompt": "x" * 200}).encode())
    assert len(completion) == len("\n" + "x" * 200) // BLOCK


def test_a_conversation_stays_on_one_replica(cluster):
    """Each conversation's turns go where its first turn went (its prefix is cached there);
    different conversations spread over both replicas. (With Ray's default router, turns
    land on either replica.)"""
    first_replica = {}
    for turn in range(3):
        for conv in range(12):
            messages = [{"role": "system", "content": f"conversation {conv}: " + "x" * 70}]
            for t in range(turn + 1):
                messages += [{"role": "user", "content": f"question {t} " * 3},
                             {"role": "assistant", "content": "ok"}]
            raw = client(cluster).chat.completions.with_raw_response.create(
                model="tiny", messages=messages[:-1], temperature=0, max_tokens=1)
            replica = raw.headers["x-edgeinfer-replica"]
            assert raw.parse().choices[0].message.content is not None
            assert first_replica.setdefault(conv, replica) == replica, (conv, turn)
    assert len(set(first_replica.values())) == 2


def test_a_killed_replica_is_replaced(cluster):
    before = replica_pids()
    assert len(before) == 2
    expected = answer(cluster)
    os.kill(before[0], signal.SIGKILL)
    answered, deadline = 0, time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            assert answer(cluster) == expected
            answered += 1
        except (openai.APIError, openai.APIConnectionError):
            pass
        pids = replica_pids()
        if answered >= 3 and len(pids) == 2 and before[0] not in pids:
            break
        time.sleep(0.5)
    pids = replica_pids()
    assert answered >= 3 and len(pids) == 2 and before[0] not in pids
