"""HTTP errors: one stable ``code`` per cause, in the JSON shape of DESIGN.md.

    {"error": {"code": "image_too_large", "message": "...", "field": "image"}}

Everything the server refuses is raised as an ``ApiError`` (or mapped to one
from the typed errors of the packages below) and rendered by one handler.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi.responses import JSONResponse


@dataclass
class ApiError(Exception):
    """A refusal with its HTTP status, stable code, message and offending field."""

    status: int
    code: str
    message: str
    field: str | None = None
    retry_after_s: float | None = None

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"

    def body(self) -> dict:
        error: dict[str, str] = {"code": self.code, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        return {"error": error}

    def response(self, body: dict | None = None) -> JSONResponse:
        """The answer, in ``body`` when a protocol words its errors its own way (``server.http.error_shapes``)."""
        headers = {}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, round(self.retry_after_s)))
        return JSONResponse(self.body() if body is None else body, status_code=self.status, headers=headers)


class BodyTooLargeError(ApiError):
    """Raised from the body reader once a streamed body passes the limit.

    Its answer closes the connection: the rest of the body is never read, and
    on a kept-alive connection the client could go on trickling it for as
    long as it liked (each byte resets uvicorn's keep-alive timer, and the
    header clock only runs for a request's headers).
    """

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(
            413, "body_too_large",
            f"request body exceeds the limit of {limit_bytes} bytes (MMSERVE_MAX_BODY_BYTES)",
        )

    def response(self, body: dict | None = None) -> JSONResponse:
        response = super().response(body)
        response.headers["Connection"] = "close"
        return response


ERROR_RESPONSE_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "field": {"type": "string"},
            },
        }
    },
}
