"""The searchable facts of a request as span attributes, and never its content.

What a trace search needs: the route, the model, how many images and of what
size and encoding, how many text tokens, what the cache said per segment,
priority and deadline, status and error code. What it must never hold: the
text or the pixels (nor anything derived from them that could give them
back). Every value here is a count, a size, an enum or a name the server
chose; the test sweeps every attribute for the request's text.
"""

from __future__ import annotations

from collections.abc import Mapping

from router.intake import IntakeOutcome
from router.segments import ImageContent
from router.tracing import BatchTrace
from server.ingest.inputs import ParsedInput

AttributeValue = str | bool | int | float | tuple[str, ...] | tuple[int, ...]

# (magic bytes at the start, offset, name): enough to tell the formats the decoder accepts.
_SIGNATURES: tuple[tuple[bytes, int, str], ...] = (
    (b"\xff\xd8\xff", 0, "jpeg"),
    (b"\x89PNG\r\n\x1a\n", 0, "png"),
    (b"WEBP", 8, "webp"),
    (b"GIF8", 0, "gif"),
    (b"BM", 0, "bmp"),
    (b"II*\x00", 0, "tiff"),
    (b"MM\x00*", 0, "tiff"),
)


def image_encoding(image: ImageContent) -> str:
    """``uint8`` for raw pixels, else the file format its first bytes name (``unknown`` if none)."""
    if image.pixels is not None:
        return "uint8"
    head = (image.encoded or b"")[:16]
    return next((name for magic, offset, name in _SIGNATURES if head[offset:offset + len(magic)] == magic),
                "unknown")


def item_attributes(parsed: ParsedInput, outcome: IntakeOutcome | None, default_timeout_ms: Mapping[str, int]
                    ) -> dict[str, AttributeValue]:
    """One item's facts: what it sent (sizes, not bytes) and, once answered, its tokens, cache and batch."""
    route = outcome.result.route.value if outcome is not None else parsed.route
    attributes: dict[str, AttributeValue] = {
        "mmserve.route": route,
        "mmserve.priority": parsed.priority,
        "mmserve.deadline_ms": parsed.timeout_ms if parsed.timeout_ms is not None else default_timeout_ms[route],
        "mmserve.use_cache": parsed.use_cache,
        "mmserve.image.count": len(parsed.images),
        "mmserve.text.present": parsed.text is not None,
    }
    if parsed.images:
        attributes["mmserve.image.bytes"] = tuple(len(image.encoded or image.pixels or b"") for image in parsed.images)
        attributes["mmserve.image.encodings"] = tuple(image_encoding(image) for image in parsed.images)
        raw_shapes = [image.shape for image in parsed.images if image.shape is not None]
        if raw_shapes:
            attributes["mmserve.image.raw_shapes"] = tuple("x".join(map(str, shape)) for shape in raw_shapes)
    if outcome is None:
        return attributes
    if outcome.text is not None:
        attributes["mmserve.text.tokens"] = len(outcome.text.token_ids)
        attributes["mmserve.text.truncated"] = outcome.text.is_truncated
    if outcome.joint is not None:
        attributes["mmserve.joint_tokens"] = outcome.joint.total
    for segment, status in outcome.plan.statuses().items():
        attributes[f"mmserve.cache.{segment}"] = status if isinstance(status, str) else tuple(status)
    attributes["mmserve.batch.size"] = outcome.result.batch_size
    return attributes


def batch_attributes(batch: BatchTrace) -> dict[str, AttributeValue]:
    """The batch span's facts: lane, sizes, padded shapes, device."""
    attributes: dict[str, AttributeValue] = {
        "mmserve.lane": batch.lane.value,
        "mmserve.executor": batch.executor,
        "mmserve.device": batch.device,
        "mmserve.batch.size": batch.num_requests,
        "mmserve.batch.work_items": batch.num_work_items,
        "mmserve.batch.padded_size": batch.padded_size,
        "mmserve.batch.failed": batch.num_failed,
        "mmserve.batch.stages": tuple(stage for stage, _ in batch.stage_ns),
    }
    if batch.image_shape:
        attributes["mmserve.batch.image_shape"] = batch.image_shape
    if batch.text_shape:
        attributes["mmserve.batch.text_shape"] = batch.text_shape
    return attributes
