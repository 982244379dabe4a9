"""Router mode (`serve --models-dir DIR`) over real sockets with the openai client: models
loaded on demand in their own processes, the least recently used unloaded past
--models-max, keep_alive, a crashed worker started again, unknown models a 404."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from test_server_harness import ServerProcess
from tiny_models import write_tiny_model

GREEDY = {"temperature": 0, "max_tokens": 4}
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    for name, seed in (("alpha", 0), ("beta", 1)):
        write_tiny_model(folder / f"{name}.gguf", seed=seed)
    cache = tmp_path_factory.mktemp("cache")  # no pulled models in the catalogue
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(cache))
    srv = ServerProcess(Path(f"--models-dir={folder}"), "--models-max", "1", "-c", "128",
                        "-np", "2")
    mp.undo()
    yield srv
    srv.stop()


def statuses(srv) -> dict[str, str]:
    data = httpx.get(srv.url + "/v1/models").json()["data"]
    return {m["id"]: m["status"]["value"] for m in data}


def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)


def worker_of(srv, name: str) -> psutil.Process:
    (proc,) = [p for p in psutil.Process(srv.proc.pid).children()
               if any(a.endswith(f"{name}.gguf") for a in p.cmdline())]
    return proc


def test_models_load_on_demand_and_the_oldest_makes_room(router):
    assert statuses(router) == {"alpha": "unloaded", "beta": "unloaded"}
    c = client(router)
    a = c.chat.completions.create(model="alpha", messages=HELLO, **GREEDY)
    assert a.choices[0].message.content and statuses(router)["alpha"] == "loaded"
    b = c.chat.completions.create(model="beta", messages=HELLO, **GREEDY)
    assert b.choices[0].message.content
    assert statuses(router) == {"alpha": "unloaded", "beta": "loaded"}  # --models-max 1
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in
                       c.chat.completions.create(model="beta", messages=HELLO, stream=True,
                                                 **GREEDY) if chunk.choices)
    assert streamed == b.choices[0].message.content  # SSE through the router


def test_unknown_model_is_a_404_listing_the_models(router):
    with pytest.raises(openai.NotFoundError) as err:
        client(router).chat.completions.create(model="gamma", messages=HELLO, **GREEDY)
    assert err.value.body["message"] == "model 'gamma' not found; available: alpha, beta"


def test_load_and_unload_routes(router):
    r = httpx.post(router.url + "/models/load", json={"model": "alpha"}, timeout=120)
    assert r.json() == {"success": True} and statuses(router)["alpha"] == "loaded"
    r = httpx.post(router.url + "/models/unload", json={"model": "alpha"}, timeout=60)
    assert r.json() == {"success": True} and statuses(router)["alpha"] == "unloaded"


def test_a_crashed_worker_is_started_again(router):
    c = client(router)
    c.chat.completions.create(model="beta", messages=HELLO, **GREEDY)
    worker_of(router, "beta").kill()
    time.sleep(0.5)
    with pytest.raises(openai.APIStatusError) as err:  # at once: 503, restarting soon
        c.chat.completions.create(model="beta", messages=HELLO, **GREEDY)
    assert err.value.status_code == 503 and "restarting" in err.value.body["message"]
    time.sleep(1.5)  # the first back-off
    again = c.chat.completions.create(model="beta", messages=HELLO, **GREEDY)
    assert again.choices[0].message.content and statuses(router)["beta"] == "loaded"


def test_keep_alive_zero_unloads_after_the_request(router):
    r = httpx.post(router.url + "/completion", timeout=120, json={
        "model": "alpha", "prompt": "hi", "n_predict": 2, "keep_alive": 0})
    assert r.status_code == 200 and r.json()["content"] is not None
    deadline = time.monotonic() + 10
    while statuses(router)["alpha"] != "unloaded" and time.monotonic() < deadline:
        time.sleep(0.3)
    assert statuses(router)["alpha"] == "unloaded"
    bad = httpx.post(router.url + "/completion", json={"model": "alpha", "prompt": "hi",
                                                       "keep_alive": "soon"})
    assert bad.status_code == 400 and "keep_alive" in bad.json()["error"]["message"]


def test_workers_get_the_flags_but_the_routers_own():
    from edgeinfer.server.options import worker_args

    argv = ["--models-dir", "/m", "-c", "128", "--port=0", "--host", "0.0.0.0",
            "--models-max", "2", "-np", "1", "--keep-alive", "30", "--api-key", "k"]
    assert worker_args(argv) == ["-c", "128", "-np", "1", "--api-key", "k"]


def test_keep_alive_durations():
    from edgeinfer.server.errors import ApiError
    from edgeinfer.server.router.app import parse_keep_alive

    assert [parse_keep_alive(v) for v in (0, "30s", "5m", "1h", -1, "250ms")] == [
        0.0, 30.0, 300.0, 3600.0, -1.0, 0.25]
    for bad in ("soon", True, [1]):
        with pytest.raises(ApiError):
            parse_keep_alive(bad)


def test_run_through_the_router(router, tmp_path):
    """`edgeinfer run MODEL --host ROUTER`: the router picks the model by its file name."""
    import os
    import subprocess
    import sys

    (folder,) = {Path(a.split("=", 1)[1]) for a in router.proc.args
                 if str(a).startswith("--models-dir=")}

    def run(*args):
        return subprocess.run([sys.executable, "-m", "edgeinfer.cli", "run",
                               str(folder / "beta.gguf"), "-n", "4", "--temp", "0", "-p", "hi",
                               *args], capture_output=True, text=True, timeout=300,
                              env=dict(os.environ))

    remote, local = run("--host", router.url), run("--local")
    assert remote.returncode == local.returncode == 0, remote.stderr + local.stderr
    assert remote.stdout == local.stdout and remote.stdout


def test_host_and_origin_are_checked_at_the_router(router):
    """The DNS rebinding guard and the Origin rule apply at the router, and a page of the
    router's own address (here reached at a LAN address) is same-origin, though the worker
    behind it sees the router's loopback Host."""
    port = router.url.rsplit(":", 1)[1]

    def props(**headers):
        return httpx.get(router.url + "/props", params={"model": "alpha"}, headers=headers,
                         timeout=120)

    refused = props(Host="evil.example")
    assert refused.status_code == 403 and "DNS rebinding" in refused.json()["error"]["message"]
    assert props(Origin="http://evil.example").status_code == 403
    lan = f"192.168.1.5:{port}"
    same = props(Host=lan, Origin=f"http://{lan}")
    assert same.status_code == 200, same.text
    local = props(Origin="http://localhost:3000")  # llama-server's default: local origins
    assert local.status_code == 200
    assert local.headers["access-control-allow-origin"] == "http://localhost:3000"
