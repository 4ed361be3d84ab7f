"""Drift detection on a manual clock: no false alarm, detection, attribution, clearing, tail rule."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from monitoring import BaselinePhase, DriftState, MonitorConfig, MonitorStateError
from monitoring.drift import RouteDriftTracker
from monitoring_traffic import TrafficSimulator, lognormal_ns

STALL_NS = 172_000_000


def steady(rng: np.random.Generator, n: int, now_s: float, hits: np.ndarray | None) -> dict[str, np.ndarray]:
    return {
        "decode": lognormal_ns(rng, 0.0005, 0.1, n),
        "queue": lognormal_ns(rng, 0.002, 0.5, n),
        "vision": lognormal_ns(rng, 0.020, 0.3, n),
        "respond": lognormal_ns(rng, 0.0002, 0.2, n),
    }


def vision_stall(fraction: float, only_misses: bool = False):
    def sampler(rng: np.random.Generator, n: int, now_s: float, hits: np.ndarray | None) -> dict[str, np.ndarray]:
        stages = steady(rng, n, now_s, hits)
        stalled = rng.random(n) < fraction
        if only_misses:
            assert hits is not None
            stalled &= ~hits
        stages["vision"] = stages["vision"] + stalled * STALL_NS
        return stages

    return sampler


def learn_baseline(sim: TrafficSimulator, config: MonitorConfig, rate: int, **kwargs: object) -> None:
    sim.run(10, rate, steady, **kwargs)  # traffic before readiness
    sim.monitor.mark_ready()
    sim.run(int(config.baseline_s), rate, steady, **kwargs)
    assert sim.monitor.baseline_phase.value == "frozen"


def periods_until(sim: TrafficSimulator, start_index: int, state: DriftState) -> int | None:
    """1-based number of judged periods after ``start_index`` until the route is in ``state``."""
    for k, (_, statuses) in enumerate(sim.evaluations[start_index:], start=1):
        if statuses[sim.route].state is state:
            return k
    return None


def test_stationary_traffic_never_drifts(simulator_factory, small_config: MonitorConfig) -> None:
    sim = simulator_factory(small_config, seed=1)
    learn_baseline(sim, small_config, rate=300)
    start = len(sim.evaluations)
    sim.run(300, 300, steady)
    judged = [statuses["vision"] for _, statuses in sim.evaluations[start:]]
    assert len(judged) == 30
    assert all(s.verdicts["total"].is_judged for s in judged)
    assert all(s.state is DriftState.STABLE for s in judged)
    assert all(s.condition is False for s in judged)
    # At ~10^4 samples a side, noise alone reaches D ~ 0.02; the KS noise floor is what keeps it quiet.
    assert all(s.verdicts["total"].ks < s.verdicts["total"].noise_floor for s in judged)


BATCH = 8


def batch_shared(rng: np.random.Generator, n: int, now_s: float, hits: np.ndarray | None) -> dict[str, np.ndarray]:
    """``steady``, but each batch of ``BATCH`` requests shares one vision time, as a real batch does."""
    stages = steady(rng, n, now_s, hits)
    stages["vision"] = np.repeat(lognormal_ns(rng, 0.020, 0.3, -(-n // BATCH)), BATCH)[:n]
    return stages


def stationary_batched_run(sim, config: MonitorConfig, record_batch_sizes: bool) -> list:
    sizes = np.array([BATCH]) if record_batch_sizes else None
    sim.run(10, 400, batch_shared, batch_sizes=sizes)
    sim.monitor.mark_ready()
    sim.run(int(config.baseline_s), 400, batch_shared, batch_sizes=sizes)
    start = len(sim.evaluations)
    sim.run(300, 400, batch_shared, batch_sizes=sizes)
    return [statuses["vision"] for _, statuses in sim.evaluations[start:]]


def test_batch_shared_times_are_judged_on_their_batches_not_their_requests(simulator_factory,
                                                                           small_config: MonitorConfig) -> None:
    """Requests of one batch share its vision time: 16000 window samples are 2000 observations.

    Counted as requests, the floor sits sqrt(8) too low and stationary
    traffic crosses it; counted in batches (the batch size recorded), it
    never does, and the verdict says how many observations it judged.
    """
    config = dataclasses.replace(small_config, threshold=0.01)  # the floor alone guards against noise
    counted_in_batches = stationary_batched_run(simulator_factory(config, seed=3), config, True)
    counted_as_requests = stationary_batched_run(simulator_factory(config, seed=3), config, False)

    assert len(counted_in_batches) == len(counted_as_requests) == 30
    vision = [s.verdicts["vision"] for s in counted_in_batches]
    assert all(v.observations_window == pytest.approx(v.num_window / BATCH) for v in vision)
    assert all(v.observations_baseline == pytest.approx(v.num_baseline / BATCH) for v in vision)
    assert all(not v.is_ks_shift for v in vision), [(v.ks, v.noise_floor) for v in vision]
    assert all(s.state is DriftState.STABLE for s in counted_in_batches)
    decode = counted_in_batches[-1].verdicts["decode"]  # each request's own stage counts requests
    assert decode.observations_window == decode.num_window

    as_requests = [s.verdicts["vision"] for s in counted_as_requests]
    assert all(v.observations_window == v.num_window for v in as_requests)
    assert sum(v.is_ks_shift for v in as_requests) >= 3, [(v.ks, v.noise_floor) for v in as_requests]


def test_vision_stall_is_detected_within_three_periods_and_attributed(
    simulator_factory, small_config: MonitorConfig
) -> None:
    sim = simulator_factory(small_config, seed=2)
    learn_baseline(sim, small_config, rate=300)
    sim.run(30, 300, steady)
    start = len(sim.evaluations)
    sim.run(30, 300, vision_stall(0.2))

    assert periods_until(sim, start, DriftState.DRIFTING) is not None
    assert periods_until(sim, start, DriftState.DRIFTING) <= small_config.consecutive
    status = sim.monitor.drift_status()["vision"]
    assert status.is_active
    assert status.attribution is not None
    assert status.attribution.top_stage == "vision"
    assert status.attribution.by_ks[0].stage == "vision"
    assert status.attribution.by_tail_share[0].stage == "vision"
    assert status.attribution.by_tail_share[0].score == pytest.approx(1.0, abs=0.1)
    view = sim.monitor.drift_view()["routes"]["vision"]
    assert view["state"] == "drifting" and view["attributed_stage"] == "vision"
    assert view["since_unix_s"] == status.since_unix_s


def test_drift_clears_after_the_shift_ends(simulator_factory, small_config: MonitorConfig) -> None:
    sim = simulator_factory(small_config, seed=3)
    learn_baseline(sim, small_config, rate=300)
    sim.run(40, 300, vision_stall(0.2))
    assert sim.monitor.drift_status()["vision"].is_active
    start = len(sim.evaluations)
    sim.run(150, 300, steady)
    # The window still holds shifted traffic for window_s; then `consecutive` calm periods clear it.
    bound = int(small_config.window_s / small_config.period_s) + small_config.consecutive + 1
    cleared_after = periods_until(sim, start, DriftState.STABLE)
    assert cleared_after is not None and cleared_after <= bound
    assert sim.states()[-1] == "stable"
    assert sim.states()[start + cleared_after - 1:].count("drifting") == 0


def test_tail_ratio_rule_catches_a_p9999_only_shift(simulator_factory, small_config: MonitorConfig) -> None:
    config = dataclasses.replace(small_config, tail_min_exceedances=5)
    sim = simulator_factory(config, seed=4)

    def rare_queue_stall(rng, n, now_s, hits):
        stages = steady(rng, n, now_s, hits)
        stages["queue"] = stages["queue"] + (rng.random(n) < 0.0004) * 200_000_000
        return stages

    learn_baseline(sim, config, rate=2000)
    start = len(sim.evaluations)
    sim.run(30, 2000, rare_queue_stall)

    assert periods_until(sim, start, DriftState.DRIFTING) is not None
    assert periods_until(sim, start, DriftState.DRIFTING) <= config.consecutive
    status = sim.monitor.drift_status()["vision"]
    total = status.verdicts["total"]
    assert total.is_tail_shift and not total.is_ks_shift
    assert total.ks < config.threshold
    assert total.tail_ratios[0.9999] >= config.tail_ratio
    assert status.attribution is not None
    assert status.attribution.quantile == 0.9999
    assert status.attribution.top_stage == "queue"


def test_shift_only_on_cache_misses_is_separated_by_segment(simulator_factory, small_config: MonitorConfig) -> None:
    sim = simulator_factory(small_config, seed=5)
    batch_sizes = np.array([1, 8])
    learn_baseline(sim, small_config, rate=400, batch_sizes=batch_sizes, cache_hit_ratio=0.5)
    sim.run(40, 400, vision_stall(0.4, only_misses=True), batch_sizes=batch_sizes, cache_hit_ratio=0.5)

    status = sim.monitor.drift_status()["vision"]
    assert status.is_active
    attribution = status.attribution
    assert attribution is not None and attribution.top_stage == "vision"
    by_segment = {(s.dimension, s.value): s for s in attribution.segments}
    assert set(by_segment) == {("cache", "hit"), ("cache", "miss"), ("batch_size", "1"), ("batch_size", "5-8")}
    assert by_segment[("cache", "miss")].is_shifted and not by_segment[("cache", "hit")].is_shifted
    assert [(s.dimension, s.value) for s in attribution.separating_segments] == [("cache", "miss")]


def test_too_few_samples_in_the_window_are_not_judged(simulator_factory, small_config: MonitorConfig) -> None:
    sim = simulator_factory(small_config, seed=6)
    learn_baseline(sim, small_config, rate=300)
    sim.run(60, 20, vision_stall(1.0))  # a 40 s window at 20/s: 800 < min_samples
    status = sim.monitor.drift_status()["vision"]
    assert status.verdicts["total"].ks > 0.5  # a huge shift ...
    assert not status.verdicts["total"].is_judged  # ... that is not judged on too little data
    assert status.condition is None and status.state is DriftState.STABLE


def test_an_idle_start_keeps_learning_and_says_how_far_it_is(simulator_factory, small_config: MonitorConfig) -> None:
    sim = simulator_factory(small_config, seed=11)
    sim.monitor.mark_ready()
    sim.run(3 * int(small_config.baseline_s), 0, steady)  # idle three times baseline_s: nothing to learn from
    assert sim.monitor.baseline_phase is BaselinePhase.LEARNING
    assert sim.monitor.drift_view()["baseline"]["phase"] == "learning"
    sim.run(int(small_config.baseline_s), 5, steady)  # a trickle: 300 samples, far from min_samples
    status = sim.monitor.drift_status()["vision"]
    assert status.state is DriftState.LEARNING_BASELINE and status.verdicts == {} and status.evaluated_unix_s is None
    assert set(sim.states()) == {"learning_baseline"}  # never "stable" about a baseline it cannot judge against
    route = sim.monitor.drift_view()["routes"]["vision"]
    assert route["state"] == "learning_baseline" and route["active"] is False
    assert route["baseline"] == {"frozen": False, "num_samples": 300, "min_samples": 2000}  # every sub-window closed


def test_traffic_after_an_idle_start_completes_the_baseline_and_a_shift_is_judged(
    simulator_factory, small_config: MonitorConfig
) -> None:
    sim = simulator_factory(small_config, seed=12)
    sim.monitor.mark_ready()
    sim.run(2 * int(small_config.baseline_s), 0, steady)  # idle past baseline_s
    sim.run(5, 300, steady)  # 1500 samples: not yet enough
    assert sim.monitor.drift_status()["vision"].state is DriftState.LEARNING_BASELINE
    sim.run(5, 300, steady)  # 3000 by now (of the closed sub-windows, at least 2000)
    assert sim.monitor.baseline_phase is BaselinePhase.FROZEN
    route = sim.monitor.drift_view()["routes"]["vision"]
    assert route["state"] == "stable" and route["baseline"]["frozen"] is True
    assert route["baseline"]["num_samples"] >= small_config.min_samples
    start = len(sim.evaluations)
    sim.run(60, 300, vision_stall(0.2))
    states = [statuses["vision"].state for _, statuses in sim.evaluations[start:]]
    assert all(statuses["vision"].verdicts["total"].is_judged for _, statuses in sim.evaluations[start:])
    assert DriftState.DRIFTING in states, states
    assert sim.monitor.drift_status()["vision"].attribution.top_stage == "vision"


def test_a_route_first_seen_after_the_freeze_learns_its_own_baseline(
    simulator_factory, small_config: MonitorConfig
) -> None:
    sim = simulator_factory(small_config, seed=13)
    learn_baseline(sim, small_config, rate=300)
    late = simulator_factory(small_config, seed=14, route="text")
    late.monitor = sim.monitor
    late.run(20, 20, steady)  # 400 samples on a new route
    assert sim.monitor.drift_status()["text"].state is DriftState.LEARNING_BASELINE
    assert sim.monitor.drift_status()["vision"].state is DriftState.STABLE  # the learned route goes on being judged
    assert sim.monitor.baseline_phase is BaselinePhase.LEARNING
    late.run(10, 300, steady)
    assert sim.monitor.drift_status()["text"].state is DriftState.STABLE
    assert sim.monitor.baseline_phase is BaselinePhase.FROZEN


def test_relearning_waits_for_samples_too(simulator_factory, small_config: MonitorConfig) -> None:
    sim = simulator_factory(small_config, seed=15)
    learn_baseline(sim, small_config, rate=300)
    sim.monitor.relearn_baseline()
    sim.run(2 * int(small_config.baseline_s), 10, steady)  # 1200 samples in 120 s
    assert sim.monitor.drift_status()["vision"].state is DriftState.LEARNING_BASELINE
    assert sim.monitor.drift_view()["routes"]["vision"]["baseline"]["frozen"] is False
    sim.run(10, 300, steady)
    assert sim.monitor.drift_status()["vision"].state is DriftState.STABLE


def test_baseline_learns_only_after_ready(simulator_factory, small_config: MonitorConfig) -> None:
    sim = simulator_factory(small_config, seed=7)
    assert sim.monitor.drift_status() == {}
    sim.run(30, 300, vision_stall(1.0))  # slow warm-up traffic before readiness
    assert sim.monitor.drift_status()["vision"].state is DriftState.WAITING_FOR_READY
    sim.monitor.mark_ready()
    assert sim.monitor.drift_status()["vision"].state is DriftState.LEARNING_BASELINE
    sim.run(int(small_config.baseline_s), 300, steady)
    assert sim.monitor.drift_status()["vision"].state is DriftState.STABLE
    start = len(sim.evaluations)
    sim.run(60, 300, steady)
    assert all(statuses["vision"].condition is False for _, statuses in sim.evaluations[start:])


def test_relearn_baseline_accepts_the_new_normal(simulator_factory, small_config: MonitorConfig) -> None:
    sim = simulator_factory(small_config, seed=8)
    with pytest.raises(MonitorStateError):
        sim.monitor.relearn_baseline()
    learn_baseline(sim, small_config, rate=300)
    sim.run(40, 300, vision_stall(0.2))
    assert sim.monitor.drift_status()["vision"].is_active
    sim.monitor.relearn_baseline()
    assert sim.monitor.drift_status()["vision"].state is DriftState.LEARNING_BASELINE
    assert sim.monitor.drift_view()["baseline"]["phase"] == "learning"
    sim.run(int(small_config.baseline_s), 300, vision_stall(0.2))
    start = len(sim.evaluations)
    sim.run(60, 300, vision_stall(0.2))
    assert [statuses["vision"].state for _, statuses in sim.evaluations[start:]] == [DriftState.STABLE] * 6


def test_tracker_needs_consecutive_periods_to_raise_and_to_clear() -> None:
    tracker = RouteDriftTracker(consecutive=3, now_unix_s=0.0)
    tracker.set_state(DriftState.STABLE, 0.0)
    for t, condition in enumerate([True, True, None, True, True]):
        assert not tracker.observe(condition, float(t))
    assert tracker.state is DriftState.STABLE  # a period without data broke the streak
    assert tracker.observe(True, 5.0)
    assert tracker.state is DriftState.DRIFTING and tracker.since_unix_s == 5.0
    for t, condition in enumerate([False, None, False, True, False, False], start=6):
        assert not tracker.observe(condition, float(t))
    assert tracker.state is DriftState.DRIFTING  # None did not count, True reset the calm streak
    assert tracker.observe(False, 12.0)
    assert tracker.state is DriftState.STABLE and tracker.since_unix_s == 12.0
