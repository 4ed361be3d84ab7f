"""Thread-safe, byte-bounded segment store: one LRU partition per modality.

    SegmentStore
    +-- image  ByteBoundedLru   budget = image_budget_bytes  (0: disabled)
    |     [LRU] img_a 4 MB | img_b 4 MB | img_c 4 MB [MRU]    12 / 16 MB
    +-- text   ByteBoundedLru   budget = text_budget_bytes   (0: disabled)
          [LRU] txt_a 8 KB | txt_b 2 KB [MRU]                 10 / 64 KB

Modalities never evict each other: a burst of large images cannot push out
every cached text. Byte accounting is exactly the ``size_bytes`` the caller
gives for each value (it knows its tensors' sizes). One lock guards both
partitions; event callbacks run after the lock is released.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Generic, TypeVar

from cache.events import CacheEvent, EventCallback, EventEmitter
from cache.keys import Modality, SegmentKey
from cache.lru import ByteBoundedLru, check_value_size_bytes

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class ModalityStats:
    """One partition's occupancy, read at one instant."""

    modality: Modality
    budget_bytes: int
    size_bytes: int
    num_entries: int


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Occupancy of both partitions, read under one lock acquisition."""

    image: ModalityStats
    text: ModalityStats

    def of(self, modality: Modality) -> ModalityStats:
        return self.image if modality is Modality.IMAGE else self.text

    @property
    def size_bytes(self) -> int:
        return self.image.size_bytes + self.text.size_bytes

    @property
    def num_entries(self) -> int:
        return self.image.num_entries + self.text.num_entries


class SegmentStore(Generic[V]):
    """Byte-bounded LRU per modality.

    Args:
        image_budget_bytes: Bytes the image partition may hold; 0 disables it.
        text_budget_bytes: Bytes the text partition may hold; 0 disables it.
        on_event: Receives ``insert``, ``eviction`` and ``refused`` events.
            Lookups (``hit``/``miss``/``coalesced``) are counted by
            :class:`cache.segment_cache.SegmentCache`, which alone knows
            whether a miss was coalesced; :meth:`get` counts nothing.
    """

    def __init__(
        self,
        image_budget_bytes: int,
        text_budget_bytes: int,
        on_event: EventCallback | None = None,
    ) -> None:
        self._partitions: dict[Modality, ByteBoundedLru[SegmentKey, V]] = {
            Modality.IMAGE: ByteBoundedLru(image_budget_bytes),
            Modality.TEXT: ByteBoundedLru(text_budget_bytes),
        }
        self._lock = threading.Lock()
        self._events = EventEmitter(on_event)

    def is_enabled(self, modality: Modality) -> bool:
        """False when the modality's budget is 0: nothing is ever stored for it."""
        return self._partitions[modality].budget_bytes > 0

    def get(self, key: SegmentKey) -> V | None:
        """The cached value, made most recently used; ``None`` on a miss."""
        with self._lock:
            return self._partitions[key.modality].get(key)

    def put(self, key: SegmentKey, value: V, size_bytes: int) -> bool:
        """Store ``value`` (``size_bytes`` as the caller measured it), evicting LRU entries.

        Returns False, and evicts nothing, when the value cannot fit: larger
        than its modality's budget, or the modality is disabled. A key that is
        already present stays as it is (made most recently used) and counts
        as stored. ``value`` must not be ``None`` (``None`` means a miss).
        """
        check_value_size_bytes(size_bytes)
        if value is None:
            raise ValueError("None cannot be cached: get() returns None for a miss")
        partition = self._partitions[key.modality]
        with self._lock:
            is_new = key not in partition
            evicted = partition.put(key, value, size_bytes)
            is_disabled = partition.budget_bytes == 0
        if evicted is None:
            if not is_disabled:
                self._events.emit(key.modality, CacheEvent.REFUSED)
            return False
        if is_new:
            self._events.emit(key.modality, CacheEvent.EVICTION, len(evicted))
            self._events.emit(key.modality, CacheEvent.INSERT)
        return True

    def keys(self, modality: Modality) -> tuple[SegmentKey, ...]:
        """The modality's keys in eviction order (first evicted first)."""
        with self._lock:
            return self._partitions[modality].keys()

    def clear(self) -> int:
        """Empty both partitions (``DELETE /v1/cache``); returns the number of entries dropped."""
        with self._lock:
            return sum(partition.clear() for partition in self._partitions.values())

    def stats(self) -> CacheStats:
        """Bytes and entries per modality, for ``mmserve_cache_bytes{modality}``."""
        with self._lock:
            image, text = (
                ModalityStats(
                    modality=modality,
                    budget_bytes=self._partitions[modality].budget_bytes,
                    size_bytes=self._partitions[modality].used_bytes,
                    num_entries=self._partitions[modality].num_entries,
                )
                for modality in (Modality.IMAGE, Modality.TEXT)
            )
        return CacheStats(image=image, text=text)
