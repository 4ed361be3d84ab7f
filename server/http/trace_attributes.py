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

from router.tracing import BatchTrace
from server.http.traced_answer import TracedItem

AttributeValue = str | bool | int | float | tuple[str, ...] | tuple[int, ...]


def item_attributes(item: TracedItem, default_timeout_ms: Mapping[str, int]) -> dict[str, AttributeValue]:
    """One item's facts: what it sent (sizes, not bytes) and, once answered, its tokens, cache and batch.

    Sizes, encodings, counts and tokens are the item's facts as the intake
    computed them (``router.item_facts``): the same values, in the same
    vocabulary, that drift attribution reads.
    """
    parsed, facts, outcome = item.parsed, item.facts, item.outcome
    route = outcome.result.route.value if outcome is not None else parsed.route
    attributes: dict[str, AttributeValue] = {
        "mmserve.route": route,
        "mmserve.priority": parsed.priority,
        "mmserve.deadline_ms": parsed.timeout_ms if parsed.timeout_ms is not None else default_timeout_ms[route],
        "mmserve.use_cache": parsed.use_cache,
        "mmserve.image.count": len(parsed.images),
        "mmserve.text.present": parsed.text is not None,
    }
    if facts is not None and facts.num_images:
        attributes["mmserve.image.bytes"] = facts.image_bytes
        attributes["mmserve.image.encodings"] = facts.image_encodings
        if facts.raw_shapes:
            attributes["mmserve.image.raw_shapes"] = tuple("x".join(map(str, shape)) for shape in facts.raw_shapes)
    if outcome is None:
        return attributes
    if facts is not None and facts.num_text_tokens is not None:
        attributes["mmserve.text.tokens"] = facts.num_text_tokens
        attributes["mmserve.text.truncated"] = bool(facts.is_text_truncated)
    if facts is not None and facts.num_joint_tokens is not None:
        attributes["mmserve.joint_tokens"] = facts.num_joint_tokens
    for segment, status in (outcome.cache or {}).items():
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
