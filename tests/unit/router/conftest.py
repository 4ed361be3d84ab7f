"""Fixtures the intake tests share: warmed routers on the tiny model, and a decode pool."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from cache import SegmentCache
from router.lanes import LaneSettings
from router.request import Route
from router.router import Router


@pytest.fixture
def intake_max_batch_size() -> int:
    """Each lane's largest batch; a module overrides this fixture to batch more."""
    return 2


@pytest.fixture
def make_router(tiny_bundle, intake_max_batch_size) -> Iterator[Callable[[], Router]]:
    """``make_router()``: a started router whose executors have warmed up; all drained at the test's end."""
    routers: list[Router] = []
    batch_sizes = tuple(size for size in (1, 2, 4, 8) if size <= intake_max_batch_size)

    def make() -> Router:
        lanes = {route: LaneSettings(max_batch_size=intake_max_batch_size, max_queue_delay_ns=1_000_000,
                                     preferred_batch_sizes=batch_sizes)
                 for route in Route}
        router = Router(tiny_bundle, lanes, cache=SegmentCache(1 << 24, 1 << 24))
        router.start()
        for executor in router.executors:
            assert executor.worker.ready.wait(120), "the router did not warm up"
        routers.append(router)
        return router

    yield make
    for router in routers:
        asyncio.run(router.drain(5.0))


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor
