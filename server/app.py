"""``create_app``: builds the object graph once and wires the routes.

    settings -> model bundle -> router (lanes, batcher, compute thread)
             -> registry + metrics -> decode pool -> FastAPI routes

The model loads during start-up (a bad repository stops the server with a
message naming the problem); warm-up then runs on the compute thread while
``/health/live`` already answers and ``/health/ready`` says 503.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from prometheus_client import CollectorRegistry

from cache import SegmentCache
from models.repository import ModelBundle
from monitoring.serving_metrics import ServingMetrics
from router.faults import FaultInjector
from router.lanes import LaneSettings
from router.request import Route
from router.router import Router
from server.body_limit import BodySizeLimit
from server.errors import ApiError
from server.model_loading import load_model
from server.routes import admin, health, infer, openai, v2
from server.schemas import InferRequest
from server.settings import Settings
from server.state import ServerState


def lane_settings(settings: Settings) -> dict[Route, LaneSettings]:
    return {
        route: LaneSettings(
            max_batch_size=int(settings.lane_value(route.value, "max_batch_size")),
            max_queue_delay_ns=int(settings.lane_value(route.value, "max_queue_delay_ms") * 1_000_000),
            max_queue_size=int(settings.lane_value(route.value, "max_queue_size")),
            default_timeout_ns=int(settings.lane_value(route.value, "default_timeout_ms") * 1_000_000),
        )
        for route in Route
    }


def _openapi(app: FastAPI) -> dict:
    """FastAPI's schema plus ``InferRequest``, which the handler parses itself (JSON or multipart)."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                             description=app.description)
        request_schema = InferRequest.model_json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(request_schema.pop("$defs", {}))
        components["InferRequest"] = request_schema
        app.openapi_schema = schema
    return app.openapi_schema


def create_app(settings: Settings, bundle: ModelBundle | None = None) -> FastAPI:
    """The mmserve app; ``bundle`` lets tests share one loaded model between apps."""
    registry = CollectorRegistry()
    metrics = ServingMetrics(registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        model = bundle if bundle is not None else await asyncio.to_thread(load_model, settings)
        faults = FaultInjector() if settings.enable_fault_injection else None
        cache = SegmentCache(
            settings.cache_image_bytes, settings.cache_text_bytes,
            on_event=lambda modality, event, count: metrics.cache_events_total.labels(
                modality=modality, event=event).inc(count),
        )
        router = Router(model, lane_settings(settings), metrics,
                        priority_step_ns=int(settings.priority_step_ms * 1_000_000),
                        stage_hook=faults.after_stage if faults is not None else None,
                        cache=cache)
        decode_pool = ThreadPoolExecutor(settings.decode_threads, thread_name_prefix="mmserve-decode")
        app.state.mmserve = ServerState(settings, model, router, registry, metrics, decode_pool, faults)
        router.start()
        try:
            yield
        finally:
            await router.drain(settings.drain_timeout_s)
            decode_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(
        title="mmserve",
        version="0.1.0",
        description="Online multimodal (image + text) inference server.",
        lifespan=lifespan,
    )
    app.state.created_unix_s = int(time.time())  # OpenAI's model "created"
    app.add_exception_handler(ApiError, lambda request, error: error.response())

    def count_early_rejection(path: str) -> None:
        if path == "/v1/infer":
            route = "invalid"
        elif path.startswith("/v2/"):
            route = v2.METRICS_ROUTE
        elif path == "/v1/embeddings":
            route = openai.METRICS_ROUTE
        else:
            route = path
        metrics.requests_total.labels(route=route, code="413").inc()

    app.add_middleware(BodySizeLimit, max_body_bytes=settings.max_body_bytes,
                       on_reject=count_early_rejection)
    app.include_router(infer.router)
    app.include_router(health.router)
    app.include_router(admin.router)
    app.include_router(v2.router)
    app.include_router(openai.router)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app
