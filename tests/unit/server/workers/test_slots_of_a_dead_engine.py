"""Slots sent to an engine that dies before copying them out come back; the ones it copied are collected as usual.

The engine copies a call's pixels out as the call arrives. One that dies with
calls still in its socket never copies theirs, and its successor never reads
those calls, so without giving them back here the slots would stay held for
good: every engine crash under image load would leak the images in transit
until the API process answered 503 ``overloaded`` to every image.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from models.loading.config import PreprocessConfig
from router.segments import SegmentCatalog
from server.errors import ApiError
from server.workers.engine_client import EngineClient
from server.workers.pixel_slots import AttachedSlots, PixelSlots

SHAPE = (8, 8, 3)


def _pixels(value: int) -> np.ndarray:
    return np.full(SHAPE, value, np.uint8)


def test_give_back_uncopied_frees_only_what_the_engine_did_not_copy():
    slots = PixelSlots(SHAPE, num_slots=3)
    try:
        taken = slots.put([_pixels(1), _pixels(2), _pixels(3)])
        engine_side = AttachedSlots(slots.name, SHAPE)
        np.testing.assert_array_equal(engine_side.take_out(taken[0]), _pixels(1))  # copied before it died
        engine_side.close()
        slots.give_back_uncopied(taken)
        assert slots.num_held == 0
        assert sorted(slots.put([_pixels(4), _pixels(5), _pixels(6)])) == [0, 1, 2], "all three are free again"
    finally:
        slots.close()


class _DyingEngine:
    """An engine connection whose engine dies with the call unanswered (``EngineConnection._gone``)."""

    index = 1
    num_in_flight = 0

    def send(self, *message: object) -> tuple[int, asyncio.Future]:
        future = asyncio.get_running_loop().create_future()
        future.set_exception(ApiError(503, "engine_unavailable", "engine 1 is not serving (it is starting again)"))
        return 7, future

    def cancel(self, call_id: int) -> None:
        raise AssertionError("nothing to cancel: the call failed")


def test_a_call_whose_engine_died_before_copying_gives_its_slots_back():
    slots = PixelSlots(SHAPE, num_slots=2)
    client = EngineClient("/nonexistent", SegmentCatalog(None, "fp", "size=8"),  # type: ignore[arg-type]
                          PreprocessConfig(input_size=8, resize_size=8), None, None, slots,  # type: ignore[arg-type]
                          texts=None)  # type: ignore[arg-type]

    async def call() -> None:
        taken = client.put_pixels([[_pixels(1), None, _pixels(2)]])
        assert slots.num_held == 2
        await client.call_with_slots(_DyingEngine(), taken, "run")  # type: ignore[arg-type]

    try:
        with pytest.raises(ApiError, match="engine_unavailable|not serving"):
            asyncio.run(call())
        assert slots.num_held == 0, "the dead engine's uncopied slots are free again"
    finally:
        slots.close()
