"""Cache events and the callback that reports them.

The cache counts what happens to it but exports nothing itself: the server
passes ``on_event(modality, event, count)`` and turns it into
``mmserve_cache_events_total{modality,event}``. Who emits what:

    SegmentCache.lookup   hit | miss | coalesced   exactly one per lookup
    SegmentStore.put      insert, eviction (count = entries evicted by that put),
                          refused (value larger than its modality's budget)

``clear()`` emits nothing: it is an operator action, not cache pressure.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable

from cache.keys import Modality

logger = logging.getLogger(__name__)

EventCallback = Callable[[str, str, int], None]
"""``on_event(modality: str, event: str, count: int)``; must be quick and thread-safe."""


class CacheEvent(str, enum.Enum):
    """Event names, as they appear in the ``event`` label."""

    HIT = "hit"
    MISS = "miss"
    COALESCED = "coalesced"
    INSERT = "insert"
    EVICTION = "eviction"
    REFUSED = "refused"


class EventEmitter:
    """Calls the injected callback, never with a cache lock held.

    A failing metrics callback must not leave the cache half-updated or a
    waiter hanging, so its errors are logged here and go no further.
    """

    def __init__(self, on_event: EventCallback | None) -> None:
        self._on_event = on_event

    def emit(self, modality: Modality, event: CacheEvent, count: int = 1) -> None:
        if self._on_event is None or count <= 0:
            return
        try:
            self._on_event(modality.value, event.value, count)
        except Exception:
            logger.exception("cache event callback failed for %s/%s", modality.value, event.value)
