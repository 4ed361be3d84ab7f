"""The HTTP side of an app: every route, guard and limit, wired the same in the single process and each API process.

``server.app.create_app`` (one process, or the engine's app) and
``server.workers.api_process.create_api_app`` both call ``wire_routes``; the
routes reach the model only through ``app.state.mmserve`` (the intake, the
router's state, the zero-shot scorer), so this module and what it imports
stay torch-free (the API-side import contract in pyproject.toml).
"""

from __future__ import annotations

import time

from fastapi import APIRouter, FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from prometheus_client import CollectorRegistry

from models.served_facts import ServedModelFacts
from monitoring.serving_metrics import ServingMetrics
from router.joint_budget import JointTokenBudget
from server.errors import ApiError
from server.http.direct_routes import DirectRoutes, DirectRouteTable
from server.http.error_shapes import error_response, validation_error
from server.http.middleware import add_request_guards
from server.http.rate_limit import TokenBucketStore
from server.http.route_order import INFERENCE_ROUTES, documented_routes, match_inference_routes_first
from server.protocols.zero_shot_schemas import ClassifyRequest, RankRequest
from server.routes import admin, health, infer, monitoring, openai, v2, zero_shot
from server.schemas import InferRequest
from server.settings import Settings


def joint_token_budget(settings: Settings, model: ServedModelFacts) -> JointTokenBudget:
    """The images-per-request and joint-token limits: the settings, with the model's defaults where unset."""
    try:
        return JointTokenBudget.for_model(model, max_images_per_request=settings.max_images_per_request,
                                          max_joint_tokens=settings.max_joint_tokens)
    except ValueError as e:
        raise ValueError(f"MMSERVE_MAX_JOINT_TOKENS: {e}") from e


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
    # A path no route serves is 404 route_not_found, trailing slash or not: Starlette's default answered
    # POST /v1/embeddings/ with an empty 307 to the path without it, which no API client follows with its body.
    app.router.redirect_slashes = False
    app.add_exception_handler(ApiError, lambda request, error: error_response(error, request.url.path))
    app.add_exception_handler(RequestValidationError,
                              lambda request, error: error_response(validation_error(error), request.url.path))

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
    app.state.guards = add_request_guards(app, settings, count_early_rejection, registry=registry,
                                          rate_buckets=rate_buckets)  # gRPC applies the same (server.grpc)
    for module in (infer, health, admin, v2, openai, zero_shot, monitoring):
        add_routes_of(app, module.router)
    match_inference_routes_first(app)
    direct_routes.take(app.router.routes, INFERENCE_ROUTES)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
