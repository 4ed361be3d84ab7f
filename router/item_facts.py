"""What is known about one item, computed once by the intake: what spans, drift attribution and drills read.

    intake.run, run_one (event loop, before preparing) sent = ItemFacts.sent(item)
        images: encoding and W x H from their headers (router.image_header, no decode),
                bytes, raw shapes; the count; priority; protocol
    after tokenizing (the joint-token budget applied)  facts = sent.with_text(tokens, joint)
        text tokens as the encoder runs them, whether they were cut, joint tokens
    IntakeOutcome.facts                                the server's spans and its monitor read these

Every value is a count, a size, or a label the server chose (the encodings are
``router.image_header``'s vocabulary), never content: a span may carry all of
it. An item that never reached an outcome (its request failed) has the facts
of what it sent, from the same ``ItemFacts.sent``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.image_header import combined_encoding, image_encoding, image_pixels, largest_of
from router.segments import ImageContent

if TYPE_CHECKING:
    from models.tokenizer import TokenizedText
    from router.intake import IntakeItem
    from router.joint_budget import JointTokens


@dataclass(frozen=True)
class ItemFacts:
    """One item's facts; the text ones are ``None`` until it is tokenized (or when it has no text).

    Plain values only, the per-request summaries included, so whoever reads
    them after the answer calls nothing back in the router.

    Attributes:
        protocol: What it came by (``native``, ``kserve_v2``, ``openai``, ...).
        priority: ``high``, ``normal`` or ``low``.
        image_encodings: Per image, as ``router.image_header`` names it.
        image_pixels: Per image, W x H from its header or shape (``None``: unreadable header).
        image_bytes: Per image, the bytes it arrived as (encoded, or raw pixels).
        raw_shapes: The shapes of images sent as raw pixels, in order.
        num_images: How many images it carried.
        image_encoding: Its images' encoding when they agree, ``mixed`` when not, ``None`` without images.
        largest_image_pixels: The largest W x H; ``None`` without images or when a header could not be read.
        num_text_tokens: Tokens the text encoder runs (after truncation); ``None``: no text.
        is_text_truncated: Whether the text was cut (to its limit or the joint budget).
        num_joint_tokens: images x tokens per image + text tokens, as the budget counted them.
        engine: Which engine computed it (0 with one engine; ``server.workers.engine_dispatch``).
    """

    protocol: str
    priority: str
    image_encodings: tuple[str, ...] = ()
    image_pixels: tuple[int | None, ...] = ()
    image_bytes: tuple[int, ...] = ()
    raw_shapes: tuple[tuple[int, ...], ...] = ()
    num_images: int = 0
    image_encoding: str | None = None
    largest_image_pixels: int | None = None
    num_text_tokens: int | None = None
    is_text_truncated: bool | None = None
    num_joint_tokens: int | None = None
    engine: int = 0

    @classmethod
    def sent(cls, item: IntakeItem) -> ItemFacts:
        """What the item carried, read from its images' headers (microseconds: no decode)."""
        return cls.of_images(item.images, protocol=item.protocol, priority=item.priority.value)

    @classmethod
    def of_images(cls, images: Sequence[ImageContent], *, protocol: str, priority: str) -> ItemFacts:
        if not images:  # a text: one shared instance per label pair (frozen), not five empty tuples per item
            return _without_images(protocol, priority)
        encodings = tuple(image_encoding(image) for image in images)
        pixels = tuple(image_pixels(image) for image in images)
        return cls(
            protocol=protocol,
            priority=priority,
            image_encodings=encodings,
            image_pixels=pixels,
            image_bytes=tuple(image.num_bytes for image in images),
            raw_shapes=tuple(tuple(image.shape) for image in images if image.pixels is not None and image.shape),
            num_images=len(images),
            image_encoding=combined_encoding(encodings),
            largest_image_pixels=largest_of(pixels),
        )

    def with_text(self, text: TokenizedText | None, joint: JointTokens | None) -> ItemFacts:
        """These facts and the text as it will run (tokenized, cut to the budget).

        Built field by field rather than with ``dataclasses.replace``, which
        looks every field up again on each call: this runs once per item.
        """
        return ItemFacts(
            self.protocol, self.priority, self.image_encodings, self.image_pixels, self.image_bytes,
            self.raw_shapes, self.num_images, self.image_encoding, self.largest_image_pixels,
            num_text_tokens=None if text is None else len(text.token_ids),
            is_text_truncated=None if text is None else text.is_truncated,
            num_joint_tokens=None if joint is None else joint.total,
        )


@functools.lru_cache(maxsize=64)  # protocol and priority are the server's own labels: a handful of pairs
def _without_images(protocol: str, priority: str) -> ItemFacts:
    return ItemFacts(protocol=protocol, priority=priority)
