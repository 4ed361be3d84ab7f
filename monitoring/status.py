"""Read-only, typed results the ``Monitor`` hands out (to the collector and the JSON views).

Each is a frozen snapshot taken under the monitor's lock, so a reader never
sees a half-folded period and never holds the lock while it formats output.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from monitoring.attribution import Attribution
from monitoring.drift import DriftState, StageVerdict


class BaselinePhase(str, enum.Enum):
    """Life of the baselines: nothing before readiness, then learned, then frozen.

    Each route's baseline is frozen once ``baseline_s`` has passed since
    learning started *and* it holds ``min_samples``; the monitor is ``FROZEN``
    when every route it has seen is, and ``LEARNING`` while any route (or no
    route at all: an idle server) still learns.
    """

    NOT_READY = "not_ready"
    LEARNING = "learning"
    FROZEN = "frozen"


@dataclass(frozen=True)
class RouteDriftStatus:
    """Drift detection of one route after the latest period.

    Attributes:
        route: Route name.
        state: Current state.
        since_unix_s: Wall time the route entered ``state``.
        evaluated_unix_s: Wall time of the latest judged period (``None`` before the first).
        condition: The latest period's verdict (``None``: not enough samples).
        num_shifted_in_row: Shifted periods in a row while stable.
        num_calm_in_row: Calm periods in a row while drifting.
        verdicts: Per-stage verdicts of the latest period.
        attribution: Stage ranking of the latest period (``None`` before the first).
    """

    route: str
    state: DriftState
    since_unix_s: float
    evaluated_unix_s: float | None
    condition: bool | None
    num_shifted_in_row: int
    num_calm_in_row: int
    verdicts: Mapping[str, StageVerdict]
    attribution: Attribution | None

    @property
    def is_active(self) -> bool:
        return self.state is DriftState.DRIFTING


@dataclass(frozen=True)
class RouteBaseline:
    """How far one route's baseline has come.

    Attributes:
        route: Route name.
        is_frozen: Frozen and judged against; else still learning (or waiting for ready).
        num_samples: Samples in the baseline of the stage that decides
            whether the route is judged (``total``), learned sub-windows only.
        min_samples: Samples it needs before it can be frozen.
    """

    route: str
    is_frozen: bool
    num_samples: int
    min_samples: int


@dataclass(frozen=True)
class StageExport:
    """What the Prometheus summary shows for one (route, stage).

    ``quantiles_s`` come from the sliding window (NaN when it is empty);
    ``count`` and ``sum_s`` from the lifetime digest.
    """

    route: str
    stage: str
    quantiles_s: tuple[float, ...]
    count: int
    sum_s: float


@dataclass(frozen=True)
class ExportSnapshot:
    """Everything the collector exports in one scrape."""

    quantiles: tuple[float, ...]
    stages: tuple[StageExport, ...]
    routes: tuple[RouteDriftStatus, ...]
    num_dropped_records: int
    num_invalid_records: int
    baselines: tuple[RouteBaseline, ...]
