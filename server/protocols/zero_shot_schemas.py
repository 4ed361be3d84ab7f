"""Bodies of ``POST /v1/classify`` and ``POST /v1/rank`` (pydantic, the edge only) and their checks.

Counts are checked before any base64 is decoded, so a request with a
hundred thousand labels or candidates costs a 422, not a decode; each
refusal has its own code and names its field:

    too_many_labels / too_many_candidates   over MMSERVE_MAX_LABELS_PER_REQUEST / _CANDIDATES_
    empty_labels / empty_candidates         an empty list
    empty_label / empty_text                a label / a text query or candidate that is empty or only whitespace
    invalid_template                        a template without ``{}`` or with other fields
    mixed_candidates                        candidates of both modalities
    same_modality                           candidates of the query's own modality
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from router.segments import ImageContent
from server.errors import ApiError
from server.ingest.decoding import check_pixels_length, decode_base64
from server.schemas import (
    TIMEOUT_MS_LIMIT,
    EncodedImage,
    ImageInput,
    ModelInfo,
    RawImage,
    TextOrImageInput,
    WholeInt,
)
from server.settings import Settings

DEFAULT_TEMPLATE = "This is a photo of {}."  # transformers' zero-shot-image-classification default

Image = ImageInput  # validated as the kind its keys name (server.schemas)


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    top_k: int | None = Field(None, ge=1, description="Answer only the best top_k (default: all).")
    priority: Literal["high", "normal", "low"] = "normal"
    timeout_ms: WholeInt | None = Field(None, ge=1, le=TIMEOUT_MS_LIMIT, description="Deadline from arrival.")
    truncate: bool = Field(False, description="Cut a too-long text to the model's limit instead of 422.")
    use_cache: bool = Field(True, description="false: neither read nor write the segment cache.")


class ClassifyRequest(_Options):
    """Body of ``POST /v1/classify``: one ``image`` or several ``images``, and the labels to score."""

    image: Image | None = Field(None, description="An encoded image or raw pixels.")
    images: list[Image] | None = Field(
        None, description="Several images (at most MMSERVE_MAX_IMAGES_PER_REQUEST): one result each, in order.")
    labels: list[str] = Field(
        description="Candidate labels (at least one, at most MMSERVE_MAX_LABELS_PER_REQUEST), each put into "
                    "`template`; each templated label is a cached text segment.")
    template: str = Field(DEFAULT_TEMPLATE, description="Python format string with one `{}` for the label "
                                                        "(`{}` alone: labels are already sentences).")


class RankRequest(_Options):
    """Body of ``POST /v1/rank``: a query of one modality, candidates of the other."""

    query: TextOrImageInput = Field(description="A text, or an image (encoded or raw pixels).")
    candidates: list[TextOrImageInput] = Field(
        description="At least one, at most MMSERVE_MAX_CANDIDATES_PER_REQUEST: images for a text query, "
                    "texts for an image query.")


class LabelScore(BaseModel):
    label: str
    score: float


class ClassifyResult(BaseModel):
    labels: list[LabelScore] = Field(description="Best first; ties keep the request's order.")


class ClassifyResponse(BaseModel):
    """Answer of ``POST /v1/classify``."""

    id: str
    model: ModelInfo
    score_kind: Literal["softmax", "sigmoid", "match_score"] = Field(
        description="softmax: the labels' probabilities sum to 1 (CLIP family); sigmoid: each label's own "
                    "probability (SigLIP); match_score: the trained fusion head's match probability.")
    results: list[ClassifyResult] = Field(description="One per image, in the request's order.")
    cache: dict[str, dict[str, int] | list[str]] = Field(
        description="`labels`: how many distinct labels were hit, miss, coalesced or bypass; `images`: per image.")
    timings_ms: dict[str, float]


class RankedCandidate(BaseModel):
    index: int = Field(description="The candidate's position in the request.")
    score: float


class RankResponse(BaseModel):
    """Answer of ``POST /v1/rank``."""

    id: str
    model: ModelInfo
    score_kind: Literal["siglip_sigmoid", "clip_logit", "match_score"] = Field(
        description="The family's per-pair score, as /v1/infer's `score` (siglip_sigmoid a probability, "
                    "clip_logit a logit), or the trained fusion head's match probability.")
    results: list[RankedCandidate] = Field(description="Best first; ties keep the request's order.")
    cache: dict[str, dict[str, int] | list[str]]
    timings_ms: dict[str, float]


@dataclass(frozen=True)
class ClassifyInput:
    """A checked classify body: images as content to key and decode, the templated texts in label order."""

    images: tuple[ImageContent, ...]
    images_as_list: bool
    labels: tuple[str, ...]
    texts: tuple[str, ...]


@dataclass(frozen=True)
class RankInput:
    """A checked rank body: the query and candidates, one side images, the other texts."""

    query_text: str | None
    query_image: ImageContent | None
    candidate_texts: tuple[str, ...]
    candidate_images: tuple[ImageContent, ...]

    @property
    def num_candidates(self) -> int:
        return len(self.candidate_texts) or len(self.candidate_images)


def image_content(image: Image, field: str, settings: Settings) -> ImageContent:
    """One JSON image as content to key and decode; raw pixels are checked against their shape and the limit."""
    if isinstance(image, EncodedImage):
        return ImageContent(encoded=decode_base64(image.b64, f"{field}.b64"))
    pixels = decode_base64(image.uint8.b64, f"{field}.uint8.b64")
    check_pixels_length(list(image.uint8.shape), len(pixels), settings.max_image_pixels, f"{field}.uint8")
    return ImageContent(pixels=pixels, shape=tuple(image.uint8.shape))


def check_text(text: str, field: str, settings: Settings, empty_code: str = "empty_text") -> str:
    """A label or text: not blank (``empty_code``), under the character limit, valid Unicode."""
    if not text.strip():
        raise ApiError(422, empty_code, f"{field} is empty or only whitespace", field)
    if len(text) > settings.max_text_chars:
        raise ApiError(422, "text_too_long", f"{field} has {len(text)} characters; the limit is "
                                             f"{settings.max_text_chars} (MMSERVE_MAX_TEXT_CHARS)", field)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(400, "invalid_text_encoding",
                       f"{field} holds a lone surrogate at character {e.start}; send valid Unicode", field) from e
    return text


def apply_template(template: str, label: str) -> str:
    """``template.format(label)``, as the pipeline builds its sentences; ``invalid_template`` if it cannot."""
    if "{}" not in template:
        raise ApiError(422, "invalid_template", f"template {template!r} has no {{}} for the label", "template")
    try:
        return template.format(label)
    except (IndexError, KeyError, ValueError) as e:
        raise ApiError(422, "invalid_template",
                       f"template {template!r} must hold exactly one {{}} and no other fields ({{{{ }}}} for a "
                       f"literal brace): {e}", "template") from e


def _check_count(num: int, limit: int, what: str, setting: str) -> None:
    if num == 0:
        raise ApiError(422, f"empty_{what}", f"{what} is empty; send at least one", what)
    if num > limit:
        raise ApiError(422, f"too_many_{what}", f"{what} has {num} entries; the limit is {limit} "
                                                f"(MMSERVE_{setting})", what)


def classify_input(request: ClassifyRequest, settings: Settings) -> ClassifyInput:
    """Check a classify body (counts first, before any image is decoded from base64)."""
    _check_count(len(request.labels), settings.max_labels_per_request, "labels", "MAX_LABELS_PER_REQUEST")
    if request.image is not None and request.images is not None:
        raise ApiError(422, "invalid_request", "send either image or images, not both", "images")
    if request.image is None and not request.images:
        raise ApiError(422, "missing_image", "send an image (image, or a non-empty images list)", "image")
    if request.images is not None and len(request.images) > settings.max_images_per_request:
        raise ApiError(422, "too_many_images", f"images has {len(request.images)} entries; the limit is "
                                               f"{settings.max_images_per_request} (MMSERVE_MAX_IMAGES_PER_REQUEST)",
                       "images")
    labels = tuple(check_text(label, f"labels[{index}]", settings, "empty_label")
                   for index, label in enumerate(request.labels))
    texts = tuple(apply_template(request.template, label) for label in labels)
    for index, text in enumerate(texts):
        if len(text) > settings.max_text_chars:
            check_text(text, f"labels[{index}]", settings)
    if request.images is not None:
        images = tuple(image_content(image, f"images[{index}]", settings) for index, image in enumerate(request.images))
    else:
        images = (image_content(request.image, "image", settings),)
    return ClassifyInput(images, request.images is not None, labels, texts)


def rank_input(request: RankRequest, settings: Settings) -> RankInput:
    """Check a rank body: the candidates all of one modality, the other than the query's."""
    _check_count(len(request.candidates), settings.max_candidates_per_request, "candidates",
                 "MAX_CANDIDATES_PER_REQUEST")
    is_text_query = isinstance(request.query, str)
    are_texts = [isinstance(candidate, str) for candidate in request.candidates]
    if any(are_texts) and not all(are_texts):
        odd = are_texts.index(not are_texts[0])
        raise ApiError(422, "mixed_candidates", "candidates must all be texts or all be images; candidates[0] and "
                                                f"candidates[{odd}] differ", f"candidates[{odd}]")
    if are_texts[0] == is_text_query:
        modality = "a text" if is_text_query else "an image"
        raise ApiError(422, "same_modality", f"the query is {modality}: rank candidates of the other modality "
                                             "(images for a text query, texts for an image query)", "candidates")
    if is_text_query:
        query_text = check_text(request.query, "query", settings)  # type: ignore[arg-type]
        images = tuple(image_content(candidate, f"candidates[{index}]", settings)  # type: ignore[arg-type]
                       for index, candidate in enumerate(request.candidates))
        return RankInput(query_text, None, (), images)
    texts = tuple(check_text(candidate, f"candidates[{index}]", settings)  # type: ignore[arg-type]
                  for index, candidate in enumerate(request.candidates))
    return RankInput(None, image_content(request.query, "query", settings), texts, ())  # type: ignore[arg-type]
