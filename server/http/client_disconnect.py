"""Noticing that an HTTP client went away, so its request's work is cancelled rather than finished for nobody.

A request whose client disconnected must never reach the model: ``until_disconnected`` runs the work
in the request's own task and cancels that task on the disconnect, turning its ``CancelledError`` into
``ClientDisconnectedError``, which the request layer answers as the client's 499 (a gRPC call that
is cancelled raises the same error from its own watcher).
"""
from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request

from server.http.disconnect_watch import SCOPE_KEY as DISCONNECT_WATCH, DisconnectWatch

T = TypeVar("T")


class ClientDisconnectedError(Exception):
    """The client closed the connection before its answer was ready."""


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client goes away first; then cancel it.

    Cancelling the intake cancels its queued items, so a request whose client
    disconnected never reaches the model. ``work`` runs in the request's own
    task, and a disconnect cancels that task, whose ``CancelledError``
    becomes ``ClientDisconnectedError``. The disconnect comes from the HTTP
    protocol's ``DisconnectWatch`` in the scope (``server.http.disconnect_watch``:
    a callback, no task); without one, from a watcher task awaiting ``receive()``.
    """
    task = asyncio.current_task()
    assert task is not None
    is_disconnected = is_finished = False

    def on_disconnect() -> None:
        nonlocal is_disconnected
        if is_finished:  # a watcher's done-callback runs a loop turn after it ended: too late to cancel
            return
        is_disconnected = True
        task.cancel()

    watch: DisconnectWatch | None = request.scope.get(DISCONNECT_WATCH)
    if watch is not None:
        watch.add(on_disconnect)
        stop_watching: Callable[[], object] = functools.partial(watch.remove, on_disconnect)
    else:
        stop_watching = _watcher_task(request, on_disconnect).cancel
    try:
        return await work
    except asyncio.CancelledError:
        if not is_disconnected:
            raise
        task.uncancel()
        raise ClientDisconnectedError() from None
    finally:
        is_finished = True  # a disconnect noticed from here on cancels nothing
        stop_watching()


def _watcher_task(request: Request, on_disconnect: Callable[[], None]) -> asyncio.Future:
    """A task that calls ``on_disconnect`` when ``receive()`` says the client went away (cancel it to stop)."""
    def on_done(watcher: asyncio.Future) -> None:
        if not watcher.cancelled() and watcher.exception() is None:
            on_disconnect()

    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    watcher.add_done_callback(on_done)
    return watcher
