"""Operator routes: emptying the segment cache, and fault drills (only when enabled)."""

from __future__ import annotations

import asyncio
import os
import signal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError

from router.faults import FAULT_STAGES, FaultPlan
from router.image_header import ENCODINGS
from server.errors import ApiError
from server.state import ServerState
from server.workers.engine_routes import forwarded_targets

router = APIRouter()


class FaultRequest(BaseModel):
    stage: str = Field(description=f"One of {', '.join(FAULT_STAGES)}.")
    delay_ms: float = Field(ge=0, le=60_000)
    fraction: float = Field(1.0, ge=0, le=1)
    duration_s: float = Field(60.0, gt=0, le=86_400)
    only_encoding: str | None = Field(
        None, description=f"Delay only requests (decode) or batches (vision, text, fusion) holding images of this "
                          f"encoding: one of {', '.join(ENCODINGS)}.")


def _injector(request: Request):
    state: ServerState = request.app.state.mmserve
    if state.faults is None:
        raise ApiError(404, "fault_injection_disabled",
                       "fault injection is off; start the server with --enable-fault-injection")
    return state.faults


def _check_engine_query(request: Request) -> None:
    """``?engine=N`` checked in one process as API processes check it before they forward (``forwarded_targets``
    with this server's one engine): a number that names no engine, or none where kill needs one, is the same 422
    ``invalid_engine`` whatever ``--api-workers`` and ``--engines`` are. An engine process is asked only what an
    API process has checked."""
    if getattr(request.app.state, "engine_index", None) is None:
        query = request.url.query
        forwarded_targets(request.method, request.url.path + (f"?{query}" if query else ""), 1)


@router.post("/v1/admin/faults", summary="Delay a stage for a fraction of requests, for a while (drills).")
async def add_fault(request: Request, body: FaultRequest) -> JSONResponse:
    injector = _injector(request)
    _check_engine_query(request)
    try:
        plan = FaultPlan(stage=body.stage, delay_ms=body.delay_ms, fraction=body.fraction,
                         duration_s=body.duration_s, only_encoding=body.only_encoding)
    except (ValueError, ValidationError) as e:
        field = "only_encoding" if body.only_encoding is not None and body.stage in FAULT_STAGES else "stage"
        raise ApiError(422, "invalid_fault", str(e), field) from e
    injector.activate(plan)
    return _active(request, injector)


@router.get("/v1/admin/faults", summary="The fault drills in force now, each with the engine it is on.")
async def list_faults(request: Request) -> JSONResponse:
    injector = _injector(request)
    _check_engine_query(request)
    return _active(request, injector)


def _active(request: Request, injector) -> JSONResponse:  # noqa: ANN001
    """The drills in force, each naming its engine: this process (engine 0 when it is the only one), or the
    engine answering for the API processes, which merge every engine's list
    (``server.workers.engine_routes.merged_fault_lists``)."""
    engine = getattr(request.app.state, "engine_index", 0)
    return JSONResponse({"active": [{**vars(plan), "engine": engine} for plan in injector.active()]})


@router.post("/v1/admin/faults/kill", status_code=202,
             summary="Kill one engine process (SIGKILL, right after this answer): a drill of an engine's death.")
async def kill_engine(request: Request, engine: str | None = None) -> JSONResponse:
    """Only an engine process of a server with API processes in front answers this (``?engine=N`` picks it,
    ``server.workers.engine_routes``); the supervisor starts it again (``server.workers.supervisor``). A
    one-process server has no engine apart from itself, so it refuses."""
    _injector(request)
    _check_engine_query(request)  # an engine's number, as with API processes in front, before the 409
    if getattr(request.app.state, "engine_index", None) != int(engine or 0):
        raise ApiError(409, "not_an_engine", "this server runs in one process: it has no engine of its own to kill; "
                                             "start it with --engines N or --api-workers N", "engine")
    asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), signal.SIGKILL)  # once the answer is out
    return JSONResponse({"killed_engine": int(engine or 0)}, status_code=202)


@router.delete("/v1/admin/faults", summary="End every fault drill now (with ?engine=N, that engine's).")
async def clear_faults(request: Request) -> JSONResponse:
    injector = _injector(request)
    _check_engine_query(request)
    injector.clear()
    return _active(request, injector)


@router.delete("/v1/cache", summary="Empty the segment cache (entries being computed are kept when done).")
async def clear_cache(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.mmserve
    num_entries = state.router.cache.clear()
    return JSONResponse({"cleared_entries": num_entries})
