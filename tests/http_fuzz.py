"""Schema-driven HTTP fuzz of `edgeinfer serve` (no tests here; tests/test_server_fuzz.py runs
it in CI, scripts/fuzz_http.py runs it longer).

schemathesis draws requests from the server's own /openapi.json, for every operation, in two
modes: valid requests (their replies must match the documented status, media type and
schema) and invalid ones (they must be refused with a 4xx). In both, no reply may be a 5xx
other than the documented 501 (POST /props, /metrics without --metrics) and 503 (/slots with
fail_on_no_slot while every slot is busy), and every request must be answered within
`TIMEOUT_S` (a hang fails the case). Generations are capped at `MAX_TOKENS` tokens
(`cap_lengths`), so a case costs milliseconds on the tiny model.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

MODES = {"valid": GenerationMode.POSITIVE, "invalid": GenerationMode.NEGATIVE}
MAX_TOKENS = 8
TIMEOUT_S = 60
LENGTH_FIELDS = ("n_predict", "max_tokens", "max_completion_tokens")
CHECKS = {  # besides "no 5xx" (schemathesis's own not_a_server_error would fail the 501s)
    GenerationMode.POSITIVE: [status_code_conformance, content_type_conformance,
                              response_schema_conformance],
    GenerationMode.NEGATIVE: [status_code_conformance, content_type_conformance,
                              negative_data_rejection],
}


def cap_lengths(body: Any) -> None:
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


def operations(url: str) -> list:
    """Every operation /openapi.json describes (each route, and POST /props)."""
    raw = httpx.get(url + "/openapi.json", timeout=10).json()
    return [result.ok() for result in schemathesis.openapi.from_dict(raw).get_all_operations()]


def has_input(operation) -> bool:
    """Whether the operation takes anything a request could get wrong."""
    definition = operation.definition.raw
    return bool(definition.get("requestBody") or definition.get("parameters"))


def fuzz_operation(url: str, operation, mode: GenerationMode, n_cases: int,
                   seed_value: int | None = None, refusals: Counter | None = None) -> Counter:
    """Send up to `n_cases` requests for `operation`; the replies' statuses, counted. A failed
    check raises (after hypothesis has shrunk the case); `seed_value` None: derandomized.
    `refusals` counts the error messages of 4xx replies (numbers masked)."""
    statuses: Counter = Counter()
    documented = operation.definition.raw["responses"]

    @settings(max_examples=n_cases, derandomize=seed_value is None, database=None,
              deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case):
        cap_lengths(case.body)
        response = case.call(base_url=url, timeout=TIMEOUT_S)
        status = response.status_code
        statuses[status] += 1
        if refusals is not None and 400 <= status < 500:
            refusals[re.sub(r"\d+", "N", _error_message(response))[:100]] += 1
        assert status < 500 or (status == 501 and "501" in documented) or \
            (status == 503 and case.path == "/slots"), f"{status}: {response.text[:300]}"
        case.validate_response(response, checks=CHECKS[mode])

    (run if seed_value is None else seed(seed_value)(run))()
    return statuses


def _error_message(response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text
