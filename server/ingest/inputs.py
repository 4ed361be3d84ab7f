"""From an HTTP body to the router intake's items, and the image decoder the intake is given.

    parse (event loop)     JSON or multipart -> ``ParsedInput``: field checks and
                           size limits (raw pixels: shape, length, pixel count)
    intake_item            ``ParsedInput`` -> the router's ``IntakeItem``
    image_decoder          what the intake calls, in the decode pool, for an
                           image its segment plan still needs

Tokenizing, planning against the cache and decoding belong to the router's
intake (``router.intake``); this module only gets the body into shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fastapi import Request
from PIL import Image
from pydantic import ValidationError
from starlette.datastructures import FormData, UploadFile

from router.intake import IntakeItem
from router.request import Priority
from router.segments import ImageContent
from server.ingest import json_body
from server.ingest.decoding import check_pixels_length, decode_base64, decode_image
from server.errors import ApiError
from server.schemas import EncodedImage, InferRequest, RawImage
from server.settings import Settings

MULTIPART_FIELDS = frozenset({"image", "text", "priority", "timeout_ms", "truncate", "use_cache"})
_MULTIPART_OPTIONS = ("priority", "timeout_ms", "truncate", "use_cache")


@dataclass(frozen=True)
class ParsedInput:
    """What the client sent, checked for shape but not yet decoded."""

    text: str | None
    encoded_image: bytes | None
    raw_pixels: tuple[list[int], bytes] | None
    priority: str
    timeout_ms: int | None
    truncate: bool
    use_cache: bool = True

    @property
    def route(self) -> str:
        has_image = self.encoded_image is not None or self.raw_pixels is not None
        if has_image and self.text is not None:
            return "fusion"
        return "vision" if has_image else "text"


def _first_error_field(error: ValidationError) -> tuple[str, str]:
    first = error.errors()[0]
    location = ".".join(str(part) for part in first["loc"])
    return location or "body", f"{location or 'body'}: {first['msg']}"


def _check_text(text: str | None, settings: Settings) -> str | None:
    if text is None:
        return None
    if not text.strip():
        raise ApiError(422, "empty_text", "text is empty or only whitespace", "text")
    if len(text) > settings.max_text_chars:
        raise ApiError(422, "text_too_long",
                       f"text has {len(text)} characters; the limit is {settings.max_text_chars} "
                       "(MMSERVE_MAX_TEXT_CHARS)", "text")
    try:
        text.encode("utf-8")  # JSON may escape a lone surrogate ("\ud800"): not text the tokenizer can take
    except UnicodeEncodeError as e:
        raise ApiError(400, "invalid_text_encoding",
                       f"text holds a lone surrogate at character {e.start}; send valid Unicode", "text") from e
    return text


def parsed_input(text: str | None, encoded_image: bytes | None, raw_pixels: tuple[list[int], bytes] | None,
                 settings: Settings, *, priority: str = "normal", timeout_ms: int | None = None,
                 truncate: bool = False, use_cache: bool = True) -> ParsedInput:
    """One item from any protocol, with the checks ``/v1/infer`` applies (text limits, not empty, raw pixels)."""
    parsed = ParsedInput(_check_text(text, settings), encoded_image, raw_pixels, priority, timeout_ms,
                         truncate, use_cache)
    if parsed.text is None and encoded_image is None and raw_pixels is None:
        raise ApiError(422, "empty_request", "send a text, an image or both", "body")
    if raw_pixels is not None:
        check_pixels_length(raw_pixels[0], len(raw_pixels[1]), settings.max_image_pixels)
    return parsed


def _from_options(text: str | None, encoded: bytes | None, raw: tuple[list[int], bytes] | None,
                  options: InferRequest, settings: Settings) -> ParsedInput:
    return parsed_input(text, encoded, raw, settings, priority=options.priority, timeout_ms=options.timeout_ms,
                        truncate=options.truncate, use_cache=options.use_cache)


def parse_json(body: bytes, settings: Settings) -> ParsedInput:
    try:
        document = json_body.loads(body)
    except (json_body.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, "invalid_json", f"body is not valid JSON: {e}", "body") from e
    try:
        request = InferRequest.model_validate(document)
    except ValidationError as e:
        field, message = _first_error_field(e)
        raise ApiError(422, "invalid_request", message, field) from e
    encoded = raw = None
    if isinstance(request.image, EncodedImage):
        encoded = decode_base64(request.image.b64, "image.b64")
    elif isinstance(request.image, RawImage):
        raw = (request.image.uint8.shape, decode_base64(request.image.uint8.b64, "image.uint8.b64"))
    return _from_options(request.text, encoded, raw, request, settings)


async def parse_multipart(request: Request, settings: Settings) -> ParsedInput:
    """``image`` file part and ``text`` field (plus the JSON body's scalar options)."""
    try:
        form: FormData = await request.form(max_files=1, max_fields=len(MULTIPART_FIELDS),
                                            max_part_size=settings.max_body_bytes)
    except ApiError:
        raise
    except Exception as e:  # starlette raises its own parser errors; all mean a bad body
        raise ApiError(400, "invalid_multipart", f"multipart body cannot be parsed: {e}", "body") from e
    try:
        unknown = set(form.keys()) - MULTIPART_FIELDS
        if unknown:
            raise ApiError(422, "invalid_request", f"unknown form field(s): {sorted(unknown)}",
                           sorted(unknown)[0])
        image_part = form.get("image")
        encoded = None
        if image_part is not None:
            if not isinstance(image_part, UploadFile):
                raise ApiError(422, "invalid_request", "image must be a file part", "image")
            encoded = await image_part.read()
            if not encoded:
                raise ApiError(400, "empty_image", "image file part is empty", "image")
        text = form.get("text")
        if text is not None and not isinstance(text, str):
            raise ApiError(422, "invalid_request", "text must be a plain form field", "text")
        try:
            options = InferRequest.model_validate({key: form[key] for key in _MULTIPART_OPTIONS if key in form})
        except ValidationError as e:
            field, message = _first_error_field(e)
            raise ApiError(422, "invalid_request", message, field) from e
        return _from_options(text, encoded, None, options, settings)
    finally:
        await form.close()


def intake_item(parsed: ParsedInput, request_id: str) -> IntakeItem:
    """What the router's intake takes: the same fields, the image as content to key and decode."""
    image = None
    if parsed.raw_pixels is not None:
        shape, data = parsed.raw_pixels
        image = ImageContent(pixels=data, shape=tuple(shape))
    elif parsed.encoded_image is not None:
        image = ImageContent(encoded=parsed.encoded_image)
    return IntakeItem(request_id=request_id, text=parsed.text, image=image, priority=Priority(parsed.priority),
                      timeout_ms=parsed.timeout_ms, truncate=parsed.truncate, use_cache=parsed.use_cache)


def image_decoder(settings: Settings) -> Callable[[bytes], Image.Image]:
    """The intake's decoder: bytes -> RGB image under the pixel limit, or an ``ApiError`` (4xx)."""

    def decode(data: bytes) -> Image.Image:
        return decode_image(data, settings.max_image_pixels)

    return decode
