"""One ``POST /v1/infer`` JSON body -> the LitServe peer's checked input, or mmserve's refusal.

The peer imports nothing of ``server`` (import-linter holds ``benchmarks`` to
that), so it carries its own copy of mmserve's edge checks, as a LitServe
user writes ``decode_request``: the same body shape, strict base64, the same
limits (``PeerLimits``, from the same ``MMSERVE_*`` variables) and status
codes. Transparent and 16-bit images, which the generator never sends, get
Pillow's ``convert("RGB")``.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError
from pydantic import BaseModel, ConfigDict, Field, ValidationError


@dataclass(frozen=True)
class PeerLimits:
    """mmserve's limits and batching defaults (its ``Settings``), as the peer applies them."""

    max_text_chars: int = 100_000
    max_image_pixels: int = 36_000_000
    max_batch_size: int = 8
    max_queue_delay_ms: float = 5.0
    default_timeout_ms: int = 30_000

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> PeerLimits:
        """The defaults, each overridden by ``MMSERVE_<NAME>`` as ``mmserve serve`` reads them (the default's type)."""
        environ = os.environ if environ is None else environ
        return cls(**{field.name: type(field.default)(environ.get(f"MMSERVE_{field.name.upper()}", field.default))
                      for field in dataclasses.fields(cls)})


@dataclass(frozen=True)
class PeerRefusal(Exception):
    """A request the peer refuses, with the HTTP status, code and field mmserve would answer."""

    status: int
    code: str
    message: str
    field: str

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"

    def detail(self) -> dict[str, str]:
        """The ``error`` object of mmserve's error body."""
        return {"code": self.code, "message": self.message, "field": self.field}


class _EncodedImage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    b64: str = Field(min_length=1)


class _RawPixels(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shape: list[int] = Field(min_length=3, max_length=3)
    b64: str = Field(min_length=1)


class _RawImage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    uint8: _RawPixels


class _PeerBody(BaseModel):
    """``POST /v1/infer``'s body; the peer accepts priority, deadline and cache options and ignores them."""

    model_config = ConfigDict(extra="forbid")
    text: str | None = None
    image: _EncodedImage | _RawImage | None = None
    priority: Literal["high", "normal", "low"] = "normal"
    timeout_ms: int | None = Field(None, ge=1, le=3_600_000)
    truncate: bool = False
    use_cache: bool = True


@dataclass(frozen=True)
class PeerRequest:
    """A checked body: its text (not yet tokenized) and its image bytes, not yet decoded."""

    text: str | None
    truncate: bool
    encoded_image: bytes | None = None
    raw_pixels: tuple[list[int], bytes] | None = None  # ([H, W, 3], H*W*3 bytes)


def _decode_base64(text: str, field: str) -> bytes:
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise PeerRefusal(400, "invalid_base64", f"{field} is not valid base64: {e}", field) from e
    if not data:
        raise PeerRefusal(400, "empty_image", f"{field} decodes to zero bytes", field)
    return data


def _check_pixels(width: int, height: int, limits: PeerLimits, field: str) -> None:
    if width < 1 or height < 1:
        raise PeerRefusal(422, "invalid_image_size", f"{field} is {width}x{height}", field)
    if width * height > limits.max_image_pixels:
        raise PeerRefusal(413, "image_too_large",
                          f"{field} has {width * height} pixels; the limit is {limits.max_image_pixels}", field)


def decode_image(data: bytes, limits: PeerLimits) -> Image.Image:
    """Encoded image bytes -> an RGB Pillow image (EXIF-oriented), pixel count checked before decoding."""
    field = "image"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:
        raise PeerRefusal(413, "image_too_large", f"{field}: {e}", field) from e
    except UnidentifiedImageError as e:
        raise PeerRefusal(415, "unsupported_image_format", f"{field} is not an image format Pillow reads",
                          field) from e
    except (OSError, SyntaxError, ValueError) as e:
        raise PeerRefusal(400, "corrupt_image", f"{field} cannot be read: {e}", field) from e
    _check_pixels(image.width, image.height, limits, field)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image.load()
            return ImageOps.exif_transpose(image).convert("RGB")
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise PeerRefusal(400, "corrupt_image", f"{field} is truncated or corrupt: {e}", field) from e


def decode_pixels(shape: list[int], data: bytes, limits: PeerLimits) -> np.ndarray:
    """Raw uint8 pixels with a declared [H, W, 3] shape -> an (H, W, 3) array."""
    field = "image.uint8"
    if len(shape) != 3 or shape[2] != 3:
        raise PeerRefusal(422, "invalid_tensor_shape", f"{field}.shape must be [H, W, 3], got {shape}",
                          f"{field}.shape")
    height, width = shape[0], shape[1]
    _check_pixels(width, height, limits, field)
    if len(data) != height * width * 3:
        raise PeerRefusal(422, "invalid_tensor_length",
                          f"{field}.b64 holds {len(data)} bytes; shape {shape} needs {height * width * 3}",
                          f"{field}.b64")
    return np.frombuffer(data, dtype=np.uint8).reshape(height, width, 3)  # (H, W, 3)


def _check_text(text: str, limits: PeerLimits) -> str:
    if not text.strip():
        raise PeerRefusal(422, "empty_text", "text is empty or only whitespace", "text")
    if len(text) > limits.max_text_chars:
        raise PeerRefusal(422, "text_too_long",
                          f"text has {len(text)} characters; the limit is {limits.max_text_chars}", "text")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PeerRefusal(400, "invalid_text_encoding", f"text holds a lone surrogate at character {e.start}",
                          "text") from e
    return text


def checked_request(body: object, limits: PeerLimits) -> PeerRequest:
    """The body checked in mmserve's order (shape, base64, text, not empty); raises ``PeerRefusal``."""
    try:
        parsed = _PeerBody.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "body"
        raise PeerRefusal(422, "invalid_request", f"{field}: {first['msg']}", field) from e
    encoded = raw = None
    if isinstance(parsed.image, _EncodedImage):
        encoded = _decode_base64(parsed.image.b64, "image.b64")
    elif isinstance(parsed.image, _RawImage):
        raw = (parsed.image.uint8.shape, _decode_base64(parsed.image.uint8.b64, "image.uint8.b64"))
    text = None if parsed.text is None else _check_text(parsed.text, limits)
    if text is None and encoded is None and raw is None:
        raise PeerRefusal(422, "empty_request", "send a text, an image or both", "body")
    return PeerRequest(text=text, truncate=parsed.truncate, encoded_image=encoded, raw_pixels=raw)
