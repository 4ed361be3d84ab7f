"""What the engine answers with: errors as plain fields, outcomes without what only the engine can hold.

Frames carry no exceptions and no torch tensors (``server.workers.frame_codec``):
an error goes back as the fields of its ``ApiError`` (status, code, message,
field, Retry-After), which the API process raises again as the same answer;
an outcome goes back without its plan (cache claims) and segments (tensors).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TypeVar

from router.intake import IntakeOutcome
from router.request import InferenceResult
from server.errors import ApiError
from server.http.error_mapping import api_error_from

logger = logging.getLogger(__name__)
T = TypeVar("T")


def error_fields(error: Exception, call_id: int) -> tuple:
    """An error as plain fields (frames carry no exceptions: ``server.workers.frame_codec``)."""
    api_error = api_error_from(error)
    if api_error is None:
        logger.error("unexpected error in engine call %d", call_id, exc_info=error)
        api_error = ApiError(500, "internal_error", "internal error in the engine")
    return api_error.status, api_error.code, api_error.message, api_error.field, api_error.retry_after_s


def portable(outcome: IntakeOutcome) -> IntakeOutcome:
    """An outcome without what only the engine can hold: the plan (cache claims) and segments."""
    result = _replaced(outcome.result, image_segments=(), text_segment=None)
    return _replaced(outcome, result=result, plan=None)


def _replaced(instance: T, **changes: object) -> T:
    """``dataclasses.replace`` for the two outcome classes, without running their ``__init__`` again.

    ``replace`` looks up the class's fields and calls ``__init__`` with every
    one of them: about 2.5 us an instance, twice for every item the engine
    answers, where this copies the fields of an instance that is already
    whole (0.5 us). It holds for classes whose instances keep every field in
    their ``__dict__`` and whose ``__init__`` only stores them: no slots, no
    ``__post_init__``, no field left out of ``__init__`` (checked below, at import).
    """
    copy = object.__new__(type(instance))
    copy.__dict__.update(instance.__dict__, **changes)
    return copy


for _cls in (IntakeOutcome, InferenceResult):
    assert "__slots__" not in vars(_cls) and not hasattr(_cls, "__post_init__"), _cls
    assert all(field.init for field in dataclasses.fields(_cls)), _cls
