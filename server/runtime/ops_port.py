"""A second listener for probes and scrapers: ``/metrics`` and ``/health/*`` on ``metrics_port``.

With API keys on, a deployment may want its public port to answer nothing
without a key while kubelet and Prometheus, which reach the pod on a port the
public never sees, need none. So with ``metrics_port`` set a second uvicorn
server runs on the same event loop, inside the app's lifespan, serving only
the health routes from the same ``ServerState``:

    port     (public)   every route; health/metrics open unless open_health_and_metrics=false
    metrics_port        /metrics, /health/live, /health/ready; no key; 404 for anything else

It is driven through ``startup``/``main_loop``/``shutdown`` rather than
``serve``: ``serve`` would take over SIGTERM from the main server's drain.

Split (``--api-workers N``, ``--engines M``), the supervisor binds
``metrics_port`` once before loading and hands the socket to every API
process, which serves these routes on it from its own state (the server's
merged ``/metrics`` and readiness, as its public port does); the engines
serve none. So the port answers as the public port does whatever N and M.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI

from server.routes import health
from server.runtime.startup_checks import ListenerPortError, listen_on_metrics_port
from server.runtime.tracing_setup import FASTAPI_TELEMETRY_OFF
from server.settings import Settings

logger = logging.getLogger(__name__)


class OpsPortError(ListenerPortError):
    """The metrics port cannot be bound: a configuration error, one line and exit 2 (``startup_checks``)."""


def ops_app(main_app: FastAPI) -> FastAPI:
    """The health routes alone, reading the main app's state."""
    app = FastAPI(title="mmserve probes", openapi_url=None, docs_url=None, redoc_url=None,
                  telemetry=FASTAPI_TELEMETRY_OFF)
    app.include_router(health.router)
    app.state.mmserve = main_app.state.mmserve
    return app


@contextlib.asynccontextmanager
async def serve_ops_port(main_app: FastAPI, settings: Settings,
                         listening: socket.socket | None = None) -> AsyncIterator[None]:
    """Serve ``ops_app`` on ``settings.metrics_port`` for the block's duration (no-op when unset).

    ``listening``: the port already bound (an API process's, from the supervisor); else it is bound here.
    """
    if settings.metrics_port is None:
        yield
        return
    try:
        sock = listening if listening is not None else listen_on_metrics_port(settings)
    except ListenerPortError as e:
        raise OpsPortError(str(e)) from e
    config = uvicorn.Config(ops_app(main_app), lifespan="off", log_level=settings.log_level, access_log=False)
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[sock])
    logger.info("serving /metrics and /health/* on %s:%d", settings.host, settings.metrics_port)
    ticking = asyncio.create_task(server.main_loop(), name="mmserve-ops-port")
    try:
        yield
    finally:
        server.should_exit = True
        await ticking
        await server.shutdown(sockets=[sock])
