"""Fault drills: delay a stage for a fraction of its executions, for a while.

Off unless the server was started with fault injection enabled. Operators use
it to rehearse their alerts (a 172 ms stall in ``vision`` for 20 % of
requests should raise drift attributed to ``vision``); tests use it to keep
the compute thread busy on purpose. A compute stage (``vision``, ``text``,
``fusion``) is delayed per batch, so every request in a delayed batch sees
it; ``decode`` is delayed per request. A drill can be kept to one image
encoding (``only_encoding="png"``: the "clients started sending 4K PNGs"
incident, which attribution by input value should name): a ``decode`` drill
then delays only requests whose images have it, a compute drill only batches
holding such a request (a batch waits for its slowest image).

Several processes (``--api-workers N``) share one set of drills: the engine's
injector holds them, and every change (``subscribe``) is copied to each API
process's injector as ``entries()`` -> ``adopt()``, so a drill runs wherever
its stage runs.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from router.image_header import ENCODINGS

FAULT_STAGES: tuple[str, ...] = ("decode", "vision", "text", "fusion")


@dataclass(frozen=True)
class FaultPlan:
    stage: str
    delay_ms: float
    fraction: float
    duration_s: float
    only_encoding: str | None = None  # delay only requests (decode) or batches (compute) with this encoding

    def __post_init__(self) -> None:
        if self.stage not in FAULT_STAGES:
            raise ValueError(f"stage must be one of {FAULT_STAGES}, got {self.stage!r}")
        if not 0 <= self.fraction <= 1:
            raise ValueError("fraction must lie in [0, 1]")
        if self.delay_ms < 0 or self.duration_s <= 0:
            raise ValueError("delay_ms must be >= 0 and duration_s > 0")
        if self.only_encoding is not None and self.only_encoding not in ENCODINGS:
            raise ValueError(f"only_encoding must be one of {ENCODINGS}, got {self.only_encoding!r}")


class FaultInjector:
    """Holds the active plans; ``after_stage(stage)`` sleeps when a plan says so."""

    def __init__(self, clock_s: Callable[[], float] = time.monotonic,
                 sleep_s: Callable[[float], None] = time.sleep, seed: int | None = None) -> None:
        self._plans: dict[str, tuple[FaultPlan, float]] = {}
        self._lock = threading.Lock()
        self._clock_s = clock_s
        self._sleep_s = sleep_s
        self._random = random.Random(seed)
        self._watchers: list[Callable[[], None]] = []

    def subscribe(self, on_change: Callable[[], None]) -> None:
        """Call ``on_change`` (in the caller's thread) after every ``activate`` and ``clear``."""
        self._watchers.append(on_change)

    def activate(self, plan: FaultPlan) -> float:
        """Start ``plan`` (replacing one for the same stage); returns its end time."""
        ends_at = self._clock_s() + plan.duration_s
        with self._lock:
            self._plans[plan.stage] = (plan, ends_at)
        self._changed()
        return ends_at

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()
        self._changed()

    def entries(self) -> tuple[tuple[FaultPlan, float], ...]:
        """Every active plan with the seconds it has left: what ``adopt`` takes (a clock-free copy)."""
        now = self._clock_s()
        with self._lock:
            return tuple((plan, ends_at - now) for plan, ends_at in self._plans.values() if ends_at > now)

    def adopt(self, entries: Collection[tuple[FaultPlan, float]]) -> None:
        """Hold exactly ``entries`` (another injector's ``entries()``) from now on; watchers are not called."""
        now = self._clock_s()
        with self._lock:
            self._plans = {plan.stage: (plan, now + remaining_s) for plan, remaining_s in entries}

    def _changed(self) -> None:
        for on_change in self._watchers:
            on_change()

    def active(self) -> list[FaultPlan]:
        now = self._clock_s()
        with self._lock:
            return [plan for plan, ends_at in self._plans.values() if ends_at > now]

    def after_stage(self, stage: str, image_encodings: Collection[str | None] = ()) -> None:
        """Sleep if a plan for ``stage`` says so.

        ``image_encodings``: of the request (decode) or of the batch's
        requests (compute stages), as ``router.image_header`` names them; a
        plan kept to one encoding delays only when it is among them.
        """
        with self._lock:
            entry = self._plans.get(stage)
            if entry is None:
                return
            plan, ends_at = entry
            if self._clock_s() >= ends_at:
                del self._plans[stage]
                return
            if plan.only_encoding is not None and plan.only_encoding not in image_encodings:
                return
            hit = self._random.random() < plan.fraction
        if hit:
            self._sleep_s(plan.delay_ms / 1000.0)
