"""``/v1/monitoring/*``: the latency monitor's drift state, its digests, and re-learning the baseline.

    GET  /v1/monitoring/drift      per route: state, since when, KS D per stage, the stage named as cause
    GET  /v1/monitoring/digests    window and lifetime T-Digests per (route, stage), for fleet merges
    POST /v1/monitoring/baseline   forget the baselines, learn them again: at least drift_baseline_s,
                                   and until each route's holds drift_min_samples

The documents are ``Monitor.drift_view()`` and ``Monitor.digests_view()`` as
they are (see ``monitoring.views`` for their shapes). The digests document
holds thousands of centroids, so it is built and serialised off the event loop.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from monitoring import MonitorStateError
from server.errors import ApiError
from server.state import ServerState

router = APIRouter(tags=["Monitoring"])


def _state(request: Request) -> ServerState:
    return request.app.state.mmserve


@router.get("/v1/monitoring/drift", summary="Latency drift per route: state, KS D per stage, attributed stage.")
async def drift(request: Request) -> JSONResponse:
    return JSONResponse(_state(request).monitor.drift_view())


@router.get("/v1/monitoring/digests",
            summary="Window and lifetime T-Digests per route and stage (merge them with `mmserve quantiles`).")
async def digests(request: Request) -> Response:
    monitor = _state(request).monitor
    body = await asyncio.to_thread(lambda: json.dumps(monitor.digests_view(), allow_nan=False))
    return Response(body, media_type="application/json")


@router.post("/v1/monitoring/baseline",
             summary="Re-learn the latency baselines: at least drift_baseline_s, until each holds drift_min_samples.")
async def relearn_baseline(request: Request) -> JSONResponse:
    state = _state(request)
    monitor = state.monitor
    if state.router.is_ready:
        # /health/ready answers from the router, and the lifespan marks the monitor ready on its next poll
        # of it (``mark_ready_when_ready``), up to a poll interval later: a caller who has just seen
        # /health/ready answer 200 must not be told to wait for it. Marking is idempotent.
        monitor.mark_ready()
    try:
        monitor.relearn_baseline()
    except MonitorStateError as e:
        raise ApiError(409, "not_ready", f"{e}; retry once /health/ready answers 200") from e
    return JSONResponse({"baseline": monitor.drift_view()["baseline"]})
