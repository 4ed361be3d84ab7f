"""An answer made before any route runs (a guard's, routing's) takes the error shape of its path's protocol."""

from __future__ import annotations

import json

from server.errors import ApiError, BodyTooLargeError
from server.http.error_shapes import error_response

RATE_LIMITED = ApiError(429, "rate_limited", "over the rate limit of 5/s", "authorization", retry_after_s=1.4)


def _answer(error: ApiError, path: str) -> tuple[int, dict, dict]:
    response = error_response(error, path)
    return response.status_code, dict(response.headers), json.loads(response.body)


def test_kserve_v2_paths_answer_triton_s_string_shape_with_the_same_status_and_headers():
    status, headers, body = _answer(RATE_LIMITED, "/v2/models/tiny/infer")
    assert (status, headers["retry-after"]) == (429, "1")
    assert body == {"error": "rate_limited: over the rate limit of 5/s"}


def test_kserve_v2_paths_name_v2_s_own_parameters():
    error = ApiError(504, "deadline_exceeded", "the deadline passed; timeout_ms sets it", "timeout_ms")
    assert _answer(error, "/v2/models/tiny/infer")[2] == {
        "error": "deadline_exceeded: the deadline passed; parameters.timeout sets it"}


def test_a_body_over_the_limit_still_closes_the_connection_in_every_shape():
    for path in ("/v2/models/tiny/infer", "/v1/embeddings", "/v1/infer"):
        status, headers, _ = _answer(BodyTooLargeError(1000), path)
        assert (status, headers["connection"]) == (413, "close")


def test_openai_paths_answer_openai_s_shape():
    assert _answer(RATE_LIMITED, "/v1/embeddings")[2] == {"error": {
        "message": "over the rate limit of 5/s", "type": "invalid_request_error", "param": "authorization",
        "code": "rate_limited"}}


def test_every_other_path_answers_mmserve_s_shape():
    assert _answer(RATE_LIMITED, "/v1/infer")[2] == {"error": {
        "code": "rate_limited", "message": "over the rate limit of 5/s", "field": "authorization"}}
    assert _answer(RATE_LIMITED, "/v2x")[2]["error"]["code"] == "rate_limited"  # not under /v2


def test_the_v2_server_metadata_route_itself_is_kserve_s():
    assert _answer(RATE_LIMITED, "/v2")[2] == {"error": "rate_limited: over the rate limit of 5/s"}
