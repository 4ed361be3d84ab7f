"""What the router accepts and returns: plain frozen values, no framework types."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from models.multimodal import ImageSegment, TextSegment


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

    An image comes either as ``image`` (the model's (S, S, 3) uint8 input,
    already resized) or, when the cache knew it, as ``image_segment``; a text
    as ``token_ids`` (special tokens included) and possibly ``text_segment``.
    Times are ``time.perf_counter_ns`` values.
    """

    request_id: str
    token_ids: tuple[int, ...] | None
    image: np.ndarray | None  # (S, S, 3) uint8
    deadline_ns: int | None = None  # None: the lane's default timeout from ``arrival_ns``
    arrival_ns: int | None = None  # when the server received it; None: when the router did
    priority: Priority = Priority.NORMAL
    image_segment: ImageSegment | None = None
    text_segment: TextSegment | None = None

    def __post_init__(self) -> None:
        if not (self.has_text or self.has_image):
            raise ValueError("a request needs a text, an image or both")

    @property
    def has_image(self) -> bool:
        return self.image is not None or self.image_segment is not None

    @property
    def has_text(self) -> bool:
        return self.token_ids is not None or self.text_segment is not None

    @property
    def needs_vision(self) -> bool:
        return self.image_segment is None and self.image is not None

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

        A fusion request whose image segment is already known costs what a
        text request costs, so it waits in the text lane.
        """
        if self.route == Route.FUSION and not self.needs_vision:
            return Route.TEXT
        return self.route


@dataclass(frozen=True)
class InferenceResult:
    """One request's outputs (float32 numpy on the host) and where its time went.

    ``image_segment``/``text_segment`` are the segments this request used
    (computed or cached), kept on the model's device for the cache.
    """

    route: Route
    image_embedding: np.ndarray | None = None  # (d_v,)
    text_embedding: np.ndarray | None = None  # (d_t,)
    fused_embedding: np.ndarray | None = None  # (d_t,)
    score: float | None = None  # the model's calibrated score (``models.scores``); None when it has none
    match_score: float | None = None  # the trained fusion head's; None while the head is untrained
    batch_size: int = 1
    stage_ns: dict[str, int] = field(default_factory=dict)
    image_segment: ImageSegment | None = None
    text_segment: TextSegment | None = None
