"""The one table from mmserve's HTTP statuses to gRPC status codes, and how an error travels over gRPC.

    HTTP            gRPC                  HTTP   gRPC
    400, 415, 422   INVALID_ARGUMENT      429    RESOURCE_EXHAUSTED
    401             UNAUTHENTICATED       499    CANCELLED (the client went away; nobody reads it)
    403             PERMISSION_DENIED     503    UNAVAILABLE
    404             NOT_FOUND             504    DEADLINE_EXCEEDED
    413             RESOURCE_EXHAUSTED    other  INTERNAL (5xx), INVALID_ARGUMENT (4xx)

The status's details are the JSON error text the HTTP route gives
(``{"error": {"code", "message", "field"}}``), its hints in KServe v2's terms as the
HTTP v2 route words them (``parameters.truncate``, ``parameters.timeout``, which
over gRPC names the call's deadline beside it: ``server.protocols.option_names``); a retry delay goes in the
trailing metadata as ``retry-after`` (whole seconds, as the HTTP header) and
``grpc-retry-pushback-ms`` (what gRPC's own retry policy reads). README's
"gRPC" section prints the same table.
"""

from __future__ import annotations

import json

import grpc

from server.errors import ApiError
from server.protocols.option_names import KSERVE_V2_GRPC, in_terms_of

STATUS_BY_HTTP: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def grpc_status(http_status: int) -> grpc.StatusCode:
    default = grpc.StatusCode.INTERNAL if http_status >= 500 else grpc.StatusCode.INVALID_ARGUMENT
    return STATUS_BY_HTTP.get(http_status, default)


def error_text(error: ApiError, row_index: int | None = None) -> str:
    """The HTTP v2 route's JSON error body as text; a row's failure names its row, as that route does."""
    body = in_terms_of(error, KSERVE_V2_GRPC).body()
    if row_index is not None:
        body["error"]["message"] = f"row {row_index}: {body['error']['message']}"
    return json.dumps(body)


def trailing_metadata(error: ApiError) -> tuple[tuple[str, str], ...]:
    """``retry-after`` and ``grpc-retry-pushback-ms`` when the error says when to retry."""
    if error.retry_after_s is None:
        return ()
    seconds = max(1, round(error.retry_after_s))
    return (("retry-after", str(seconds)), ("grpc-retry-pushback-ms", str(seconds * 1000)))
