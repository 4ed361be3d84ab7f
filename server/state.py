"""The object graph of one running server, built once by ``create_app``."""

from __future__ import annotations

import dataclasses
import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from models.served_facts import ServedModelFacts
from monitoring import Monitor
from monitoring.serving_metrics import ServingMetrics
from router.faults import FaultInjector
from server.protocols.model_names import ServedModelNames, served_model_names
from server.settings import Settings

if TYPE_CHECKING:
    from router.intake import RequestIntake
    from router.router import Router
    from server.http.tracing import RequestTracer
    from server.protocols.zero_shot_run import ZeroShotScorer


@dataclass
class ServerState:
    """``served_model``: the model's facts, read off the bundle in one process, sent by the engine to an API
    process (which holds no model: whatever needs the model itself is the router's, ``router.bundle``)."""

    settings: Settings
    served_model: ServedModelFacts
    router: Router
    registry: CollectorRegistry
    metrics: ServingMetrics
    decode_pool: ThreadPoolExecutor
    monitor: Monitor  # stage-latency digests and drift (server.runtime.monitoring_setup)
    intake: RequestIntake  # every protocol's way in: tokenize, plan, decode, submit, settle
    faults: FaultInjector | None = None  # only with enable_fault_injection
    tracer: RequestTracer | None = None  # only while tracing is on (server.runtime.tracing_setup)
    zero_shot: ZeroShotScorer | None = None  # /v1/classify and /v1/rank's middle: this model's, or the engine's
    _model_descriptions: dict[int, dict] = dataclasses.field(default_factory=dict, init=False, repr=False)

    @functools.cached_property
    def served_names(self) -> ServedModelNames:
        """The names a request may give the model (``model``, a v2 path): worked out once, not per request."""
        return served_model_names(self.settings, self.served_model)

    @functools.cached_property
    def model_description(self) -> dict:
        """The ``model`` object of every answer: name, fingerprint, family, score, normalisation, head."""
        return dataclasses.asdict(self.served_model.description)

    def model_description_of(self, engine: int) -> dict:
        """The ``model`` object of an answer computed by ``engine`` (0 with one engine): which one served it."""
        return self._model_descriptions.setdefault(engine, {**self.model_description, "engine": engine})
