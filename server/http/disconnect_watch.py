"""Tell a request that its client went away, from the HTTP protocol itself: no watcher task per request.

ASGI tells an app of a disconnect through ``receive()``: a request that wants
to know while it waits for its answer needs a task of its own awaiting
``receive()`` through every middleware, started, and cancelled when the
answer is ready: an event-loop task and a cancellation per request. The
protocol learns it first, in ``connection_lost``; ``DisconnectNotice`` (mixed
into the protocol class ``mmserve serve`` gives uvicorn) puts a
``DisconnectWatch`` in each request's scope and fires it there:

    data_received        a request's scope is new -> scope[SCOPE_KEY] = DisconnectWatch()
    the request layer    watch.add(callback) while it awaits the answer; watch.remove(callback) after
    connection_lost      the request on the connection is unanswered -> watch.fire(): each callback once

It fires exactly when uvicorn marks the request disconnected (the same
request, the same condition), which is when ``receive()`` would have said
``http.disconnect``. A request whose scope has no watch (another server, a
request uvicorn started from a pipelined chunk) keeps the watcher task
(``server.http.client_disconnect.until_disconnected``).
"""

from __future__ import annotations

from collections.abc import Callable

SCOPE_KEY = "mmserve.disconnect_watch"


class DisconnectWatch:
    """One request's disconnect: callbacks to run once when its client goes away (event loop only)."""

    __slots__ = ("_callbacks", "is_disconnected")

    def __init__(self) -> None:
        self._callbacks: list[Callable[[], None]] = []
        self.is_disconnected = False

    def add(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the client goes away (at once, soon, if it is gone already)."""
        self._callbacks.append(callback)

    def remove(self, callback: Callable[[], None]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def fire(self) -> None:
        """The client went away: every callback, once."""
        if self.is_disconnected:
            return
        self.is_disconnected = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


class DisconnectNotice:
    """A uvicorn HTTP protocol mixin (before the protocol class): a ``DisconnectWatch`` per request.

    Uses the protocol's ``cycle`` (the request being answered or started
    last), as uvicorn's own ``connection_lost`` does.
    """

    cycle: object | None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        cycle = self.cycle
        if cycle is not None and SCOPE_KEY not in cycle.scope:  # type: ignore[attr-defined]
            cycle.scope[SCOPE_KEY] = DisconnectWatch()  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = self.cycle
        super().connection_lost(exc)  # type: ignore[misc]
        if cycle is not None and getattr(cycle, "disconnected", False):  # uvicorn marked it, as receive() says
            watch = cycle.scope.get(SCOPE_KEY)  # type: ignore[attr-defined]
            if watch is not None:
                watch.fire()
