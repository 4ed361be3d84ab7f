"""One device decode per intake call: the JPEGs of all its items go to the device decoder as one batch.

With ``--decode-device cuda`` the intake hands JPEGs to the model side's
batch decoder (``models.jpeg_decode.DeviceJpegDecoder``) instead of its CPU
decoder. nvJPEG is fast per batch, not per image, so the items of one call
(a KServe batch, an OpenAI ``input`` list, a request with several images)
pool their JPEGs here and the batch goes once every item has planned:

    item 0 ── plan ── decode([a, b]) ─┐
    item 1 ── plan ── decode([])     ─┼─ all in ──> decode_to_input([a, b, c]), decode pool
    item 2 ── plan ── decode([c])    ─┘               │
    item 3 ── refused ── leave()                      └──> each item gets its slice back

An item that failed before it got here ``leave``s, so the others never wait
for it. Each image comes back as the model's (S, S, 3) uint8 input or None
where the decoder left it to the CPU decoder (not a JPEG it takes, refused
by nvJPEG); the intake decodes those on the CPU, one by one, so a bad image
still fails only its own item with the CPU decoder's own error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from models.jpeg_decode import DeviceJpegDecoder


class DeviceDecodeRound:
    """Collects the JPEGs of ``num_items`` items and decodes them in one device batch once all have entered or left.

    Lives on the event loop of one intake call; ``executor`` is the decode
    pool the batch runs in (its refusal, e.g. ``DecodeQueueFullError``,
    reaches every item that had JPEGs in the round).
    """

    def __init__(self, num_items: int, decoder: DeviceJpegDecoder, executor: Executor) -> None:
        self._num_open = num_items
        self._decoder = decoder
        self._executor = executor
        self._encoded: list[bytes] = []
        self._decoded: asyncio.Future[list[np.ndarray | None]] = asyncio.get_running_loop().create_future()
        self._is_started = False

    def leave(self) -> None:
        """An item that will not enter (it failed before decoding): the batch no longer waits for it."""
        self._num_open -= 1
        self._start_when_all_in()

    async def decode(self, encoded: Sequence[bytes]) -> list[np.ndarray | None]:
        """Enter this item's JPEGs (possibly none) and wait for the batch: one (S, S, 3) uint8 or None each."""
        first = len(self._encoded)
        self._encoded += encoded
        self._num_open -= 1
        self._start_when_all_in()
        if not encoded:
            return []
        # Shielded: one item cancelled (its client went away) must not cancel the batch its neighbours wait for.
        decoded = await asyncio.shield(self._decoded)
        return decoded[first: first + len(encoded)]

    def _start_when_all_in(self) -> None:
        if self._num_open > 0 or self._is_started:
            return
        self._is_started = True
        if not self._encoded:
            self._decoded.set_result([])
            return
        try:
            batch = asyncio.wrap_future(self._executor.submit(self._decoder.decode_to_input, list(self._encoded)))
        except Exception as e:  # the pool refused it: every item waiting on the round gets the error
            self._decoded.set_exception(e)
            self._decoded.exception()  # retrieved here: an item that left meanwhile must not log it as lost
            return
        batch.add_done_callback(self._settle)

    def _settle(self, batch: asyncio.Future[list[np.ndarray | None]]) -> None:
        if batch.cancelled():
            self._decoded.cancel()
        elif batch.exception() is not None:
            self._decoded.set_exception(batch.exception())  # type: ignore[arg-type]
            self._decoded.exception()
        else:
            self._decoded.set_result(batch.result())
