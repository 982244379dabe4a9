"""Schema-driven fuzz of `edgeinfer serve` over a real socket (schemathesis): requests drawn
from the server's own /openapi.json, valid ones and invalid ones, for every operation. No
reply may be a 5xx; valid requests' replies must match their documented status, media type
and schema; invalid ones must be refused with a 4xx. Seeded (derandomized) and bounded:
`EXAMPLES` cases per operation and mode, generations capped at `MAX_TOKENS` tokens (`cap_lengths`)."""

from __future__ import annotations

import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from test_server_harness import ServerProcess
from tiny_models import write_tiny_model

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES = 25
MAX_TOKENS = 8
LENGTH_FIELDS = ("n_predict", "max_tokens", "max_completion_tokens")
CHECKS = {  # besides "no 5xx", checked first (schemathesis's not_a_server_error fails 501)
    GenerationMode.POSITIVE: [status_code_conformance, content_type_conformance,
                              response_schema_conformance],
    GenerationMode.NEGATIVE: [status_code_conformance, content_type_conformance,
                              negative_data_rejection],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = write_tiny_model(tmp_path_factory.mktemp("fuzz") / "tiny.gguf")
    srv = ServerProcess(model, "-np", "2", "-c", "256", "--metrics")
    yield srv
    srv.stop()


def cap_lengths(body) -> None:
    """Generation lengths valid but over MAX_TOKENS become MAX_TOKENS (an invalid one stays
    as it is, for the server to refuse); none at all means MAX_TOKENS too (absent, they
    mean "until the context fills")."""
    if not isinstance(body, dict):
        return
    for key in LENGTH_FIELDS:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and \
                MAX_TOKENS < value <= 2**31 - 1:
            body[key] = MAX_TOKENS
    if not any(key in body for key in LENGTH_FIELDS):
        body["n_predict"] = MAX_TOKENS


def fuzz(server, operation, mode) -> int:
    calls, documented = [], operation.definition.raw["responses"]

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case):
        cap_lengths(case.body)
        response = case.call(base_url=server.url, timeout=60)
        calls.append(response.status_code)
        status = response.status_code
        # 501: POST /props, /metrics without --metrics (llama-server's "not supported");
        # 503: /slots?fail_on_no_slot while both slots are busy
        assert status < 500 or (status == 501 and "501" in documented) or \
            (status == 503 and case.path == "/slots"), f"{status}: {response.text[:300]}"
        case.validate_response(response, checks=CHECKS[mode])

    run()
    return len(calls)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                         ids=["valid", "invalid"])
def test_fuzz_every_operation(server, mode):
    raw = httpx.get(server.url + "/openapi.json", timeout=10).json()
    schema = schemathesis.openapi.from_dict(raw)
    start, counts = time.monotonic(), {}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == len(raw["paths"]) + 1  # every route, POST /props too
    for operation in operations:
        definition = operation.definition.raw
        if mode == GenerationMode.NEGATIVE and not (
                definition.get("requestBody") or definition.get("parameters")):
            continue  # nothing in the request can be made invalid
        counts[operation.label] = fuzz(server, operation, mode)
    print(f"{mode.value}: {sum(counts.values())} requests in {time.monotonic() - start:.0f} s",
          counts)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
