"""Single-flight: one computation per missing segment, whoever waits and however."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import pytest

from cache import (
    ClaimAbandonedError,
    ClaimAlreadyResolvedError,
    LookupKind,
    SegmentCache,
)

from segment_fixtures import EventLog, image_key, text_key

WAIT_S = 10.0


def test_n_thread_waiters_share_one_computation(event_log: EventLog) -> None:
    num_threads = 8
    cache: SegmentCache[object] = SegmentCache(1_000, 1_000, on_event=event_log)
    key = image_key("cat.jpg")
    all_looked_up = threading.Barrier(num_threads)
    num_computes = 0
    kinds: list[LookupKind] = []
    results: list[object] = []
    lock = threading.Lock()

    def request() -> None:
        nonlocal num_computes
        found = cache.lookup(key)
        with lock:
            kinds.append(found.kind)
        all_looked_up.wait(timeout=WAIT_S)  # every lookup happens while the segment is in flight
        if found.is_miss:
            with lock:
                num_computes += 1
            value = object()
            assert found.claim is not None
            found.claim.complete(value, 100)
        else:
            assert found.future is not None
            value = found.future.result(timeout=WAIT_S)
        with lock:
            results.append(value)

    threads = [threading.Thread(target=request) for _ in range(num_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=WAIT_S)

    assert num_computes == 1
    assert sorted(kinds) == sorted([LookupKind.MISS] + [LookupKind.PENDING] * (num_threads - 1))
    assert len(results) == num_threads
    assert all(value is results[0] for value in results)  # the very same object, computed once
    assert cache.num_in_flight == 0
    assert cache.lookup(key).value is results[0]
    assert event_log.totals() == {
        ("image", "miss"): 1,
        ("image", "coalesced"): num_threads - 1,
        ("image", "insert"): 1,
        ("image", "hit"): 1,
    }


def test_exception_reaches_every_waiter_and_is_not_cached(event_log: EventLog) -> None:
    cache: SegmentCache[str] = SegmentCache(1_000, 1_000, on_event=event_log)
    key = text_key("hello")
    owner = cache.lookup(key)
    waiters = [cache.lookup(key) for _ in range(3)]
    assert owner.is_miss and all(w.is_pending for w in waiters)

    boom = RuntimeError("encoder blew up")
    assert owner.claim is not None
    owner.claim.fail(boom)

    for waiter in waiters:
        assert waiter.future is not None
        assert waiter.future.exception(timeout=WAIT_S) is boom
    assert cache.num_in_flight == 0
    assert cache.stats().text.num_entries == 0
    retry = cache.lookup(key)
    assert retry.is_miss  # the failure was not cached
    assert event_log.totals() == {("text", "miss"): 2, ("text", "coalesced"): 3}


def test_abandon_fails_waiters_with_typed_error_then_one_retrier_owns() -> None:
    cache: SegmentCache[str] = SegmentCache(1_000, 1_000)
    key = image_key("dog.png")
    owner = cache.lookup(key)
    waiters = [cache.lookup(key) for _ in range(3)]
    assert owner.claim is not None
    owner.claim.abandon()

    for waiter in waiters:
        assert waiter.future is not None
        error = waiter.future.exception(timeout=WAIT_S)
        assert isinstance(error, ClaimAbandonedError)
        assert error.key == key
    assert cache.num_in_flight == 0

    # Each waiter retries: the first becomes the owner, the rest coalesce onto it.
    retries = [cache.lookup(key) for _ in waiters]
    assert [r.kind for r in retries] == [LookupKind.MISS, LookupKind.PENDING, LookupKind.PENDING]
    assert retries[0].claim is not None
    retries[0].claim.complete("dog", 10)
    assert [r.as_future().result(timeout=WAIT_S) for r in retries] == ["dog", "dog", "dog"]


def test_claim_resolves_exactly_once() -> None:
    cache: SegmentCache[str] = SegmentCache(1_000, 1_000)
    claim = cache.lookup(text_key("once")).claim
    assert claim is not None
    assert claim.complete("v", 1) is True
    claim.abandon()  # no-op once resolved, so it can sit in a finally block
    with pytest.raises(ClaimAlreadyResolvedError):
        claim.complete("w", 1)
    with pytest.raises(ClaimAlreadyResolvedError):
        claim.fail(RuntimeError("late"))
    assert claim.future.result(timeout=WAIT_S) == "v"
    assert cache.lookup(text_key("once")).value == "v"


def test_claim_as_context_manager_fails_on_error_and_abandons_on_cancel() -> None:
    cache: SegmentCache[str] = SegmentCache(1_000, 1_000)

    failing = cache.lookup(text_key("a"))
    waiter = cache.lookup(text_key("a"))
    with pytest.raises(ValueError):
        with failing.claim as claim:  # type: ignore[union-attr]
            raise ValueError("bad tokens")
    assert claim.is_resolved
    assert isinstance(waiter.future.exception(timeout=WAIT_S), ValueError)  # type: ignore[union-attr]

    cancelled = cache.lookup(text_key("b"))
    waiter = cache.lookup(text_key("b"))
    with pytest.raises(asyncio.CancelledError):
        with cancelled.claim:  # type: ignore[union-attr]
            raise asyncio.CancelledError
    assert isinstance(waiter.future.exception(timeout=WAIT_S), ClaimAbandonedError)  # type: ignore[union-attr]

    forgotten = cache.lookup(text_key("c"))
    waiter = cache.lookup(text_key("c"))
    with forgotten.claim:  # type: ignore[union-attr]
        pass
    assert isinstance(waiter.future.exception(timeout=WAIT_S), ClaimAbandonedError)  # type: ignore[union-attr]
    assert cache.num_in_flight == 0


def test_asyncio_waiters_via_wrap_future() -> None:
    cache: SegmentCache[str] = SegmentCache(1_000, 1_000)
    key = image_key("async.jpg")
    num_computes = 0

    def compute_on_thread(found) -> None:
        nonlocal num_computes
        num_computes += 1
        found.claim.complete("embedding", 64)

    async def request() -> str:
        found = cache.lookup(key)
        if found.is_miss:
            # The owner computes off the event loop, as the router's compute thread does.
            threading.Thread(target=compute_on_thread, args=(found,)).start()
        return await asyncio.wait_for(asyncio.wrap_future(found.as_future()), timeout=WAIT_S)

    async def main() -> list[str]:
        return await asyncio.gather(*(request() for _ in range(5)))

    assert asyncio.run(main()) == ["embedding"] * 5
    assert num_computes == 1


def test_cancelling_one_asyncio_waiter_does_not_cancel_the_others() -> None:
    cache: SegmentCache[str] = SegmentCache(1_000, 1_000)
    key = text_key("shared")
    owner = cache.lookup(key)
    assert owner.claim is not None

    async def main() -> tuple[bool, str]:
        leaving = asyncio.ensure_future(asyncio.wrap_future(cache.lookup(key).as_future()))
        staying = asyncio.ensure_future(asyncio.wrap_future(cache.lookup(key).as_future()))
        await asyncio.sleep(0)
        leaving.cancel()
        await asyncio.sleep(0)
        assert not owner.claim.future.cancelled()
        owner.claim.complete("q", 8)  # must not raise InvalidStateError
        return leaving.cancelled(), await asyncio.wait_for(staying, timeout=WAIT_S)

    assert asyncio.run(main()) == (True, "q")


def test_batch_duplicates_are_computed_once() -> None:
    cache: SegmentCache[str] = SegmentCache(1_000, 1_000)
    batch = ["a", "b", "a", "c", "a", "b"]
    found = [cache.lookup(text_key(name)) for name in batch]
    assert [f.kind for f in found] == [
        LookupKind.MISS,
        LookupKind.MISS,
        LookupKind.PENDING,
        LookupKind.MISS,
        LookupKind.PENDING,
        LookupKind.PENDING,
    ]

    computed: list[str] = []
    for name, f in zip(batch, found):
        if f.is_miss:
            computed.append(name)
            f.claim.complete(name.upper(), 4)  # type: ignore[union-attr]
    assert computed == ["a", "b", "c"]
    assert [f.as_future().result(timeout=WAIT_S) for f in found] == ["A", "B", "A", "C", "A", "B"]


def test_value_too_large_still_reaches_waiters_but_is_not_stored(event_log: EventLog) -> None:
    cache: SegmentCache[str] = SegmentCache(100, 100, on_event=event_log)
    key = image_key("huge.png")
    owner = cache.lookup(key)
    waiter = cache.lookup(key)
    assert owner.claim.complete("big", 101) is False  # type: ignore[union-attr]
    assert waiter.future.result(timeout=WAIT_S) == "big"  # type: ignore[union-attr]
    assert cache.lookup(key).is_miss
    assert event_log.totals() == {("image", "miss"): 2, ("image", "coalesced"): 1, ("image", "refused"): 1}


def test_result_is_stored_before_the_key_leaves_the_in_flight_table() -> None:
    """A lookup racing the owner's completion sees the stored value, never a fresh miss."""
    seen: list[tuple[int, LookupKind]] = []
    key = text_key("race")

    def on_event(modality: str, event: str, count: int) -> None:
        if event == "insert":  # emitted once the value is in the store
            seen.append((cache.num_in_flight, cache.lookup(key).kind))

    cache: SegmentCache[str] = SegmentCache(100, 100, on_event=on_event)
    cache.lookup(key).claim.complete("value", 5)  # type: ignore[union-attr]
    # Still in flight when the value lands, so no lookup can fall between the two.
    assert seen == [(1, LookupKind.HIT)]
    assert cache.num_in_flight == 0


def test_invalid_size_fails_waiters_and_raises_to_owner() -> None:
    cache: SegmentCache[str] = SegmentCache(100, 100)
    owner = cache.lookup(text_key("x"))
    waiter = cache.lookup(text_key("x"))
    with pytest.raises(ValueError):
        owner.claim.complete("v", 0)  # type: ignore[union-attr]
    assert isinstance(waiter.future.exception(timeout=WAIT_S), ValueError)  # type: ignore[union-attr]
    assert cache.num_in_flight == 0


def test_shared_future_cannot_be_cancelled() -> None:
    cache: SegmentCache[str] = SegmentCache(100, 100)
    owner = cache.lookup(text_key("x"))
    future: Future[str] = cache.lookup(text_key("x")).future  # type: ignore[assignment]
    assert future.cancel() is False
    owner.claim.complete("v", 1)  # type: ignore[union-attr]
    assert future.result(timeout=WAIT_S) == "v"
