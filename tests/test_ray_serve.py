"""Scale-out on Ray Serve (edgeinfer/ray.py): a real local Ray cluster on 127.0.0.1, two
replicas of a tiny model behind Ray Serve's HTTP proxy, the openai client through it, and a
replica's process killed, then started again by Ray while requests keep being answered."""

from __future__ import annotations

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
    serve.run(build_app([model], ("-np", "2", "-c", "128", "-t", "1"), num_replicas=2,
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
        if any("ServeReplica:edgeinfer" in a for a in p.info["cmdline"] or ()):
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
