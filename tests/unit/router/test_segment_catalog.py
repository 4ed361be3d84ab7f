"""Segment keys belong to a model: a new fingerprint never sees an old entry."""

from __future__ import annotations

import asyncio

import torch

from cache import SegmentCache
from models.multimodal import ImageSegment
from router.item_facts import ItemFacts
from router.segments import ImageContent, SegmentCatalog, SlotStatus


def _segment() -> ImageSegment:
    return ImageSegment(pooled=torch.zeros(4), k=torch.zeros(3, 2), v=torch.zeros(3, 4))


def test_a_different_model_fingerprint_misses():
    cache = SegmentCache(image_budget_bytes=1 << 20, text_budget_bytes=1 << 20)
    old_model = SegmentCatalog(cache, "fingerprint-of-model-a", "size=32")
    new_model = SegmentCatalog(cache, "fingerprint-of-model-b", "size=32")
    image = ImageContent(encoded=b"the same uploaded bytes")

    plan = old_model.plan((image,), None, use_cache=True)
    assert plan.images[0].status == SlotStatus.MISS
    plan.publish((_segment(),), None)
    assert old_model.plan((image,), None, use_cache=True).images[0].status == SlotStatus.HIT
    assert new_model.plan((image,), None, use_cache=True).images[0].status == SlotStatus.MISS


def test_preprocessing_is_part_of_the_key_and_abandon_frees_the_claim():
    cache = SegmentCache(image_budget_bytes=1 << 20, text_budget_bytes=1 << 20)
    image = ImageContent(pixels=bytes(12), shape=(2, 2, 3))
    first = SegmentCatalog(cache, "fp", "size=32").plan((image,), (2, 5, 3), use_cache=True)
    other_preprocessing = SegmentCatalog(cache, "fp", "size=64").plan((image,), None, use_cache=True)
    assert other_preprocessing.images[0].status == SlotStatus.MISS
    other_preprocessing.abandon()
    first.abandon()
    assert cache.num_in_flight == 0
    assert SegmentCatalog(cache, "fp", "size=32").plan((image,), None, use_cache=True).images[0].status == SlotStatus.MISS


def test_a_published_segment_owns_only_its_bytes():
    """A row of a batch tensor is copied out, so the cache never pins the whole batch."""
    cache = SegmentCache(image_budget_bytes=1 << 20, text_budget_bytes=1 << 20)
    batch_k, batch_v = torch.zeros(8, 3, 2), torch.zeros(8, 3, 4)  # (B, Lv, r), (B, Lv, d)
    row = ImageSegment(pooled=torch.zeros(8, 4)[5], k=batch_k[5], v=batch_v[5])
    plan = SegmentCatalog(cache, "fp", "size=32").plan((ImageContent(encoded=b"x"),), None, use_cache=True)
    plan.publish((row,), None)
    stored = SegmentCatalog(cache, "fp", "size=32").plan((ImageContent(encoded=b"x"),), None, use_cache=True).images[0].value
    assert stored.k.untyped_storage().nbytes() == 3 * 2 * 4
    assert stored.v.untyped_storage().nbytes() == 3 * 4 * 4
    assert cache.stats().of(cache.stats().image.modality).size_bytes == row.size_bytes
    torch.testing.assert_close(stored.k, row.k)


def test_a_segment_the_cache_is_not_asked_about_is_neither_keyed_nor_claimed():
    """Cache off (or ``use_cache: false``): no digest, no claim, no event; the request computes it itself."""
    events: list[tuple[str, str, int]] = []
    off = SegmentCache(image_budget_bytes=0, text_budget_bytes=0,
                       on_event=lambda modality, event, count: events.append((modality, event, count)))
    image = ImageContent(encoded=b"an uploaded image")
    plan = SegmentCatalog(off, "fp", "size=32").plan((image, image), (2, 5, 3), use_cache=True)
    for slot in (*plan.images, plan.text):
        assert slot.status == SlotStatus.BYPASS and slot.needs_compute
        assert slot.key is None and slot.claim is None
    assert plan.image_indices_to_compute == (0, 1)
    assert plan.statuses() == {"images": ["bypass", "bypass"], "text": "bypass"}
    assert plan.is_settled and off.num_in_flight == 0 and events == []

    on = SegmentCache(image_budget_bytes=1 << 20, text_budget_bytes=1 << 20,
                      on_event=lambda modality, event, count: events.append((modality, event, count)))
    uncached = SegmentCatalog(on, "fp", "size=32").plan((image,), (2, 5, 3), use_cache=False)
    assert uncached.images[0].key is None and uncached.text.key is None
    assert on.num_in_flight == 0 and events == []
    cached = SegmentCatalog(on, "fp", "size=32").plan((image,), (2, 5, 3), use_cache=True)
    assert cached.images[0].status == SlotStatus.MISS and cached.images[0].key is not None
    cached.abandon()


def test_a_plan_with_nothing_to_await_resolves_to_itself():
    cache = SegmentCache(image_budget_bytes=1 << 20, text_budget_bytes=0)
    plan = SegmentCatalog(cache, "fp", "size=32").plan((ImageContent(encoded=b"x"),), (2, 3), use_cache=True)
    assert asyncio.run(plan.resolved()) is plan
    plan.abandon()


def test_raw_pixels_left_behind_key_the_cache_and_count_their_facts_as_the_bytes_do():
    """What the engine gets for raw pixels an API process decoded: no bytes, the same key and facts."""
    cache = SegmentCache(image_budget_bytes=1 << 20, text_budget_bytes=1 << 20)
    catalog = SegmentCatalog(cache, "fp", "size=32")
    sent = ImageContent(pixels=bytes(range(24)) * 50, shape=(20, 20, 3))
    behind = sent.left_behind(catalog.image_key(sent))
    assert behind.pixels == b"" and behind.shape == sent.shape
    assert catalog.image_key(behind) == catalog.image_key(sent)
    assert behind.num_bytes == sent.num_bytes == 1200
    facts = (ItemFacts.of_images((sent,), protocol="native", priority="normal"),
             ItemFacts.of_images((behind,), protocol="native", priority="normal"))
    assert facts[0] == facts[1]
    plan = catalog.plan((sent,), None, use_cache=True)
    plan.publish((_segment(),), None)
    assert catalog.plan((behind,), None, use_cache=True).images[0].status == SlotStatus.HIT
