"""What one generated request is, before it becomes an HTTP body.

Workloads (synthetic or replayed) produce ``Arrival``s: an intended send time
and a ``RequestSpec``. Keeping the spec abstract (an image *key*, a text
*length*) lets the synthetic generator and the trace replayer share the body
builder, and keeps traces small: they name images, they do not carry them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Modality(str, enum.Enum):
    """What a request carries; the server routes it to the lane of the same name."""

    TEXT = "text"
    VISION = "vision"
    FUSION = "fusion"

    @property
    def has_image(self) -> bool:
        return self is not Modality.TEXT

    @property
    def has_text(self) -> bool:
        return self is not Modality.VISION


class Priority(str, enum.Enum):
    """The server's admission priorities, as sent in the ``priority`` field."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


@dataclass(frozen=True)
class RequestSpec:
    """One request, abstractly.

    ``image_key`` selects an image from the pool (same key, same bytes, so the
    server's content cache sees a repeat); ``num_text_chars`` is the length of
    a freshly generated text. Either is ``None``/0 when the modality has no such
    part.
    """

    modality: Modality
    image_key: int | None = None
    num_text_chars: int = 0
    priority: Priority | None = None
    timeout_ms: int | None = None


@dataclass(frozen=True)
class Arrival:
    """A request and when it should be sent, in seconds after the run starts."""

    intended_offset_s: float
    spec: RequestSpec
