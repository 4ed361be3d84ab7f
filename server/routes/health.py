"""Liveness, readiness and the Prometheus scrape endpoint.

``/metrics`` speaks the classic Prometheus text format unless the scraper
asks for OpenMetrics (``Accept: application/openmetrics-text``, which
Prometheus sends first by default): only OpenMetrics carries exemplars, the
trace ids of kept traces on the request-duration histogram's buckets.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client.exposition import choose_encoder

from server.state import ServerState

router = APIRouter()


@router.get("/health/live", summary="200 while the compute thread runs (warming up or serving).")
async def live(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.mmserve
    if state.router.is_alive:
        return JSONResponse({"status": "live"})
    return JSONResponse({"status": "dead", "reason": "the compute thread is not running"}, status_code=503)


@router.get("/health/ready", summary="200 once every shape has been warmed up, until draining starts.")
async def ready(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.mmserve
    if state.router.is_ready:
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "not_ready"}, status_code=503)


@router.get("/metrics", summary="Prometheus text exposition (OpenMetrics, with exemplars, when the Accept header asks).")
async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.mmserve
    encode, content_type = choose_encoder(request.headers.get("accept", ""))
    # Off the event loop: encoding reads every digest, and with API processes it waits for the others' counts.
    return Response(await asyncio.to_thread(encode, state.registry), media_type=content_type)
