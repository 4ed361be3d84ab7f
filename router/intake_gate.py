"""The gate of a many-item call: every item is held after preparing until all are prepared or one is refused.

``router.intake`` submits a call's items only once every one of them is
prepared, so one bad item costs its neighbours no compute (and no batch
slot); each item's coroutine waits here, and learns here that a neighbour
was refused.
"""

from __future__ import annotations

import asyncio


class NeighbourRefusedError(Exception):
    """Another item of the same call was refused, so this one is not submitted."""


class AllPrepared:
    """Holds each item of one call after preparing until every item is prepared or one is refused.

    ``signal``, when given, is set once every item is prepared (never on a refusal): work the caller
    runs beside the call waits on it before computing anything (``router.zero_shot``).
    """

    def __init__(self, num_items: int, signal: asyncio.Event | None = None) -> None:
        self._num_unprepared = num_items
        self._is_refused = False
        self._done = asyncio.Event()
        self._signal = signal
        if num_items == 0 and signal is not None:
            signal.set()  # nothing to prepare: nothing to wait for

    def refuse(self) -> None:
        self._is_refused = True
        self._done.set()

    async def prepared(self) -> None:
        """Count this item prepared and wait for the rest; ``NeighbourRefusedError`` if one was refused."""
        self._num_unprepared -= 1
        if self._num_unprepared == 0:
            self._done.set()
            if self._signal is not None and not self._is_refused:
                self._signal.set()
        await self._done.wait()
        if self._is_refused:
            raise NeighbourRefusedError()
