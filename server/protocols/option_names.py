"""Each protocol's own names for mmserve's request options, so an error's hint names what its client can send.

    option     native (/v1/infer, /v1/classify, /v1/rank, /v1/embeddings)   KServe v2 (HTTP and gRPC)
    truncate   send "truncate": true                                        set parameters.truncate to true
    deadline   timeout_ms                                                   parameters.timeout (microseconds)

Errors are made once, in the native terms (``server.http.error_mapping``;
the typed errors of ``models`` and ``router`` word the truncate hint the same
way), and may cross from an engine process as plain fields. A protocol with
other names rewrites them when it renders its answer (``in_terms_of``).
"""

from __future__ import annotations

from dataclasses import dataclass

from server.errors import ApiError


@dataclass(frozen=True)
class OptionNames:
    """How a protocol's client asks to cut a long text, and the field that sets a request's deadline."""

    truncate_hint: str
    timeout_field: str


NATIVE = OptionNames('send "truncate": true', "timeout_ms")
KSERVE_V2 = OptionNames("set parameters.truncate to true", "parameters.timeout")


def in_terms_of(error: ApiError, names: OptionNames) -> ApiError:
    """``error`` with its option hints and its deadline field in ``names``' terms."""
    if names == NATIVE:
        return error
    message = error.message.replace(NATIVE.truncate_hint, names.truncate_hint)
    message = message.replace(NATIVE.timeout_field, names.timeout_field)
    field = names.timeout_field if error.field == NATIVE.timeout_field else error.field
    if (message, field) == (error.message, error.field):
        return error  # as it was: a subclass (BodyTooLargeError) keeps its own answer
    return ApiError(error.status, error.code, message, field, error.retry_after_s)
