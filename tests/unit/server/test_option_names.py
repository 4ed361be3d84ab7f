"""Each protocol's errors name its own options: the native hints rewritten for KServe v2, nothing else touched."""

from __future__ import annotations

from models.errors import TextTooLongError
from router.errors import DeadlineExceededError, JointTokensExceededError
from server.errors import ApiError, BodyTooLargeError
from server.http.error_mapping import api_error_from
from server.protocols.option_names import KSERVE_V2, NATIVE, in_terms_of


def test_the_truncate_hint_the_typed_errors_give_is_the_one_rewritten():
    for error in (TextTooLongError(80, 64), JointTokensExceededError(4, 50, 60, 250)):
        native = api_error_from(error)
        assert native is not None and NATIVE.truncate_hint in native.message
        v2 = in_terms_of(native, KSERVE_V2)
        assert KSERVE_V2.truncate_hint in v2.message and '"truncate"' not in v2.message
        assert (v2.status, v2.code, v2.field) == (native.status, native.code, native.field)


def test_a_deadline_names_the_timeout_field_of_its_protocol():
    native = api_error_from(DeadlineExceededError("the deadline passed before the request reached the queue"))
    assert native is not None and (native.status, native.code, native.field) == (504, "deadline_exceeded", "timeout_ms")
    assert "timeout_ms" in native.message
    v2 = in_terms_of(native, KSERVE_V2)
    assert v2.field == "parameters.timeout" and "parameters.timeout" in v2.message and "timeout_ms" not in v2.message
    assert in_terms_of(native, NATIVE) is native


def test_an_error_without_option_names_is_left_as_it_is():
    too_large = BodyTooLargeError(4096)
    assert in_terms_of(too_large, KSERVE_V2) is too_large
    refused = ApiError(503, "overloaded", "the text lane is full", retry_after_s=2.0)
    assert in_terms_of(refused, KSERVE_V2) is refused
