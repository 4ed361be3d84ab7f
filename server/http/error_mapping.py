"""Typed errors of the router and models -> HTTP answers (the one place that decides)."""

from __future__ import annotations

from models.errors import TextTooLongError
from router.errors import (
    ComputeUnavailableError,
    DeadlineExceededError,
    ItemFailedError,
    QueueFullError,
    ShuttingDownError,
)
from server.errors import ApiError


def api_error_from(error: Exception) -> ApiError | None:
    """The HTTP answer for a known error; ``None`` for anything unexpected."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, TextTooLongError):
        return ApiError(422, "text_too_long", str(error), "text")
    if isinstance(error, QueueFullError):
        return ApiError(503, "overloaded", str(error), retry_after_s=error.retry_after_s)
    if isinstance(error, DeadlineExceededError):
        return ApiError(504, "deadline_exceeded", str(error), "timeout_ms")
    if isinstance(error, ShuttingDownError):
        return ApiError(503, "shutting_down", str(error), retry_after_s=1.0)
    if isinstance(error, ComputeUnavailableError):
        return ApiError(503, "not_ready", str(error), retry_after_s=1.0)
    if isinstance(error, ItemFailedError):
        return ApiError(500, "inference_failed", str(error))
    return None
