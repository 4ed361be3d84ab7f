"""What the engine answers with: errors as plain fields, outcomes without what only the engine can hold.

Frames carry no exceptions and no torch tensors (``server.workers.frame_codec``):
an error goes back as the fields of its ``ApiError`` (status, code, message,
field, Retry-After), which the API process raises again as the same answer;
an outcome goes back without its plan (cache claims) and segments (tensors),
and without what the API process derives itself (the token ids it sent, the
joint-token count, the item's facts).
"""

from __future__ import annotations

import logging

from router.intake import IntakeItem, IntakeOutcome
from router.request import InferenceResult
from server.errors import ApiError
from server.http.error_mapping import api_error_from
from server.workers.frame_codec import copy_with, stores_fields_only

logger = logging.getLogger(__name__)


def error_fields(error: Exception, call_id: int) -> tuple:
    """An error as plain fields (frames carry no exceptions: ``server.workers.frame_codec``)."""
    api_error = api_error_from(error)
    if api_error is None:
        logger.error("unexpected error in engine call %d", call_id, exc_info=error)
        api_error = ApiError(500, "internal_error", "internal error in the engine")
    return api_error.status, api_error.code, api_error.message, api_error.field, api_error.retry_after_s


def portable(outcome: IntakeOutcome) -> IntakeOutcome:
    """An outcome without what only the engine can hold: the plan (cache claims) and segments.

    Copied with ``copy_with``, not ``dataclasses.replace``, which looks up the
    fields and runs ``__init__`` again: 5.2 us an outcome against 1.5, and
    the engine answers one per item.
    """
    result = copy_with(outcome.result, image_segments=(), text_segment=None)
    return copy_with(outcome, result=result, plan=None)


def portable_of_item(outcome: IntakeOutcome, item: IntakeItem) -> IntakeOutcome:
    """``portable``, and, when its text is the very token ids ``item`` brought, without what the API process
    derives itself: the ids, the joint-token count and the item's facts.

    The API process tokenized the text and sent the ids (``IntakeItem.tokens``;
    an item without text brings ``None``, and its outcome has no text); the
    intake runs them as they came, so sending them back costs the engine an
    encode per answer for nothing: the API process puts its own back
    (``CallInFlight.counted``). The joint count and the facts follow from the
    ids and the item the client sent, which the API process holds (the facts
    of the very item as the client sent it, raw pixels included, as one
    process computes them), so they are left out too: two dataclasses and
    four tuples fewer for the engine to encode per answer, which the engine,
    the one process every request passes, would otherwise pay.
    """
    result = copy_with(outcome.result, image_segments=(), text_segment=None)
    if outcome.text is item.tokens:
        return copy_with(outcome, result=result, plan=None, text=None, joint=None, facts=None)
    return copy_with(outcome, result=result, plan=None)


for _cls in (IntakeOutcome, InferenceResult):
    if not stores_fields_only(_cls):
        raise TypeError(f"{_cls.__qualname__} must keep only its fields in __dict__ for portable() to copy it")
