"""One byte-bounded LRU partition: the eviction order and the byte count.

    least recently used                               most recently used
    +----------+----------+----------+----------+ - - - - - - - +
    | k0  3 MB | k1  1 MB | k2  2 MB | k3  1 MB |   free 1 MB   |  budget 8 MB
    +----------+----------+----------+----------+ - - - - - - - +
      ^ evicted first                  ^ get(k1) moves k1 here

    put(k4, 3 MB): evicts k0 (frees 3 MB, now 4 MB free), then appends k4.
    put(k5, 9 MB): larger than the budget; refused, nothing is evicted.

Not thread-safe: :class:`cache.store.SegmentStore` holds the lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

from cache.errors import InvalidSizeError

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def check_budget_bytes(budget_bytes: int) -> int:
    """A budget is a non-negative int; 0 means the partition is disabled."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
        raise InvalidSizeError(f"budget_bytes must be an int >= 0, got {budget_bytes!r}")
    return budget_bytes


def check_value_size_bytes(size_bytes: int) -> int:
    """A value's size is a positive int: zero-byte entries would make the entry count unbounded."""
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes <= 0:
        raise InvalidSizeError(f"size_bytes must be an int > 0, got {size_bytes!r}")
    return size_bytes


class ByteBoundedLru(Generic[K, V]):
    """LRU map whose summed entry sizes never exceed ``budget_bytes``."""

    def __init__(self, budget_bytes: int) -> None:
        self._budget_bytes = check_budget_bytes(budget_bytes)
        # key -> (value, size_bytes); iteration order is LRU first, MRU last.
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._used_bytes = 0

    @property
    def budget_bytes(self) -> int:
        return self._budget_bytes

    @property
    def used_bytes(self) -> int:
        return self._used_bytes

    @property
    def num_entries(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def keys(self) -> tuple[K, ...]:
        """Keys in eviction order: the first one goes first."""
        return tuple(self._entries)

    def get(self, key: K) -> V | None:
        """The value, made most recently used; ``None`` if absent."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: K, value: V, size_bytes: int) -> tuple[K, ...] | None:
        """Insert ``key`` as most recently used, evicting from the LRU end until it fits.

        Returns the evicted keys in eviction order (empty if none had to go),
        or ``None`` when the value can never fit (larger than the budget, or
        the partition is disabled); a refused put evicts nothing. A key that
        is already present keeps its first value (keys are content digests,
        so the value is the same) and only becomes most recently used.
        """
        check_value_size_bytes(size_bytes)
        if key in self._entries:
            self._entries.move_to_end(key)
            return ()
        if size_bytes > self._budget_bytes:
            return None
        evicted: list[K] = []
        while self._used_bytes + size_bytes > self._budget_bytes:
            old_key, (_, old_size_bytes) = self._entries.popitem(last=False)
            self._used_bytes -= old_size_bytes
            evicted.append(old_key)
        self._entries[key] = (value, size_bytes)
        self._used_bytes += size_bytes
        return tuple(evicted)

    def clear(self) -> int:
        """Drop every entry; returns how many there were."""
        num_removed = len(self._entries)
        self._entries.clear()
        self._used_bytes = 0
        return num_removed
