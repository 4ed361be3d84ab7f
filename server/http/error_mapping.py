"""Typed errors of the router and models -> HTTP answers (the one place that decides)."""

from __future__ import annotations

from models.errors import TextTooLongError
import dataclasses

from router.errors import (
    ComputeUnavailableError,
    DeadlineExceededError,
    DecodeQueueFullError,
    ImageItemError,
    ItemFailedError,
    JointTokensExceededError,
    QueueFullError,
    ShuttingDownError,
    TooManyImagesError,
)
from server.errors import ApiError
from server.protocols.option_names import NATIVE


def api_error_from(error: Exception) -> ApiError | None:
    """The HTTP answer for a known error; ``None`` for anything unexpected."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, TextTooLongError):
        return ApiError(422, "text_too_long", str(error), "text")
    if isinstance(error, TooManyImagesError):
        return ApiError(422, "too_many_images", str(error), "images")
    if isinstance(error, JointTokensExceededError):
        return ApiError(422, "joint_tokens_exceeded", str(error), "text")
    if isinstance(error, ImageItemError):
        return _for_image(error)
    if isinstance(error, DecodeQueueFullError):
        return ApiError(503, "overloaded", str(error), retry_after_s=error.retry_after_s)
    if isinstance(error, QueueFullError):
        return ApiError(503, "overloaded", str(error), retry_after_s=error.retry_after_s)
    if isinstance(error, DeadlineExceededError):  # passed, or shorter than the request's own compute time
        return ApiError(504, "deadline_exceeded", f"{error} ({NATIVE.timeout_field} sets the deadline)",
                        NATIVE.timeout_field)
    if isinstance(error, ShuttingDownError):
        return ApiError(503, "shutting_down", str(error), retry_after_s=1.0)
    if isinstance(error, ComputeUnavailableError):
        return ApiError(503, "not_ready", str(error), retry_after_s=1.0)
    if isinstance(error, ItemFailedError):
        return ApiError(500, "inference_failed", str(error))
    return None


def _for_image(error: ImageItemError) -> ApiError | None:
    """The bad image's own answer, its field and message pointing at ``images[i]``."""
    inner = api_error_from(error.error)
    if inner is None:
        return None
    field = f"images[{error.image_index}]"
    if inner.field is not None and inner.field.startswith("image"):
        field += inner.field[len("image"):]  # "image.b64" -> "images[2].b64"
    return dataclasses.replace(inner, field=field, message=f"images[{error.image_index}]: {inner.message}")
