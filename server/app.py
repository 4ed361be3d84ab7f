"""``create_app``: builds the object graph once and wires the routes.

    settings -> model bundle -> tracing (only when on) -> router (lanes, batcher, compute thread)
             -> registry + metrics + latency monitor -> decode pool -> FastAPI routes

The model loads during start-up (a bad repository stops the server with a
message naming the problem); warm-up then runs on the compute thread while
``/health/live`` already answers and ``/health/ready`` says 503.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi
from prometheus_client import CollectorRegistry

from cache import SegmentCache
from kernels.compile_watch import CompileWatch
from models.loading.repository import ModelBundle
from models.served_facts import ServedModelFacts, served_model_facts
from monitoring.serving_metrics import ServingMetrics
from router.decode_pool import BoundedDecodePool
from router.executors import executor_plans, lower_current_thread_priority
from router.faults import FaultInjector
from router.intake import IntakeTools, RequestIntake
from router.joint_budget import JointTokenBudget
from router.lanes import LaneSettings
from router.request import Route
from router.router import Router
from router.zero_shot import ZeroShotEncoder
from server.errors import ApiError
from server.runtime.garbage_collection import settle_collector_for_requests
from server.ingest.inputs import device_jpeg_decoder, image_decoder
from server.http.middleware import add_request_guards
from server.http.rate_limit import TokenBucketStore
from server.http.direct_routes import DirectRoutes, DirectRouteTable
from server.http.route_order import INFERENCE_ROUTES, documented_routes, match_inference_routes_first
from server.runtime.device_metrics import register_device_decode_metrics, register_device_metrics
from server.runtime.model_loading import load_model, seal_graphs_when_ready, trace_encoders
from server.runtime.monitoring_setup import build_monitor, mark_ready_when_ready
from server.runtime.ops_port import serve_ops_port
from server.runtime.tracing_setup import FASTAPI_TELEMETRY_OFF, TracedProcess, build_tracing
from server.routes import admin, health, infer, monitoring, openai, v2, zero_shot
from server.protocols.zero_shot_run import LocalZeroShot
from server.protocols.zero_shot_schemas import ClassifyRequest, RankRequest
from server.schemas import InferRequest
from server.settings import Settings
from server.state import ServerState
from server.workers.restarts import register_single_process_worker_series
from server.runtime.watchdog import watch_compute

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

logger = logging.getLogger(__name__)


def lane_settings(settings: Settings, device_type: str) -> dict[Route, LaneSettings]:
    """Per-lane batching knobs; which batch shapes are warmed depends on the device.

    On CUDA a batch is padded up to a power of two, so a few warmed shapes
    (CUDA graphs, compiled kernels) cover every size. On the CPU nothing is
    compiled and padding would be pure waste, so every size up to the cap is
    warmed and batches run unpadded.
    """
    lanes = {}
    for route in Route:
        max_batch_size = int(settings.lane_value(route.value, "max_batch_size"))
        lanes[route] = LaneSettings(
            max_batch_size=max_batch_size,
            max_queue_delay_ns=int(settings.lane_value(route.value, "max_queue_delay_ms") * 1_000_000),
            max_queue_size=int(settings.lane_value(route.value, "max_queue_size")),
            default_timeout_ns=int(settings.lane_value(route.value, "default_timeout_ms") * 1_000_000),
            preferred_batch_sizes=tuple(range(1, max_batch_size + 1)) if device_type == "cpu" else (),
        )
    return lanes


def joint_token_budget(settings: Settings, model: ServedModelFacts) -> JointTokenBudget:
    """The images-per-request and joint-token limits: the settings, with the model's defaults where unset."""
    try:
        return JointTokenBudget.for_model(model, max_images_per_request=settings.max_images_per_request,
                                          max_joint_tokens=settings.max_joint_tokens)
    except ValueError as e:
        raise ValueError(f"MMSERVE_MAX_JOINT_TOKENS: {e}") from e


def _watch_cold_compiles(router: Router, metrics: ServingMetrics) -> CompileWatch:
    """Count Triton compiles of our kernels; those after ready are cold (``mmserve_cold_compiles_total``)."""

    def on_compile(kernel: str) -> None:
        if router.is_ready:
            logger.warning("compiled Triton kernel %s after ready: warm-up did not cover it", kernel)
            metrics.cold_compiles_total.labels(kind="triton_kernel").inc()

    watch = CompileWatch(on_compile)
    watch.install()
    return watch


def _openapi(app: FastAPI) -> dict:
    """FastAPI's schema plus ``InferRequest``, which the handler parses itself (JSON or multipart)."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=documented_routes(app),
                             description=app.description)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (InferRequest, ClassifyRequest, RankRequest):  # bodies the handlers parse themselves
            request_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(request_schema.pop("$defs", {}))
            components[model.__name__] = request_schema
        app.openapi_schema = schema
    return app.openapi_schema


def create_app(settings: Settings, bundle: ModelBundle | None = None, *,
               span_exporter: SpanExporter | None = None, traced_process: TracedProcess | None = None) -> FastAPI:
    """The mmserve app; ``bundle`` lets tests share one loaded model between apps.

    ``span_exporter`` (tests): tracing on, spans exported there one by one
    instead of over OTLP (``server.runtime.tracing_setup``).
    ``traced_process``: the engine of ``--api-workers N`` names itself so on its spans.
    """
    registry = CollectorRegistry()
    metrics = ServingMetrics(registry)
    monitor = build_monitor(settings, registry)
    if (settings.api_workers or 1) == 1:  # with API processes, the supervisor's count (server.workers.metrics_view)
        register_single_process_worker_series(registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        model = bundle if bundle is not None else await asyncio.to_thread(load_model, settings)
        if settings.torchscript_encoders or settings.cuda_graphs:
            await asyncio.to_thread(trace_encoders, model, settings)
        else:  # a bundle shared between apps may have been traced by another
            model.model.drop_encoder_graphs()
        register_device_metrics(registry, model)  # CUDA only: on the CPU the series are absent
        facts = served_model_facts(model)
        faults = FaultInjector() if settings.enable_fault_injection else None
        tracing = build_tracing(settings, facts, span_exporter=span_exporter,  # OTEL_* are read here, at start
                                process=traced_process)
        cache = SegmentCache(
            settings.cache_image_bytes, settings.cache_text_bytes,
            on_event=lambda modality, event, count: metrics.cache_events_total.labels(
                modality=modality, event=event).inc(count),
        )
        executors = executor_plans(separate_text=settings.separate_text_executor,
                                   image_nice=settings.image_work_nice)
        budget = joint_token_budget(settings, facts)
        router = Router(model, lane_settings(settings, model.model.device.type), metrics, executors=executors,
                        priority_step_ns=int(settings.priority_step_ms * 1_000_000),
                        stage_hook=faults.after_stage if faults is not None else None,
                        cache=cache, hang_timeout_ns=int(settings.compute_hang_s * 1e9),
                        budget=budget,
                        batch_tracer=tracing.batch_tracer if tracing is not None else None)
        # Decoding is image work too: it yields the cores to text requests like the image executor does.
        decode_pool = BoundedDecodePool(settings.decode_threads, settings.max_decode_queue,
                                        initializer=functools.partial(lower_current_thread_priority,
                                                                      settings.image_work_nice))
        device_decoder = device_jpeg_decoder(settings, model)
        register_device_decode_metrics(registry, device_decoder)
        intake = RequestIntake(router, IntakeTools.of(model, budget), image_decoder(settings, model.config.preprocess),
                               decode_pool, faults=faults, device_decoder=device_decoder,
                               inline_image_max_pixels=settings.inline_image_max_pixels)
        app.state.mmserve = ServerState(settings, facts, router, registry, metrics, decode_pool,
                                        monitor=monitor, intake=intake, faults=faults,
                                        tracer=tracing.request_tracer if tracing is not None else None,
                                        zero_shot=LocalZeroShot(ZeroShotEncoder(router, intake, decode_pool),
                                                                model.model.score))
        # The model is loaded: what exists now lives until exit.
        num_frozen = settle_collector_for_requests(settings.gc_young_threshold)
        logger.debug("froze %d start-up objects out of the garbage collector's way", num_frozen)
        compile_watch = _watch_cold_compiles(router, metrics)
        router.start()
        monitor.start()
        # The baseline is learned from traffic after warm-up: mark ready once the router is.
        baseline_start = asyncio.create_task(mark_ready_when_ready(monitor, lambda: router.is_ready))
        graphs_sealed = asyncio.create_task(seal_graphs_when_ready(model, lambda: router.is_ready))
        try:
            async with watch_compute(router, settings.compute_hang_s), serve_ops_port(app, settings):
                yield
        finally:
            baseline_start.cancel()
            graphs_sealed.cancel()
            await router.drain(settings.drain_timeout_s)
            decode_pool.shutdown(wait=False, cancel_futures=True)
            await asyncio.to_thread(monitor.stop)
            compile_watch.uninstall()
            if tracing is not None:
                await asyncio.to_thread(tracing.shutdown)

    app = FastAPI(
        title="mmserve",
        version="0.1.0",
        description="Online multimodal (image + text) inference server.",
        lifespan=lifespan,
        telemetry=FASTAPI_TELEMETRY_OFF,
    )
    wire_routes(app, settings, metrics, registry)
    return app


def add_routes_of(app: FastAPI, router: APIRouter) -> None:
    """``router``'s routes on the app's own router, in order: what ``include_router`` would serve.

    FastAPI keeps an included router as one entry and matches a request
    against its routes twice (once to pick the router, once inside it), and
    every router before the right one is searched in full: a per-request cost
    the floor does not pay. The routes added as they are match once; the
    OpenAPI schema is the same (the routers carry no prefix, dependencies or
    limits of their own).
    """
    app.router.routes.extend(router.routes)


def wire_routes(app: FastAPI, settings: Settings, metrics: ServingMetrics, registry: CollectorRegistry,
                rate_buckets: TokenBucketStore | None = None) -> None:
    """Every route, guard and limit of the HTTP side (the single process's, and each API process's).

    ``rate_buckets``: the rate limit's store when not this process's memory (API processes share one).
    """
    app.state.created_unix_s = int(time.time())  # OpenAI's model "created"
    app.add_exception_handler(ApiError, lambda request, error: error.response())

    def count_early_rejection(path: str, code: str) -> None:
        if path == "/v1/infer":
            route = "invalid"
        elif path.startswith("/v2/"):
            route = v2.METRICS_ROUTE
        elif path == "/v1/embeddings":
            route = openai.METRICS_ROUTE
        elif path in zero_shot.METRICS_ROUTES:
            route = zero_shot.METRICS_ROUTES[path]
        else:
            route = "other"  # not the raw path: anyone could mint label values
        metrics.requests_total.labels(route=route, code=code).inc()

    direct_routes = DirectRouteTable()
    app.add_middleware(DirectRoutes, table=direct_routes)  # added first: the innermost layer, below every guard
    add_request_guards(app, settings, count_early_rejection, registry=registry, rate_buckets=rate_buckets)
    for module in (infer, health, admin, v2, openai, zero_shot, monitoring):
        add_routes_of(app, module.router)
    match_inference_routes_first(app)
    direct_routes.take(app.router.routes, INFERENCE_ROUTES)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
