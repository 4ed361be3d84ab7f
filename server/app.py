"""``create_app``: builds the object graph once and wires the routes.

    settings -> model bundle -> tracing (only when on) -> router (lanes, batcher, compute thread)
             -> registry + metrics + latency monitor -> decode pool -> FastAPI routes (``server.app_routes``)

The model loads during start-up (a bad repository stops the server with a
message naming the problem); warm-up then runs on the compute thread while
``/health/live`` already answers and ``/health/ready`` says 503.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from cache import SegmentCache
from kernels.compile_watch import CompileWatch
from models.loading.repository import ModelBundle
from models.served_facts import served_model_facts
from monitoring.serving_metrics import ServingMetrics
from router.decode_pool import BoundedDecodePool
from router.executors import executor_plans, lower_current_thread_priority
from router.faults import FaultInjector
from router.intake import IntakeTools, RequestIntake
from router.lanes import LaneSettings
from router.request import Route
from router.router import Router
from router.zero_shot import ZeroShotEncoder
from server.app_routes import add_routes_of as add_routes_of  # re-exported: the app's HTTP side lives there
from server.app_routes import joint_token_budget, wire_routes
from server.runtime.garbage_collection import settle_collector_for_requests
from server.ingest.inputs import image_decoder
from server.runtime.device_decode import device_jpeg_decoder
from server.runtime.device_metrics import register_device_decode_metrics, register_device_metrics
from server.runtime.model_loading import load_model, seal_graphs_when_ready, trace_encoders
from server.runtime.runtime_choice import choose_runtime, log_served_model
from server.runtime.monitoring_setup import build_monitor, mark_ready_when_ready
from server.runtime.ops_port import serve_ops_port
from server.grpc_api.server import serve_grpc
from server.runtime.tracing_setup import FASTAPI_TELEMETRY_OFF, TracedProcess, build_tracing
from server.protocols.zero_shot_local import LocalZeroShot
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


def _watch_cold_compiles(router: Router, metrics: ServingMetrics) -> CompileWatch:
    """Count Triton compiles of our kernels; those after ready are cold (``mmserve_cold_compiles_total``)."""

    def on_compile(kernel: str) -> None:
        if router.is_ready:
            logger.warning("compiled Triton kernel %s after ready: warm-up did not cover it", kernel)
            metrics.cold_compiles_total.labels(kind="triton_kernel").inc()

    watch = CompileWatch(on_compile)
    watch.install()
    return watch


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
        was_on_torch = model.model.runtime == "torch"
        model = await asyncio.to_thread(choose_runtime, model, settings)
        # A bundle shared between apps (tests) goes back to torch when the app that put it on ONNX Runtime
        # stops, so what runs it next (an app, or a test calling it directly) finds it as it was given.
        gives_back_torch = bundle is not None and was_on_torch and model.runtime != "torch"
        if model.runtime != "torch":
            pass  # the towers run from ONNX Runtime sessions (server.runtime.runtime_choice)
        elif settings.torchscript_encoders or settings.cuda_graphs:
            await asyncio.to_thread(trace_encoders, model, settings)
        else:  # a bundle shared between apps may have been traced by another
            model.model.drop_encoder_graphs()
        log_served_model(model)
        metrics.model_info.labels(runtime=model.runtime, dtype=model.config.dtype).set(1)
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
                                                                      settings.image_work_nice),
                                        on_refused=metrics.decode_queue_refused.inc)
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
            # gRPC and the metrics port are the API side's: an engine behind API processes (traced_process
            # given) serves neither; the API processes serve the server's merged view on the supervisor's socket.
            grpc_settings = settings if traced_process is None else settings.model_copy(update={"grpc_port": None})
            ops_settings = settings if traced_process is None else settings.model_copy(update={"metrics_port": None})
            async with (watch_compute(router, settings.compute_hang_s), serve_ops_port(app, ops_settings),
                        serve_grpc(app, grpc_settings)):
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
            if gives_back_torch:
                model.model.drop_encoder_graphs()

    app = FastAPI(
        title="mmserve",
        version="0.1.0",
        description="Online multimodal (image + text) inference server.",
        lifespan=lifespan,
        telemetry=FASTAPI_TELEMETRY_OFF,
    )
    wire_routes(app, settings, metrics, registry)
    return app
