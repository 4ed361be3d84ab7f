"""Each protocol's own names for mmserve's request options, so an error's hint names what its client can send.

    option     native (/v1/infer, /v1/classify, /v1/rank, /v1/embeddings)   KServe v2 (HTTP and gRPC)
    truncate   send "truncate": true                                        set parameters.truncate to true
    deadline   timeout_ms                                                   parameters.timeout (microseconds);
                                                                            over gRPC the call's deadline too
    image k    images[k]                                                    image[k] (of an [N, K] input's row)
    pixels     image.uint8                                                  image_uint8

Errors are made once, in the native terms (``server.http.error_mapping``;
the typed errors of ``models`` and ``router`` word the truncate hint the same
way), and may cross from an engine process as plain fields. A protocol with
other names rewrites them when it renders its answer (``in_terms_of``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from server.errors import ApiError


@dataclass(frozen=True)
class OptionNames:
    """How a protocol's client asks to cut a long text, the field that sets a request's deadline, and the
    fields that carry one image of several (``images[k]``) and raw pixels."""

    truncate_hint: str
    timeout_field: str
    image_list_field: str
    pixels_field: str
    timeout_hint: str | None = None  # what a message says sets the deadline; None: ``timeout_field``


NATIVE = OptionNames('send "truncate": true', "timeout_ms", "images", "image.uint8")
KSERVE_V2 = OptionNames("set parameters.truncate to true", "parameters.timeout", "image", "image_uint8")
# tritonclient.grpc's client_timeout is the call's deadline, which is the request's deadline as the parameter is
KSERVE_V2_GRPC = OptionNames("set parameters.truncate to true", "parameters.timeout", "image", "image_uint8",
                             "parameters.timeout or the call's gRPC deadline")
_IMAGE_OF_A_LIST = re.compile(rf"\b{re.escape(NATIVE.image_list_field)}\[(\d+)\]")


def _renamed(text: str, names: OptionNames) -> str:
    text = text.replace(NATIVE.pixels_field, names.pixels_field)
    return _IMAGE_OF_A_LIST.sub(lambda match: f"{names.image_list_field}[{match.group(1)}]", text)


def in_terms_of(error: ApiError, names: OptionNames) -> ApiError:
    """``error`` with its option hints, its deadline field and its image fields in ``names``' terms."""
    if names == NATIVE:
        return error
    message = error.message.replace(NATIVE.truncate_hint, names.truncate_hint)
    message = _renamed(message.replace(NATIVE.timeout_field, names.timeout_hint or names.timeout_field), names)
    field = names.timeout_field if error.field == NATIVE.timeout_field else error.field
    field = _renamed(field, names) if field is not None else None
    if (message, field) == (error.message, error.field):
        return error  # as it was: a subclass (BodyTooLargeError) keeps its own answer
    return ApiError(error.status, error.code, message, field, error.retry_after_s)
