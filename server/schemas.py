"""Pydantic models of the HTTP API (the edge only; inside, frozen dataclasses)."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag


def _whole_float_as_int(value: object) -> object:
    """A whole number written past 64 bits (``1e20``, or ``100000000000000000000``, which the JSON parser
    reads as a float) as the int it is, so the field's own limit refuses it by name rather than pydantic's
    "unable to parse input string as an integer"."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


WholeInt = Annotated[int, BeforeValidator(_whole_float_as_int)]
TIMEOUT_MS_LIMIT = 3_600_000  # an hour


class EncodedImage(BaseModel):
    """An encoded image file (PNG, JPEG, WebP, GIF, TIFF, BMP...) in base64."""

    model_config = ConfigDict(extra="forbid")
    b64: str = Field(min_length=1, description="Base64 of the encoded image file.")


class RawPixels(BaseModel):
    """Raw uint8 RGB pixels, row-major [H, W, 3], in base64."""

    model_config = ConfigDict(extra="forbid")
    shape: list[WholeInt] = Field(min_length=3, max_length=3, description="[H, W, 3]")
    b64: str = Field(min_length=1, description="Base64 of H*W*3 bytes.")


class RawImage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    uint8: RawPixels


def _image_kind(value: object) -> str:
    """Which image object a value is meant to be: one with a ``uint8`` key is raw pixels, anything else encoded."""
    if isinstance(value, RawImage) or (isinstance(value, dict) and "uint8" in value):
        return "RawImage"
    return "EncodedImage"


# Validated as the kind its keys name, so a bad {"uint8": ...} is refused for what is wrong inside it
# (image.uint8.shape), not for lacking the other kind's b64. The tag appears in an error's location:
# ``error_location`` leaves it out.
ImageInput = Annotated[Union[Annotated[EncodedImage, Tag("EncodedImage")], Annotated[RawImage, Tag("RawImage")]],
                       Discriminator(_image_kind)]


def _text_or_image_kind(value: object) -> str:
    """A string (or anything but an object) is a text; an object is the image kind its keys name."""
    return _image_kind(value) if isinstance(value, (dict, BaseModel)) else "TextInput"


TextOrImageInput = Annotated[Union[Annotated[str, Tag("TextInput")], Annotated[EncodedImage, Tag("EncodedImage")],
                                   Annotated[RawImage, Tag("RawImage")]], Discriminator(_text_or_image_kind)]
_IMAGE_TAGS = frozenset({"EncodedImage", "RawImage", "TextInput"})


def error_location(location: tuple[int | str, ...]) -> str:
    """A validation error's location as the client wrote the field (``image.uint8.shape``), with list
    indices as mmserve's own errors write them (``images[1].uint8``, ``labels[0]``); ``body`` if none."""
    named = ""
    for part in location:
        if isinstance(part, int):
            named += f"[{part}]"
        elif part not in _IMAGE_TAGS:
            named += f".{part}" if named else part
    return named or "body"


class InferRequest(BaseModel):
    """Body of ``POST /v1/infer`` (JSON); at least one of ``text``, ``image`` and ``images``."""

    model_config = ConfigDict(extra="forbid")
    text: str | None = Field(None, description="Text to embed (and to fuse with the images).")
    image: ImageInput | None = Field(None, description="An encoded image or raw pixels.")
    images: list[ImageInput] | None = Field(
        None, min_length=1,
        description="Several images (at most MMSERVE_MAX_IMAGES_PER_REQUEST), each encoded or raw; the text "
                    "attends over all of them. The answer has one image_embeddings entry per image, in order.")
    priority: Literal["high", "normal", "low"] = "normal"
    timeout_ms: WholeInt | None = Field(None, ge=1, le=TIMEOUT_MS_LIMIT, description="Deadline from arrival.")
    truncate: bool = Field(False, description="Cut a too-long text to the model's limit instead of 422.")
    use_cache: bool = Field(True, description="false: neither read nor write the segment cache.")


class ModelInfo(BaseModel):
    name: str
    fingerprint: str
    family: str = Field(description="Which library defines the towers: mmserve (presets), siglip, clip, open_clip.")
    score: str | None = Field(
        description="What the answer's `score` is: siglip_sigmoid (a probability), clip_logit (a logit), or null "
                    "when the model has no calibrated image-text score (no `score` is sent).")
    normalized_embeddings: bool = Field(description="Whether the embeddings are L2-normalised.")
    fusion_head: Literal["trained", "untrained"] = Field(
        description="An untrained fusion head sends no `match_score`; `fused_embedding` is then not meaningful.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        description="What the model computes in (--dtype); the embeddings are float32 numbers whatever it is.")
    runtime: Literal["torch", "onnxruntime"] = Field(
        description="What runs the towers (--runtime): torch, or ONNX Runtime on the CPU.")
    quantization: Literal["none", "int8"] = Field(
        "none", description="int8: the towers' matrix multiplies run quantized (--quantize int8).")
    int8_cosine: float | None = Field(
        None, description="With int8: the lowest cosine of int8 to float32 outputs on the start-up probe set.")


class TextInfo(BaseModel):
    num_tokens: int = Field(description="Tokens the model saw (after truncation).")
    truncated: bool
    num_tokens_before_truncation: int


class JointTokensInfo(BaseModel):
    num_images: int
    tokens_per_image: int
    num_text_tokens: int = Field(description="After any cut to fit the budget.")
    total: int = Field(description="num_images x tokens_per_image + num_text_tokens.")
    limit: int = Field(description="MMSERVE_MAX_JOINT_TOKENS (or the model's default).")


class InferResponse(BaseModel):
    """Answer of ``POST /v1/infer``: the outputs of the request's route."""

    id: str
    route: Literal["text", "vision", "fusion"]
    model: ModelInfo
    image_embedding: list[float] | None = Field(None, description="The one image's (a request with one image).")
    image_embeddings: list[list[float]] | None = Field(
        None, description="One per image, in order (a request that sent `images`).")
    text_embedding: list[float] | None = None
    fused_embedding: list[float] | None = None
    score: float | None = Field(None, description="The model's own calibrated score (see model.score).")
    match_score: float | None = Field(None, description="The trained fusion head's match probability.")
    text: TextInfo | None = None
    joint_tokens: JointTokensInfo | None = None
    cache: dict[str, str | list[str]] = Field(
        default_factory=dict, description="Per segment: hit, miss, coalesced or bypass; `images` lists one per image.")
    timings_ms: dict[str, float]
