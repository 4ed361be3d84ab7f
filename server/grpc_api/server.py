"""The gRPC listener's life: started inside an app's lifespan when ``grpc_port`` is set, stopped after drain.

One ``grpc.aio`` server on the app's event loop, beside uvicorn, reading the
same ``ServerState`` and guards. Options, from the settings:

    grpc.max_receive_message_length   max_body_bytes: the HTTP body limit (RESOURCE_EXHAUSTED past it)
    grpc.so_reuseport                 on with --api-workers N > 1: every API process binds the port, the
                                      kernel spreads connections (grpcio cannot take over an inherited
                                      socket); off with one process, so a port in use fails the start
    keepalive                         clients' pings accepted every 10 s, with or without calls in flight
    compression                       whatever the client sends (gzip, deflate) is accepted; answers go
                                      uncompressed unless the client asks

Drain (SIGTERM, ``server.runtime.lifecycle``): the router's drain turns health
NOT_SERVING and new calls UNAVAILABLE (the intake refuses them, 503 ->
UNAVAILABLE); calls running finish; the lifespan's end then stops the server
with the drain's grace.

The grpcio and tritonclient imports wait for the first call of ``serve_grpc``
with a port: a server without gRPC never loads them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI

from server.runtime.startup_checks import ListenerPortError
from server.settings import Settings

logger = logging.getLogger(__name__)

KEEPALIVE_MIN_PING_INTERVAL_MS = 10_000


class GrpcPortError(ListenerPortError):
    """The gRPC port cannot be bound: a configuration error, one line and exit 2 (``server.runtime.startup_checks``)."""


def server_options(settings: Settings) -> list[tuple[str, int]]:
    is_shared = (settings.api_workers or 1) > 1
    return [
        ("grpc.max_receive_message_length", settings.max_body_bytes),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", 1 if is_shared else 0),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_MIN_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", 0),
    ]


@contextlib.asynccontextmanager
async def serve_grpc(app: FastAPI, settings: Settings) -> AsyncIterator[None]:
    """Serve gRPC on ``settings.host:settings.grpc_port`` while the block runs (nothing when unset)."""
    if settings.grpc_port is None:
        yield
        return
    import grpc

    from server.grpc_api.guards import CallGuards
    from server.grpc_api.infer_endpoint import METRICS_ROUTE
    from server.grpc_api.inference_service import InferenceService

    def count_refusal(status: int) -> None:
        app.state.mmserve.metrics.requests_total.labels(route=METRICS_ROUTE, code=str(status)).inc()

    service = InferenceService(lambda: app.state.mmserve, CallGuards(app.state.guards, count_refusal), app.version)
    server = grpc.aio.server(options=server_options(settings))
    server.add_generic_rpc_handlers(service.handlers())
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    address = f"{host}:{settings.grpc_port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as e:
        raise GrpcPortError(f"--grpc-port {settings.grpc_port} (MMSERVE_GRPC_PORT): cannot listen on {address} "
                            f"({e}); choose a free port") from e
    if bound == 0:
        raise GrpcPortError(f"--grpc-port {settings.grpc_port} (MMSERVE_GRPC_PORT): cannot listen on {address} "
                            "(in use or not allowed); choose a free port")
    await server.start()
    logger.info("serving KServe v2 gRPC on %s", address)
    try:
        yield
    finally:
        await server.stop(grace=settings.drain_timeout_s)
