"""Property-based fuzzing of every operation in the live server's ``/openapi.json`` (schemathesis).

For each operation: a fixed number of schema-valid and of schema-violating
requests, generated deterministically (``derandomize``), sent to a real
uvicorn server. Every answer must not be a server error and must match the
response schema the operation documents. Two 5xx answers are the server
working as specified, not failing: 503 when admission control sheds a
request (a fuzzed ``timeout_ms`` of 1 cannot be met) and 504 when a deadline
passes; both must carry their named code.
"""

from __future__ import annotations

import time

import hypothesis
import hypothesis.errors
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis.checks import response_schema_conformance

EXAMPLES_PER_MODE = 5
DEADLINE_STATUSES = {503: ("overloaded", "not_ready"), 504: ("deadline_exceeded",)}


def _error_code(response: schemathesis.Response) -> str:
    try:
        error = response.json().get("error")
    except ValueError:
        return ""
    if isinstance(error, str):
        return error.split(":", 1)[0]
    return error.get("code", "") if isinstance(error, dict) else ""


def no_server_error(ctx: schemathesis.CheckContext, response: schemathesis.Response,
                    case: schemathesis.Case) -> None:
    status = response.status_code
    if status < 500:
        return
    allowed_codes = DEADLINE_STATUSES.get(status, ())
    assert _error_code(response) in allowed_codes, (
        f"{case.operation.label} answered {status}: {response.text[:300]}\n{case.as_curl_command()}")


@pytest.fixture(scope="module")
def schema(tiny_server):
    return schemathesis.openapi.from_url(f"{tiny_server.url}/openapi.json")


def test_the_schema_lists_every_input_path(schema):
    labels = {operation.ok().label for operation in schema.get_all_operations()}
    assert {"POST /v1/infer", "POST /v1/embeddings", "POST /v2/models/{model_name}/infer",
            "GET /health/live", "DELETE /v1/cache", "POST /v1/classify", "POST /v1/rank"} <= labels


def test_no_operation_answers_5xx_or_breaks_its_schema(schema, tiny_server):
    started = time.monotonic()
    operations = [result.ok() for result in schema.get_all_operations()]
    num_calls = 0
    for operation in operations:
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):

            @hypothesis.settings(max_examples=EXAMPLES_PER_MODE, derandomize=True, deadline=None, database=None,
                                 phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
                                 print_blob=False)
            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            def call_and_check(case: schemathesis.Case) -> None:
                nonlocal num_calls
                response = case.call(base_url=tiny_server.url, timeout=30)
                num_calls += 1
                case.validate_response(response, checks=[no_server_error, response_schema_conformance])

            try:
                call_and_check()
            except hypothesis.errors.Unsatisfiable:
                # An operation without parameters or body has nothing a request could violate.
                assert mode is schemathesis.GenerationMode.NEGATIVE, operation.label
    elapsed_s = time.monotonic() - started
    assert num_calls >= len(operations) * EXAMPLES_PER_MODE // 2
    assert elapsed_s < 45, f"the fuzzing run took {elapsed_s:.0f} s; it must stay well under a minute"
    with tiny_server.client() as client:
        assert client.get("/health/ready").status_code == 200
        assert client.post("/v1/infer", json={"text": "still serving"}).status_code == 200
