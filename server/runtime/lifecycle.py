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

An API process behind the supervisor (``stopped_by_supervisor``) ignores
SIGINT: Ctrl+C in a terminal signals the whole foreground process group, and
the supervisor, which gets it too, stops its children itself, API processes
first (SIGTERM), then the engines they answer from.

A compute thread that dies or hangs (the watchdog keeps the fault on the
router) ends the process too, with ``EXIT_COMPUTE_FAULT``: it cannot serve
again, and an orchestrator restarts a process that exits non-zero even when
nobody probes its liveness.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI

from server.http.header_timeout import header_timeout_protocol
from server.runtime.startup_checks import OneLineStartupFailure
from server.settings import Settings

logger = logging.getLogger(__name__)

EXIT_COMPUTE_FAULT = 3


def uvicorn_config(app: FastAPI, settings: Settings) -> uvicorn.Config:
    """uvicorn's settings from ours; no access log of its own (``server.http.access_log`` writes one), and
    uvicorn's HTTP parser with a header deadline (``server.http.header_timeout``), which uvicorn lacks."""
    return uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                          http=header_timeout_protocol(settings.header_timeout_s),
                          timeout_keep_alive=settings.keep_alive_timeout_s,  # type: ignore[arg-type]
                          access_log=False)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI, drain_timeout_s: float, *,
                 announce_address: bool = False, stopped_by_supervisor: bool = False) -> None:
        """``announce_address``: log the address served on a socket bound beforehand, as uvicorn does for its own
        (uvicorn stays silent for sockets it is handed, since a supervisor of several processes logs it once).
        ``stopped_by_supervisor``: SIGINT is ignored (the module's docstring)."""
        super().__init__(config)
        self._announce_address = announce_address
        self._stopped_by_supervisor = stopped_by_supervisor
        self._app = app
        self._drain_timeout_s = drain_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._is_draining = False
        self.exit_code = 0

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's 0.1 s tick; also ends a server whose compute thread died or hung."""
        if await super().on_tick(counter):
            return True
        state = getattr(self._app.state, "mmserve", None)
        if state is not None and state.router.fault is not None:
            logger.critical("exiting with status %d: %s", EXIT_COMPUTE_FAULT, state.router.fault.message)
            self.exit_code = EXIT_COMPUTE_FAULT
            return True
        return False

    async def startup(self, sockets=None) -> None:  # noqa: ANN001 - uvicorn's signature
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)
        if sockets and self.started and self._announce_address:
            host, port = sockets[0].getsockname()[:2]
            logger.info("serving on http://%s:%d (Press CTRL+C to quit)", f"[{host}]" if ":" in host else host, port)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGINT and self._stopped_by_supervisor:
            return  # the terminal's Ctrl+C: the supervisor got it too and sends SIGTERM in its order
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


def serve_until_stopped(app: FastAPI, settings: Settings, listening: socket.socket,
                        **server_options: bool) -> tuple[int, Exception | None]:
    """uvicorn on ``listening`` until stopped (``DrainingServer``, given ``server_options``), a configuration
    error in the lifespan's start-up held back as one line (``OneLineStartupFailure``).

    Returns the exit status and that error (``None`` when start-up went
    through): one process raises it for ``main`` to print, an API process
    leaves it for the supervisor. Any other failed start-up exits as uvicorn does.
    """
    config = uvicorn_config(app, settings)
    startup = OneLineStartupFailure(config.app, is_debug=settings.log_level == "debug")
    config.app = startup
    server = DrainingServer(config, app, settings.drain_timeout_s, **server_options)
    try:
        server.run(sockets=[listening])
    except SystemExit:  # uvicorn's exit on a failed start-up
        if startup.error is None:
            raise
    return (server.exit_code if server.started else 1), startup.error
