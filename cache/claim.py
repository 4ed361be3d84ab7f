"""The owner's handle on an in-flight segment, and the future its waiters share.

    lookup(k) -> miss(claim)        owner: computes, then resolves the claim
    lookup(k) -> pending(future)    waiters: hold claim.future, compute nothing
    lookup(k) -> pending(future)

    claim.complete(value, size_bytes)   store (if it fits) -> release -> future = value
    claim.fail(exc)                     release -> future raises exc (nothing cached)
    claim.abandon()                     release -> future raises ClaimAbandonedError

"Release" removes the key from the in-flight table, so the next lookup after
a failure or an abandonment is a plain miss with a fresh claim. Abandoning
fails the waiters rather than handing the claim to one of them: a waiter may
itself be gone (cancelled, timed out), and a typed error lets each live one
decide to retry, of which exactly one becomes the next owner.

The shared future is put into the RUNNING state when it is made, so it
cannot be cancelled: one asyncio waiter cancelled through
``asyncio.wrap_future`` must not cancel the computation for all the others.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from types import TracebackType
from typing import Generic, TypeVar

from cache.errors import ClaimAbandonedError, ClaimAlreadyResolvedError
from cache.keys import SegmentKey

V = TypeVar("V")

PublishFn = Callable[[V, int], bool]
"""Stores the value with its size; returns whether it was stored."""
ReleaseFn = Callable[[], None]
"""Removes the claim's key from the in-flight table."""


def new_shared_future() -> Future[V]:
    """A future in the RUNNING state: it can be resolved but no longer cancelled."""
    future: Future[V] = Future()
    future.set_running_or_notify_cancel()
    return future


class Claim(Generic[V]):
    """Ownership of one missing segment; resolve it exactly once.

    Use it as a context manager to make sure it is resolved: leaving the
    block with an ``Exception`` fails the claim with it (waiters see the same
    error), leaving it any other way without resolving abandons it
    (e.g. ``asyncio.CancelledError`` before the compute ran).
    """

    def __init__(self, key: SegmentKey, future: Future[V], publish: PublishFn[V], release: ReleaseFn) -> None:
        self._key = key
        self._future = future
        self._publish = publish
        self._release = release
        self._lock = threading.Lock()
        self._is_resolved = False

    @property
    def key(self) -> SegmentKey:
        return self._key

    @property
    def future(self) -> Future[V]:
        """The future every coalesced waiter holds; resolved by this claim."""
        return self._future

    @property
    def is_resolved(self) -> bool:
        return self._is_resolved

    def _resolve_once(self) -> None:
        with self._lock:
            if self._is_resolved:
                raise ClaimAlreadyResolvedError(f"claim for {self._key!r} is already resolved")
            self._is_resolved = True

    def complete(self, value: V, size_bytes: int) -> bool:
        """Hand ``value`` to every waiter and store it if it fits.

        Returns whether the value was stored (False: larger than the budget,
        modality disabled, or a bypass claim). Waiters get the value either way.
        """
        self._resolve_once()
        try:
            is_stored = self._publish(value, size_bytes)
        except BaseException as exc:
            self._release()
            self._future.set_exception(exc)
            raise
        self._release()
        self._future.set_result(value)
        return is_stored

    def fail(self, exc: BaseException) -> None:
        """Raise ``exc`` in every waiter; nothing is cached, the next lookup misses."""
        self._resolve_once()
        self._release()
        self._future.set_exception(exc)

    def abandon(self) -> None:
        """Give the segment up without a result; waiters get :class:`ClaimAbandonedError`.

        A no-op on a resolved claim, so it is safe in a ``finally`` block.
        """
        with self._lock:
            if self._is_resolved:
                return
            self._is_resolved = True
        self._release()
        self._future.set_exception(ClaimAbandonedError(self._key))

    def __enter__(self) -> Claim[V]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._is_resolved:
            return
        if isinstance(exc, Exception):
            try:
                self.fail(exc)
            except ClaimAlreadyResolvedError:
                pass  # resolved by another thread in between; nothing left to do
        else:
            self.abandon()

    def __repr__(self) -> str:
        return f"Claim({self._key!r}, is_resolved={self._is_resolved})"
