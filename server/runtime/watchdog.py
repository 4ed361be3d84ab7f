"""The compute watchdog: notice a dead or hung model thread without waiting for a request.

Liveness alone would only say so when probed, and requests already queued
would wait for a thread that never answers. So a task on the event loop asks
the router every ``interval_s``:

    router.check_compute()  ->  None: all well
                            ->  ComputeFault (kept for good): waiting requests get 503 at once,
                                /health/live and /health/ready answer 503, the fault is logged
                                once (and ``mmserve serve``, seeing ``router.fault``, exits non-zero)

A hang is a batch running longer than ``compute_hang_s``; the model thread
cannot be interrupted from Python, so the only cure is a new process, which
the orchestrator starts once liveness fails or the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from router.router import Router

logger = logging.getLogger(__name__)

_MAX_INTERVAL_S = 0.5
_MIN_INTERVAL_S = 0.05


def watch_interval_s(hang_timeout_s: float) -> float:
    """Often enough to see a hang within a quarter of its limit, and at least twice a second."""
    if hang_timeout_s <= 0:
        return _MAX_INTERVAL_S
    return min(_MAX_INTERVAL_S, max(_MIN_INTERVAL_S, hang_timeout_s / 4))


async def _watch(router: Router, interval_s: float) -> None:
    while (fault := router.check_compute()) is None:
        await asyncio.sleep(interval_s)
    logger.critical("%s; liveness is now 503 and the process must be restarted", fault.message)


@contextlib.asynccontextmanager
async def watch_compute(router: Router, hang_timeout_s: float) -> AsyncIterator[None]:
    """Run the watchdog for the block's duration (the app's lifespan)."""
    task = asyncio.create_task(_watch(router, watch_interval_s(hang_timeout_s)),
                               name="mmserve-compute-watchdog")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
