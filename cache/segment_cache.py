"""The facade the router calls: store lookups plus single-flight.

    SegmentCache
    +-- store       SegmentStore: image LRU | text LRU  (byte budgets)
    +-- in_flight   {SegmentKey: Future}  one entry per segment being computed

    lookup(key), under one lock:
      1. in the store?       -> hit(value)                     event: hit
      2. being computed?     -> pending(shared future)         event: coalesced
      3. otherwise           -> miss(claim), key now in flight event: miss

Completing a claim stores the value *before* removing the key from the
in-flight table, so every lookup in between sees one or the other and a
segment is never computed twice while its result is on the way. Duplicates
inside one batch fall out of this: the first occurrence gets the claim, the
others get its future.

A modality whose budget is 0 is off: its lookups behave like :meth:`bypass`
(no reads, no writes, no coalescing, no events).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Generic, TypeVar

from cache.claim import Claim, new_shared_future
from cache.events import CacheEvent, EventCallback, EventEmitter
from cache.keys import Modality, SegmentKey
from cache.lookup import CacheLookup
from cache.store import CacheStats, SegmentStore

V = TypeVar("V")


def _bypass_publish(value: object, size_bytes: int) -> bool:
    return False


def _bypass_release() -> None:
    return None


class SegmentCache(Generic[V]):
    """Content-addressed segment cache with single-flight.

    Args:
        image_budget_bytes: Bytes of image segments kept (``MMSERVE_CACHE_IMAGE_BYTES``); 0 disables.
        text_budget_bytes: Bytes of text segments kept (``MMSERVE_CACHE_TEXT_BYTES``); 0 disables.
        on_event: ``on_event(modality, event, count)`` for
            ``mmserve_cache_events_total``; see :mod:`cache.events`.
    """

    def __init__(
        self,
        image_budget_bytes: int,
        text_budget_bytes: int,
        on_event: EventCallback | None = None,
    ) -> None:
        self._store: SegmentStore[V] = SegmentStore(image_budget_bytes, text_budget_bytes, on_event)
        self._events = EventEmitter(on_event)
        self._lock = threading.Lock()  # guards _in_flight and the store-then-in-flight check
        self._in_flight: dict[SegmentKey, Future[V]] = {}

    @property
    def store(self) -> SegmentStore[V]:
        return self._store

    @property
    def num_in_flight(self) -> int:
        """Segments claimed and not yet resolved."""
        with self._lock:
            return len(self._in_flight)

    def is_enabled(self, modality: Modality) -> bool:
        return self._store.is_enabled(modality)

    def lookup(self, key: SegmentKey) -> CacheLookup[V]:
        """Hit, pending (coalesced onto the owner's future) or miss (the caller now owns it)."""
        if not self._store.is_enabled(key.modality):
            return self.bypass(key)
        with self._lock:
            value = self._store.get(key)
            if value is not None:
                result = CacheLookup.hit(key, value)
                event = CacheEvent.HIT
            elif (future := self._in_flight.get(key)) is not None:
                result = CacheLookup.pending(key, future)
                event = CacheEvent.COALESCED
            else:
                future = new_shared_future()
                self._in_flight[key] = future
                result = CacheLookup.miss(key, self._new_claim(key, future))
                event = CacheEvent.MISS
        self._events.emit(key.modality, event)
        return result

    def lookup_many(self, keys: Sequence[SegmentKey]) -> list[CacheLookup[V]]:
        """``lookup`` of each key, in order, under one lock, each kind of event emitted once with its count.

        For a request of many segments (a thousand labels): one lock and a
        few metric updates instead of a thousand. The keys must be distinct
        (a repeat would coalesce onto this caller's own claim).
        """
        if len(set(keys)) != len(keys):
            raise ValueError("lookup_many takes distinct keys")
        results: list[CacheLookup[V]] = []
        counts: Counter[tuple[Modality, CacheEvent]] = Counter()
        with self._lock:
            for key in keys:
                if not self._store.is_enabled(key.modality):
                    results.append(self.bypass(key))
                    continue
                value = self._store.get(key)
                if value is not None:
                    results.append(CacheLookup.hit(key, value))
                    counts[key.modality, CacheEvent.HIT] += 1
                elif (future := self._in_flight.get(key)) is not None:
                    results.append(CacheLookup.pending(key, future))
                    counts[key.modality, CacheEvent.COALESCED] += 1
                else:
                    future = new_shared_future()
                    self._in_flight[key] = future
                    results.append(CacheLookup.miss(key, self._new_claim(key, future)))
                    counts[key.modality, CacheEvent.MISS] += 1
        for (modality, event), count in counts.items():
            self._events.emit(modality, event, count)
        return results

    def bypass(self, key: SegmentKey) -> CacheLookup[V]:
        """A miss whose claim touches nothing: for requests with ``use_cache: false``.

        The claim's future still carries the result, so callers treat it like
        any other miss; ``complete`` returns False and stores nothing.
        """
        claim: Claim[V] = Claim(key, new_shared_future(), _bypass_publish, _bypass_release)
        return CacheLookup.miss(key, claim)

    def clear(self) -> int:
        """Drop every stored entry (``DELETE /v1/cache``); returns how many were dropped.

        Segments in flight are not interrupted; they are stored when they
        complete. Keys carry the model fingerprint, so clearing is never
        needed for correctness after a model change.
        """
        return self._store.clear()

    def stats(self) -> CacheStats:
        return self._store.stats()

    def _new_claim(self, key: SegmentKey, future: Future[V]) -> Claim[V]:
        def publish(value: V, size_bytes: int) -> bool:
            return self._store.put(key, value, size_bytes)

        def release() -> None:
            with self._lock:
                if self._in_flight.get(key) is future:
                    del self._in_flight[key]

        return Claim(key, future, publish, release)
