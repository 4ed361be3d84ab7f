"""Graceful drain on SIGTERM, for orchestrators that stop pods with it.

uvicorn on its own stops accepting connections at once and gives in-flight
requests a grace period. An orchestrator wants more: readiness must go false
immediately (so the endpoint is taken out of rotation), requests that still
arrive get a clean 503 rather than a refused connection, and everything
already accepted finishes. So the first SIGTERM (or SIGINT) starts a drain:

    t0  readiness 503, new requests 503 shutting_down
        queued and running requests finish (up to drain_timeout_s)
    t1  uvicorn's own shutdown: close the socket, lifespan shutdown, exit 0

A second signal skips the wait (uvicorn's own handling: it stops at once and
re-raises the signal).
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI

logger = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI, drain_timeout_s: float) -> None:
        super().__init__(config)
        self._app = app
        self._drain_timeout_s = drain_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._is_draining = False

    async def startup(self, sockets=None) -> None:  # noqa: ANN001 - uvicorn's signature
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        state = getattr(self._app.state, "mmserve", None)
        if self._is_draining or self._loop is None or state is None:
            super().handle_exit(sig, frame)
            return
        self._is_draining = True
        state.router.begin_drain()
        logger.info("signal %d: draining (%d requests in flight, up to %.0f s)",
                    sig, state.router.num_in_flight, self._drain_timeout_s)
        self._loop.call_soon_threadsafe(
            lambda: self._loop.create_task(self._finish_then_exit(state.router, sig, frame))
        )

    async def _finish_then_exit(self, router, sig: int, frame: FrameType | None) -> None:  # noqa: ANN001
        deadline = time.monotonic() + self._drain_timeout_s
        while router.num_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if router.num_in_flight:
            logger.warning("drain timeout: %d requests still in flight", router.num_in_flight)
        # Plain should_exit, not uvicorn's handle_exit: that one re-raises the
        # signal after shutdown, and a drained server should exit 0.
        self.should_exit = True
