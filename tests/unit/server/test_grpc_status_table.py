"""The gRPC status table: the issue's mapping, the README's table, retry metadata, peers as rate-limit callers."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import grpc

from router.errors import DeadlineExceededError
from server.errors import ApiError
from server.http.error_mapping import api_error_from
from server.grpc_api.guards import client_address
from server.grpc_api.infer_endpoint import until_call_ends
from server.grpc_api.status_table import STATUS_BY_HTTP, error_text, grpc_status, trailing_metadata

README = Path(__file__).parents[3] / "README.md"


def test_the_table_maps_each_status_as_the_issue_says():
    expected = {400: "INVALID_ARGUMENT", 415: "INVALID_ARGUMENT", 422: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED",
                403: "PERMISSION_DENIED", 404: "NOT_FOUND", 413: "RESOURCE_EXHAUSTED", 429: "RESOURCE_EXHAUSTED",
                503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
    assert {status: grpc_status(status).name for status in expected} == expected
    assert grpc_status(500) is grpc.StatusCode.INTERNAL and grpc_status(408) is grpc.StatusCode.INVALID_ARGUMENT


def test_the_readme_prints_the_same_table():
    rows = re.findall(r"^  \| ([^|]+) \| `(\w+)` \| ([^|]+) \| `(\w+)`", README.read_text(), re.M)
    documented: dict[int, str] = {}
    for left, left_code, right, right_code in rows:
        for statuses, code in ((left, left_code), (right, right_code)):
            for status in re.findall(r"\b(\d{3})\b", statuses):
                documented[int(status)] = code
    assert documented == {status: code.name for status, code in STATUS_BY_HTTP.items()}


def test_the_message_is_the_http_json_and_a_row_is_named():
    error = ApiError(422, "text_too_long", "text has 600 tokens; the limit is 64", "text")
    assert json.loads(error_text(error)) == error.body()
    assert json.loads(error_text(error, 3))["error"]["message"] == "row 3: text has 600 tokens; the limit is 64"


def test_a_retry_delay_goes_in_trailing_metadata_in_seconds_and_milliseconds():
    assert trailing_metadata(ApiError(503, "overloaded", "full", retry_after_s=2.4)) == (
        ("retry-after", "2"), ("grpc-retry-pushback-ms", "2000"))
    assert trailing_metadata(ApiError(400, "bad", "bad")) == ()


def test_a_peer_is_its_address():
    assert client_address("ipv4:127.0.0.1:53412") == "127.0.0.1"
    assert client_address("ipv6:[::1]:53412") == "::1"
    assert client_address("unix:/tmp/socket") == "unix:/tmp/socket"


def test_a_deadline_error_names_the_calls_grpc_deadline_beside_parameters_timeout():
    """tritonclient.grpc sets a call's deadline with client_timeout, which becomes the request's deadline as
    parameters.timeout does: a 504 over gRPC names both, so a client that set only the deadline finds it."""
    native = api_error_from(DeadlineExceededError("the deadline leaves 1.0 ms, less than the estimate"))
    body = json.loads(error_text(native, 0))["error"]
    assert body["field"] == "parameters.timeout" and "timeout_ms" not in body["message"], body
    assert "parameters.timeout" in body["message"] and "gRPC deadline" in body["message"], body


def test_a_call_whose_deadline_passed_is_a_504_naming_parameters_timeout():
    """As every other v2 504 and a refused ``timeout`` parameter name it, not the bare ``timeout``."""

    class PassedDeadline:
        def time_remaining(self) -> float:
            return 0.0

    async def cancelled_at_its_deadline() -> ApiError:
        task = asyncio.create_task(until_call_ends(PassedDeadline(), asyncio.sleep(60)))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except ApiError as e:
            return e
        raise AssertionError("the call was answered")

    error = asyncio.run(cancelled_at_its_deadline())
    assert (error.status, error.code, error.field) == (504, "deadline_exceeded", "parameters.timeout")
