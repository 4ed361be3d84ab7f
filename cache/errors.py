"""Typed errors of the segment cache.

Shortage is not an error here: a value that does not fit is refused with a
``False`` return. These exceptions mark misuse of the API, or a waiter whose
owner walked away.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cache.keys import SegmentKey


class CacheError(Exception):
    """Base class of everything the cache raises."""


class InvalidKeyInputError(CacheError, ValueError):
    """Key material is malformed (e.g. pixel bytes that do not match the shape)."""


class InvalidSizeError(CacheError, ValueError):
    """A size or budget in bytes is not a non-negative int (or not positive, for values)."""


class ClaimAlreadyResolvedError(CacheError, RuntimeError):
    """``complete`` or ``fail`` was called on a claim that was already resolved."""


class ClaimAbandonedError(CacheError):
    """The owner of an in-flight segment gave up before producing it.

    Waiters that were coalesced onto the owner's future receive this error.
    The claim is gone from the in-flight table when they see it, so calling
    ``SegmentCache.lookup`` again makes exactly one retrier the new owner.
    """

    def __init__(self, key: SegmentKey) -> None:
        super().__init__(f"owner abandoned the computation of {key!r}; look the segment up again")
        self.key = key
