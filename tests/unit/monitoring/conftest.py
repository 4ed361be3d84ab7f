"""Fixtures for the monitoring tests: a manual clock, a small config, a traffic simulator."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from monitoring import ManualClock, Monitor, MonitorConfig
from monitoring_traffic import TrafficSimulator


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def small_config() -> MonitorConfig:
    """Short windows so a test plays minutes, not hours: window 40 s in 4 sub-windows, period 10 s."""
    return MonitorConfig(
        window_s=40.0,
        num_sub_windows=4,
        baseline_s=60.0,
        period_s=10.0,
        min_samples=2000,
        fold_interval_s=1.0,
    )


@pytest.fixture
def simulator_factory(clock: ManualClock) -> Callable[..., TrafficSimulator]:
    """``simulator_factory(config, seed=0, route="vision")`` -> a simulator on the shared clock."""

    def factory(config: MonitorConfig, seed: int = 0, route: str = "vision") -> TrafficSimulator:
        return TrafficSimulator(Monitor(config, clock=clock), clock, np.random.default_rng(seed), route)

    return factory
