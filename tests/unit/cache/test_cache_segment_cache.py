"""The router-facing facade: hit/miss/coalesced accounting, bypass, disabled modalities, clear."""

from __future__ import annotations

from cache import LookupKind, Modality, SegmentCache

from segment_fixtures import EventLog, image_key, text_key

WAIT_S = 10.0


def test_events_have_exact_counts(event_log: EventLog) -> None:
    cache: SegmentCache[str] = SegmentCache(image_budget_bytes=20, text_budget_bytes=100, on_event=event_log)
    a, b, c = image_key("a"), image_key("b"), image_key("c")

    first = cache.lookup(a)  # miss
    cache.lookup(a)  # coalesced
    first.claim.complete("A", 10)  # type: ignore[union-attr]  # insert
    assert cache.lookup(a).value == "A"  # hit
    cache.lookup(b).claim.complete("B", 10)  # type: ignore[union-attr]  # miss, insert
    cache.lookup(b)  # hit
    cache.lookup(c).claim.complete("C", 15)  # type: ignore[union-attr]  # miss, eviction of a and b, insert
    cache.lookup(text_key("t")).claim.fail(RuntimeError())  # type: ignore[union-attr]  # text miss

    assert event_log.totals() == {
        ("image", "miss"): 3,
        ("image", "coalesced"): 1,
        ("image", "hit"): 2,
        ("image", "insert"): 3,
        ("image", "eviction"): 2,
        ("text", "miss"): 1,
    }
    assert cache.store.keys(Modality.IMAGE) == (c,)


def test_lookup_evicts_in_exact_lru_order_with_recency_from_hits() -> None:
    cache: SegmentCache[str] = SegmentCache(image_budget_bytes=30, text_budget_bytes=0)
    a, b, c, d = (image_key(name) for name in "abcd")
    for key in (a, b, c):
        cache.lookup(key).claim.complete(key.hex, 10)  # type: ignore[union-attr]
    assert cache.lookup(a).is_hit  # a becomes most recent: b is now the oldest
    cache.lookup(d).claim.complete(d.hex, 10)  # type: ignore[union-attr]
    assert cache.store.keys(Modality.IMAGE) == (c, a, d)
    assert cache.lookup(b).is_miss


def test_bypass_neither_reads_nor_writes(event_log: EventLog) -> None:
    cache: SegmentCache[str] = SegmentCache(100, 100, on_event=event_log)
    key = text_key("cached")
    cache.lookup(key).claim.complete("old", 5)  # type: ignore[union-attr]
    event_log.calls.clear()

    bypassed = cache.bypass(key)
    assert bypassed.kind is LookupKind.MISS  # the cached value is not read
    assert cache.num_in_flight == 0  # and nothing joins the in-flight table
    assert bypassed.claim.complete("fresh", 5) is False  # type: ignore[union-attr]
    assert bypassed.as_future().result(timeout=WAIT_S) == "fresh"
    assert cache.lookup(key).value == "old"  # nothing was written
    assert event_log.totals() == {("text", "hit"): 1}  # only the last lookup counted

    other = text_key("never-cached")
    cache.bypass(other).claim.complete("x", 5)  # type: ignore[union-attr]
    assert cache.stats().text.num_entries == 1


def test_zero_budget_modality_is_off(event_log: EventLog) -> None:
    cache: SegmentCache[str] = SegmentCache(image_budget_bytes=0, text_budget_bytes=100, on_event=event_log)
    key = image_key("off")
    first, second = cache.lookup(key), cache.lookup(key)
    assert (first.kind, second.kind) == (LookupKind.MISS, LookupKind.MISS)  # no coalescing either
    assert first.claim.complete("v", 1) is False  # type: ignore[union-attr]
    assert cache.lookup(key).is_miss
    assert cache.is_enabled(Modality.TEXT) and not cache.is_enabled(Modality.IMAGE)
    assert event_log.calls == []


def test_clear_drops_entries_but_not_in_flight_claims() -> None:
    cache: SegmentCache[str] = SegmentCache(100, 100)
    cache.lookup(image_key("a")).claim.complete("A", 10)  # type: ignore[union-attr]
    cache.lookup(text_key("b")).claim.complete("B", 10)  # type: ignore[union-attr]
    running = cache.lookup(text_key("c"))
    assert cache.clear() == 2
    assert cache.stats().num_entries == 0
    assert cache.lookup(image_key("a")).is_miss
    assert cache.lookup(text_key("c")).is_pending
    running.claim.complete("C", 10)  # type: ignore[union-attr]
    assert cache.lookup(text_key("c")).value == "C"


def test_new_fingerprint_misses_entries_of_the_old_model() -> None:
    from cache import encoded_image_key

    cache: SegmentCache[str] = SegmentCache(100, 100)
    old = encoded_image_key("model@1", "pre", b"same upload")
    new = encoded_image_key("model@2", "pre", b"same upload")
    cache.lookup(old).claim.complete("old-embedding", 10)  # type: ignore[union-attr]
    assert cache.lookup(old).is_hit
    assert cache.lookup(new).is_miss


def test_failing_event_callback_does_not_break_the_cache() -> None:
    def on_event(modality: str, event: str, count: int) -> None:
        raise RuntimeError("metrics backend down")

    cache: SegmentCache[str] = SegmentCache(100, 100, on_event=on_event)
    owner = cache.lookup(text_key("x"))
    waiter = cache.lookup(text_key("x"))
    assert owner.claim.complete("v", 1) is True  # type: ignore[union-attr]
    assert waiter.future.result(timeout=WAIT_S) == "v"  # type: ignore[union-attr]
    assert cache.lookup(text_key("x")).value == "v"
