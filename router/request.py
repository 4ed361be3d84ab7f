"""What the router accepts and returns: plain frozen values, no framework types."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from models.multimodal import ImageSegment, TextSegment
    from router.tracing import BatchTrace, SpanIds


class Route(str, Enum):
    """What a request asks for, decided by what it carries; also the lane names."""

    TEXT = "text"
    VISION = "vision"
    FUSION = "fusion"


class Priority(str, Enum):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


@dataclass(frozen=True, eq=False)
class InferenceRequest:
    """One request as the router sees it: model-ready inputs and a deadline.

    Its images, in order, are ``images[i]`` (the model's (S, S, 3) uint8
    input, already resized) or, where the cache knew one, ``image_segments[i]``
    (the two tuples are equally long; each position has one of the two). A
    text comes as ``token_ids`` (special tokens included) and possibly
    ``text_segment``. Times are ``time.perf_counter_ns`` values.
    """

    request_id: str
    token_ids: tuple[int, ...] | None
    images: tuple[np.ndarray | None, ...] = ()  # each (S, S, 3) uint8, or None where the segment is known
    deadline_ns: int | None = None  # None: the lane's default timeout from ``arrival_ns``
    arrival_ns: int | None = None  # when the server received it; None: when the router did
    priority: Priority = Priority.NORMAL
    image_segments: tuple[ImageSegment | None, ...] = ()
    text_segment: TextSegment | None = None
    trace: SpanIds | None = None  # the server span it belongs to; only while tracing is on (router.tracing)
    image_encoding: str | None = None  # its images' encoding as sent (router.image_header): what drills filter on

    def __post_init__(self) -> None:
        if not self.image_segments and self.images:
            object.__setattr__(self, "image_segments", (None,) * len(self.images))
        if not self.images and self.image_segments:
            object.__setattr__(self, "images", (None,) * len(self.image_segments))
        if len(self.images) != len(self.image_segments):
            raise ValueError(f"{len(self.images)} images but {len(self.image_segments)} image segment slots")
        if any(pixels is None and segment is None for pixels, segment in zip(self.images, self.image_segments)):
            raise ValueError("every image needs its pixels or its known segment")
        if not (self.has_text or self.has_image):
            raise ValueError("a request needs a text, an image or both")

    @property
    def num_images(self) -> int:
        return len(self.images)

    @functools.cached_property
    def image_rows_to_encode(self) -> tuple[int, ...]:
        """Which of its images the vision encoder still has to run.

        Kept once computed (the request is frozen): the scheduler asks for
        every queued request's work on every admission and batch choice.
        """
        return tuple(i for i, segment in enumerate(self.image_segments) if segment is None)

    @functools.cached_property
    def num_images_to_encode(self) -> int:
        """Its image work: what it counts against a vision batch's cap."""
        return len(self.image_rows_to_encode)

    @property
    def has_image(self) -> bool:
        return bool(self.images)

    @property
    def has_text(self) -> bool:
        return self.token_ids is not None or self.text_segment is not None

    @property
    def needs_vision(self) -> bool:
        return self.num_images_to_encode > 0

    @property
    def needs_text(self) -> bool:
        return self.text_segment is None and self.token_ids is not None

    @property
    def route(self) -> Route:
        if self.has_image and self.has_text:
            return Route.FUSION
        return Route.VISION if self.has_image else Route.TEXT

    @property
    def lane(self) -> Route:
        """Where it is scheduled: by what it costs, not by what it returns.

        A fusion request whose image segments are all known costs what a
        text request costs, so it waits in the text lane.
        """
        if self.route == Route.FUSION and not self.needs_vision:
            return Route.TEXT
        return self.route


@dataclass(frozen=True)
class InferenceResult:
    """One request's outputs (float32 numpy on the host) and where its time went.

    ``image_segments``/``text_segment`` are the segments this request used
    (computed or cached), kept on the model's device for the cache.
    """

    route: Route
    image_embeddings: tuple[np.ndarray, ...] = ()  # each (E_v,), in the request's image order
    text_embedding: np.ndarray | None = None  # (E_t,)
    fused_embedding: np.ndarray | None = None  # (E_t,)
    score: float | None = None  # the model's calibrated score (``models.scores``); None when it has none
    match_score: float | None = None  # the trained fusion head's; None while the head is untrained
    batch_size: int = 1
    stage_ns: dict[str, int] = field(default_factory=dict)
    image_segments: tuple[ImageSegment, ...] = ()
    text_segment: TextSegment | None = None
    batch_trace: BatchTrace | None = None  # the batch that computed it; only while tracing is on

    @property
    def image_embedding(self) -> np.ndarray | None:
        """The one image's embedding of a single-image request; None otherwise."""
        return self.image_embeddings[0] if len(self.image_embeddings) == 1 else None
