"""The answer to ``SegmentCache.lookup``: hit, pending or miss.

    kind      carries   the caller then
    HIT       value     uses it; nothing to compute
    PENDING   future    waits (asyncio: ``await asyncio.wrap_future(future)``)
    MISS      claim     computes, then ``claim.complete(value, size_bytes)``,
                        ``claim.fail(exc)`` or ``claim.abandon()``

:meth:`CacheLookup.as_future` gives one future for all three kinds, for code
that only wants to gather results.
"""

from __future__ import annotations

import enum
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Generic, TypeVar

from cache.claim import Claim
from cache.keys import SegmentKey

V = TypeVar("V")


class LookupKind(str, enum.Enum):
    HIT = "hit"
    PENDING = "pending"
    MISS = "miss"


@dataclass(frozen=True, slots=True)
class CacheLookup(Generic[V]):
    """Typed result of a lookup; build it with :meth:`hit`, :meth:`pending` or :meth:`miss`."""

    kind: LookupKind
    key: SegmentKey
    value: V | None = None
    future: Future[V] | None = None
    claim: Claim[V] | None = None

    @classmethod
    def hit(cls, key: SegmentKey, value: V) -> CacheLookup[V]:
        return cls(LookupKind.HIT, key, value=value)

    @classmethod
    def pending(cls, key: SegmentKey, future: Future[V]) -> CacheLookup[V]:
        return cls(LookupKind.PENDING, key, future=future)

    @classmethod
    def miss(cls, key: SegmentKey, claim: Claim[V]) -> CacheLookup[V]:
        return cls(LookupKind.MISS, key, claim=claim)

    @property
    def is_hit(self) -> bool:
        return self.kind is LookupKind.HIT

    @property
    def is_pending(self) -> bool:
        return self.kind is LookupKind.PENDING

    @property
    def is_miss(self) -> bool:
        return self.kind is LookupKind.MISS

    def as_future(self) -> Future[V]:
        """A future of the segment's value: done for a hit, shared for pending/miss."""
        if self.kind is LookupKind.HIT:
            done: Future[V] = Future()
            done.set_result(self.value)  # type: ignore[arg-type]  # a hit always has a value
            return done
        if self.kind is LookupKind.PENDING:
            assert self.future is not None
            return self.future
        assert self.claim is not None
        return self.claim.future
