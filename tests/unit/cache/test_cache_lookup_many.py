"""``SegmentCache.lookup_many``: what ``lookup`` gives per key, under one lock, each event kind emitted once."""

from __future__ import annotations

import pytest

from cache import LookupKind, SegmentCache

from segment_fixtures import EventLog, text_key


def test_each_key_gets_what_lookup_would_give_and_events_come_counted(event_log: EventLog) -> None:
    cache: SegmentCache[str] = SegmentCache(1_000, 1_000, on_event=event_log)
    cached, in_flight, new = text_key("cat"), text_key("dog"), text_key("car")
    cache.lookup(cached).claim.complete("cat-segment", 10)
    owner = cache.lookup(in_flight)
    event_log.calls.clear()
    found = cache.lookup_many([cached, in_flight, new])
    assert [f.kind for f in found] == [LookupKind.HIT, LookupKind.PENDING, LookupKind.MISS]
    assert found[0].value == "cat-segment"
    assert found[1].future is owner.claim.future
    assert sorted(event_log.calls) == [("text", "coalesced", 1), ("text", "hit", 1), ("text", "miss", 1)]
    found[2].claim.complete("car-segment", 10)  # the miss is a real claim: a later lookup hits
    assert cache.lookup(new).value == "car-segment"


def test_a_hundred_hits_are_one_event_call(event_log: EventLog) -> None:
    cache: SegmentCache[str] = SegmentCache(100_000, 100_000, on_event=event_log)
    keys = [text_key(f"label {i}") for i in range(100)]
    for key in keys:
        cache.lookup(key).claim.complete("segment", 10)
    event_log.calls.clear()
    assert all(found.kind == LookupKind.HIT for found in cache.lookup_many(keys))
    assert event_log.calls == [("text", "hit", 100)]


def test_a_disabled_modality_bypasses_and_repeated_keys_are_refused(event_log: EventLog) -> None:
    cache: SegmentCache[str] = SegmentCache(1_000, 0, on_event=event_log)
    found = cache.lookup_many([text_key("cat")])
    assert found[0].kind == LookupKind.MISS and not found[0].claim.complete("x", 1)  # a bypass claim stores nothing
    assert cache.num_in_flight == 0
    with pytest.raises(ValueError, match="distinct"):
        cache.lookup_many([text_key("cat"), text_key("cat")])
