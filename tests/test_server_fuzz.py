"""Schema-driven fuzz of `edgeinfer serve` over a real socket (issue 32; tests/http_fuzz.py):
`N_CASES` requests per operation and mode, derandomized, against one server on a tiny model.
Afterwards the server still answers and its log holds no traceback. scripts/fuzz_http.py
runs more cases with other seeds."""

from __future__ import annotations

import time

import httpx
import pytest
from test_server_harness import ServerProcess
from tiny_models import write_tiny_model

pytest.importorskip("schemathesis")
from http_fuzz import MODES, fuzz_operation, has_input, operations  # noqa: E402

N_CASES = 50  # per operation and mode: about 900 requests in all, ~20 s on 2 vCPUs


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = write_tiny_model(tmp_path_factory.mktemp("fuzz") / "tiny.gguf")
    srv = ServerProcess(model, "-np", "2", "-c", "256", "--metrics")
    yield srv
    srv.stop()


@pytest.mark.parametrize("mode", MODES)
def test_fuzz_every_operation(server, mode):
    ops = operations(server.url)
    paths = httpx.get(server.url + "/openapi.json", timeout=10).json()["paths"]
    assert len(ops) == len(paths) + 1  # every route, and POST /props
    start, counts = time.monotonic(), {}
    for operation in ops:
        if mode == "invalid" and not has_input(operation):
            continue  # nothing in the request can be made invalid
        counts[operation.label] = sum(fuzz_operation(server.url, operation, MODES[mode],
                                                     N_CASES).values())
    print(f"{mode}: {sum(counts.values())} requests in {time.monotonic() - start:.0f} s",
          counts)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    assert "Traceback" not in server.log_text(), server.log_tail()
