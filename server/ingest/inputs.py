"""From an HTTP body to the router intake's items, and the image decoder the intake is given.

    parse (event loop)     JSON or multipart -> ``ParsedInput``: field checks and
                           size limits (raw pixels: shape, length, pixel count)
    intake_item            ``ParsedInput`` -> the router's ``IntakeItem``
    image_decoder          what the intake calls, in the decode pool, for an
                           image its segment plan still needs

With ``--decode-device cuda`` the intake also gets the nvJPEG decoder
(``server.runtime.device_decode``, engine-side).

Tokenizing, planning against the cache and decoding belong to the router's
intake (``router.intake``); this module only gets the body into shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fastapi import Request
from PIL import Image
from pydantic import ValidationError
from starlette.datastructures import FormData, UploadFile

from models.loading.config import PreprocessConfig
from router.intake import IntakeItem
from router.request import Priority
from router.segments import ImageContent
from router.tracing import SpanIds
from server.ingest import json_body
from server.ingest.decoding import check_pixels_length, decode_base64, decode_image
from server.ingest.multipart_form import read_form
from server.errors import ApiError
from server.schemas import EncodedImage, InferRequest, RawImage, error_location
from server.settings import Settings

MULTIPART_FIELDS = frozenset({"image", "text", "priority", "timeout_ms", "truncate", "use_cache"})
_MULTIPART_OPTIONS = ("priority", "timeout_ms", "truncate", "use_cache")


@dataclass(frozen=True)
class ParsedInput:
    """What the client sent, checked for shape but not yet decoded.

    ``images`` in the client's order; ``images_as_list`` when they came as
    the ``images`` list (or several multipart parts): the answer then gives
    ``image_embeddings`` and errors name ``images[i]``.
    """

    text: str | None
    images: tuple[ImageContent, ...]
    priority: str
    timeout_ms: int | None
    truncate: bool
    use_cache: bool = True
    images_as_list: bool = False

    @property
    def route(self) -> str:
        if self.images and self.text is not None:
            return "fusion"
        return "vision" if self.images else "text"


def image_content(encoded: bytes | None, raw_pixels: tuple[list[int], bytes] | None) -> tuple[ImageContent, ...]:
    """Zero or one image from a protocol that carries at most one per item: encoded bytes or ([H, W, 3], bytes)."""
    if raw_pixels is not None:
        return (ImageContent(pixels=raw_pixels[1], shape=tuple(raw_pixels[0])),)
    return () if encoded is None else (ImageContent(encoded=encoded),)


def _first_error_field(error: ValidationError) -> tuple[str, str]:
    first = error.errors()[0]
    location = error_location(first["loc"])
    return location, f"{location}: {first['msg']}"


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


def parsed_input(text: str | None, images: Sequence[ImageContent], settings: Settings, *, priority: str = "normal",
                 timeout_ms: int | None = None, truncate: bool = False, use_cache: bool = True,
                 images_as_list: bool = False) -> ParsedInput:
    """One item from any protocol, with the checks ``/v1/infer`` applies (text limits, not empty, image count,
    raw pixels)."""
    parsed = ParsedInput(_check_text(text, settings), tuple(images), priority, timeout_ms, truncate, use_cache,
                         images_as_list)
    if parsed.text is None and not parsed.images:
        raise ApiError(422, "empty_request", "send a text, an image or both", "body")
    if len(parsed.images) > settings.max_images_per_request:
        raise ApiError(422, "too_many_images",
                       f"the request has {len(parsed.images)} images; the limit is {settings.max_images_per_request} "
                       "(MMSERVE_MAX_IMAGES_PER_REQUEST)", "images")
    for index, image in enumerate(parsed.images):
        if image.pixels is not None:
            field = f"images[{index}].uint8" if images_as_list else "image.uint8"
            check_pixels_length(list(image.shape), len(image.pixels), settings.max_image_pixels, field)
    return parsed


def _from_options(text: str | None, images: Sequence[ImageContent], options: InferRequest, settings: Settings,
                  images_as_list: bool) -> ParsedInput:
    return parsed_input(text, images, settings, priority=options.priority, timeout_ms=options.timeout_ms,
                        truncate=options.truncate, use_cache=options.use_cache, images_as_list=images_as_list)


def _json_image(image: EncodedImage | RawImage, field: str) -> ImageContent:
    if isinstance(image, EncodedImage):
        return ImageContent(encoded=decode_base64(image.b64, f"{field}.b64"))
    return ImageContent(pixels=decode_base64(image.uint8.b64, f"{field}.uint8.b64"), shape=tuple(image.uint8.shape))


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
    if request.image is not None and request.images is not None:
        raise ApiError(422, "invalid_request", "send either image or images, not both", "images")
    if request.images is not None:
        if len(request.images) > settings.max_images_per_request:  # before any base64 is decoded
            raise ApiError(422, "too_many_images",
                           f"images has {len(request.images)} entries; the limit is "
                           f"{settings.max_images_per_request} (MMSERVE_MAX_IMAGES_PER_REQUEST)", "images")
        images = tuple(_json_image(image, f"images[{index}]") for index, image in enumerate(request.images))
        return _from_options(request.text, images, request, settings, images_as_list=True)
    images = () if request.image is None else (_json_image(request.image, "image"),)
    return _from_options(request.text, images, request, settings, images_as_list=False)


async def parse_multipart(request: Request, settings: Settings) -> ParsedInput:
    """``image`` file part(s), in order, and a ``text`` field (plus the JSON body's scalar options).

    One ``image`` part answers as ``image`` does in JSON; several answer as ``images``.
    """
    try:
        form: FormData = await read_form(request.headers, request.stream(),
                                         text_fields=MULTIPART_FIELDS - {"image"},
                                         max_files=settings.max_images_per_request + 1,  # one more: our 422
                                         max_fields=len(MULTIPART_FIELDS), max_part_size=settings.max_body_bytes)
    except ApiError:
        raise
    except Exception as e:  # starlette raises its own parser errors; all mean a bad body
        raise ApiError(400, "invalid_multipart", f"multipart body cannot be parsed: {e}", "body") from e
    try:
        unknown = set(form.keys()) - MULTIPART_FIELDS
        if unknown:
            raise ApiError(422, "invalid_request", f"unknown form field(s): {sorted(unknown)}",
                           sorted(unknown)[0])
        for name in sorted(set(form.keys()) - {"image"}):  # silently taking the last would hide a client's bug
            if len(form.getlist(name)) > 1:
                raise ApiError(400, "duplicate_field", f"the form has {len(form.getlist(name))} {name} fields; "
                               f"send one (only image may repeat)", name)
        parts = form.getlist("image")
        images = []
        for index, part in enumerate(parts):
            field = "image" if len(parts) == 1 else f"images[{index}]"
            if not isinstance(part, UploadFile):
                raise ApiError(422, "invalid_request", f"{field} must be a file part", field)
            encoded = await part.read()
            if not encoded:
                raise ApiError(400, "empty_image", f"{field} file part is empty", field)
            images.append(ImageContent(encoded=encoded))
        text = form.get("text")
        if text is not None and not isinstance(text, str):
            raise ApiError(422, "invalid_request", "text must be a plain form field", "text")
        try:
            options = InferRequest.model_validate({key: form[key] for key in _MULTIPART_OPTIONS if key in form})
        except ValidationError as e:
            field, message = _first_error_field(e)
            raise ApiError(422, "invalid_request", message, field) from e
        return _from_options(text, images, options, settings, images_as_list=len(images) > 1)
    finally:
        await form.close()


def intake_item(parsed: ParsedInput, request_id: str, trace: SpanIds | None = None,
                protocol: str = "native") -> IntakeItem:
    """What the router's intake takes: the same fields, the images as content to key and decode.

    ``trace``: the request's server span, while tracing is on (its batch links to it).
    ``protocol``: what it came by, a label of its facts (``native``, ``kserve_v2``, ``openai``).
    """
    return IntakeItem(request_id=request_id, text=parsed.text, images=parsed.images,
                      priority=Priority(parsed.priority), timeout_ms=parsed.timeout_ms, truncate=parsed.truncate,
                      use_cache=parsed.use_cache, images_as_list=parsed.images_as_list, trace=trace,
                      protocol=protocol)


def image_decoder(settings: Settings, preprocess: PreprocessConfig) -> Callable[[bytes], Image.Image]:
    """The intake's decoder: bytes -> RGB image under the pixel limit, or an ``ApiError`` (4xx).

    With ``jpeg_draft`` a JPEG is decoded reduced, down to the side the
    model's resize needs: ``resize_size`` (shorter side before the crop) and
    ``input_size``, whichever is larger, on both sides.
    """
    max_pixels = settings.max_image_pixels
    draft_side = max(preprocess.resize_size, preprocess.input_size) if settings.jpeg_draft else None

    def decode(data: bytes) -> Image.Image:
        return decode_image(data, max_pixels, draft_side=draft_side)

    return decode
