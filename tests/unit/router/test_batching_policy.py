"""The batching policy on a fake clock: closing rules, buckets, EDF, priorities and aging."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from router.lanes import Lane, LaneSettings, Pending
from router.policy import decide, select_batch, urgency_ns, work_ahead_ns
from router.request import InferenceRequest, Priority, Route
from router.scheduler import Scheduler
from router.service_time import ServiceTimeEstimator

MS = 1_000_000
STEP = 1_000 * MS
_LOOP = asyncio.new_event_loop()


def no_estimate(route: Route, size: int) -> int:
    return 0


def pending(enqueued_ms: float, *, deadline_ms: float = 10_000, priority=Priority.NORMAL, text: bool = True,
            bucket: int = 0, name: str = "", num_images: int = 1) -> Pending:
    request = InferenceRequest(
        request_id=name or f"r{enqueued_ms}",
        token_ids=(2, 3) if text else None,
        images=() if text else (np.zeros((4, 4, 3), np.uint8),) * num_images,
        deadline_ns=int(deadline_ms * MS),
        priority=priority,
    )
    return Pending(request, int(enqueued_ms * MS), _LOOP.create_future(), _LOOP,
                   urgency_ns=urgency_ns(request.deadline_ns, priority, STEP), length_bucket=bucket)


def lane(route: Route = Route.TEXT, max_batch_size: int = 4, delay_ms: float = 5) -> Lane:
    return Lane(route, LaneSettings(max_batch_size=max_batch_size, max_queue_delay_ns=int(delay_ms * MS)))


def names(batch) -> list[str]:
    return [p.request.request_id for p in batch]


def test_nothing_queued_waits_for_a_put():
    decision = decide([lane()], 0, no_estimate)
    assert decision.lane is None and decision.wait_ns is None


def test_a_partial_batch_closes_when_the_oldest_has_waited_the_delay():
    text = lane()
    text.queue.extend([pending(0), pending(1)])
    waiting = decide([text], 2 * MS, no_estimate)
    assert waiting.lane is None and waiting.wait_ns == 3 * MS
    closed = decide([text], 5 * MS, no_estimate)
    assert closed.lane is text and len(closed.batch) == 2 and len(text.queue) == 0


def test_a_full_batch_closes_at_once_and_takes_at_most_the_cap():
    text = lane(max_batch_size=3)
    text.queue.extend(pending(i, name=f"r{i}") for i in range(5))
    decision = decide([text], 0, no_estimate)
    assert names(decision.batch) == ["r0", "r1", "r2"] and names(text.queue) == ["r3", "r4"]


def test_a_batch_closes_early_when_waiting_would_miss_the_deadline():
    text = lane(delay_ms=50)
    text.queue.append(pending(0, deadline_ms=30))

    def estimate(route, size):
        return 20 * MS  # a batch takes 20 ms: must start by t = 10 ms

    assert decide([text], 5 * MS, estimate).wait_ns == 5 * MS
    assert decide([text], 10 * MS, estimate).lane is text


def test_expired_and_cancelled_requests_never_take_a_slot():
    text = lane(max_batch_size=2)
    expired, cancelled, alive = pending(0, deadline_ms=1, name="e"), pending(0, name="c"), pending(0, name="a")
    cancelled.future.cancel()
    text.queue.extend([expired, cancelled, alive])
    decision = decide([text], 6 * MS, no_estimate)
    assert names(decision.expired) == ["e"]
    assert names(decision.batch) == ["a"]


def test_earliest_deadline_first_across_lanes():
    text, vision = lane(Route.TEXT), lane(Route.VISION)
    vision.queue.append(pending(0, deadline_ms=900, text=False, name="vision"))
    text.queue.append(pending(1, deadline_ms=100, name="text"))
    assert decide([vision, text], 10 * MS, no_estimate).lane is text


def test_an_open_lane_never_holds_a_closed_one():
    text, fusion = lane(Route.TEXT), lane(Route.FUSION, max_batch_size=1)
    text.queue.append(pending(2, deadline_ms=50))  # more urgent but still collecting
    fusion.queue.append(pending(3, deadline_ms=900))  # full
    assert decide([text, fusion], 3 * MS, no_estimate).lane is fusion


def test_priority_orders_service_within_a_lane():
    text = lane(max_batch_size=1)
    text.queue.extend([pending(0, priority=Priority.LOW, name="low"), pending(1, name="normal"),
                       pending(2, priority=Priority.HIGH, name="high")])
    order = [names(decide([text], 10 * MS, no_estimate).batch)[0] for _ in range(3)]
    assert order == ["high", "normal", "low"]


def test_a_low_request_ages_past_newcomers_and_is_never_starved():
    text = lane(max_batch_size=1)
    text.queue.append(pending(0, deadline_ms=10_000, priority=Priority.LOW, name="low"))
    # A stream of normal requests, each with the same timeout from its arrival.
    served_before_low = 0
    for arrival_ms in range(0, 5_000, 100):
        text.queue.append(pending(arrival_ms, deadline_ms=arrival_ms + 10_000, name=f"n{arrival_ms}"))
        batch = decide([text], (arrival_ms + 10) * MS, no_estimate).batch
        if names(batch) == ["low"]:
            break
        served_before_low += 1
    else:
        pytest.fail("the low-priority request was starved")
    # It waits for exactly the normals that arrived within one priority step of it.
    assert served_before_low == STEP // (100 * MS)


def test_text_batches_group_one_length_bucket_then_shorter():
    text = lane(max_batch_size=3)
    text.queue.extend([pending(0, bucket=32, name="long-head"), pending(1, bucket=8, name="short"),
                       pending(2, bucket=128, name="longest"), pending(3, bucket=32, name="long")])
    assert names(select_batch(text)) == ["long-head", "long", "short"]


def test_work_ahead_counts_only_more_urgent_items_in_whole_batches():
    text, vision = lane(Route.TEXT, max_batch_size=2), lane(Route.VISION, max_batch_size=4)
    text.queue.extend([pending(0, deadline_ms=10), pending(0, deadline_ms=20), pending(0, deadline_ms=30)])
    vision.queue.extend([pending(0, deadline_ms=15, text=False), pending(0, deadline_ms=999, text=False)])
    cost = {Route.TEXT: 1 * MS, Route.VISION: 10 * MS}
    ahead = work_ahead_ns([text, vision], urgency_limit_ns=25 * MS,
                          estimate_ns=lambda route, size: cost[route] * size)
    assert ahead == 2 * 1 * MS + 1 * 10 * MS  # two text items (one batch of 2), one vision item


def test_a_lanes_kept_work_total_follows_what_the_policy_takes_out():
    vision = lane(Route.VISION, max_batch_size=4)
    cancelled = pending(0, deadline_ms=900, text=False, num_images=2, name="cancelled")
    vision.queue.extend([pending(0, deadline_ms=5, text=False, num_images=3, name="expires"), cancelled,
                         pending(1, deadline_ms=700, text=False, num_images=3, name="runs"),
                         pending(2, deadline_ms=800, text=False, num_images=2, name="stays")])
    assert vision.queue.work_items == 10 and vision.queue.latest_urgency_ns == 900 * MS
    cancelled.future.cancel()
    decision = decide([vision], now_ns=10 * MS, estimate_ns=no_estimate)  # full: 3 + 2 = 5 work items queued
    assert names(decision.expired) == ["expires"] and names(decision.batch) == ["runs"]
    assert names(vision.queue) == ["stays"]
    assert vision.queue.work_items == 2 and vision.queue.latest_urgency_ns == 800 * MS
    vision.queue.append(pending(3, deadline_ms=600, text=False, name="more urgent"))
    # above every queued urgency the kept total answers; below one, only the items up to it count
    assert vision.queue.work_items_up_to(10_000 * MS) == vision.queue.work_items == 3
    assert vision.queue.work_items_up_to(700 * MS) == 1


def test_admission_refuses_a_full_queue_and_a_hopeless_deadline():
    text = Lane(Route.TEXT, LaneSettings(max_batch_size=2, max_queue_size=2, max_queue_delay_ns=10**12))
    estimator = ServiceTimeEstimator()
    estimator.observe(Route.TEXT, 1, 100 * MS)
    estimator.observe(Route.TEXT, 2, 150 * MS)
    scheduler = Scheduler([text], estimator, clock_ns=lambda: 0)
    assert scheduler.admit(text, pending(0, deadline_ms=100)) is None
    hopeless = scheduler.admit(text, pending(0, deadline_ms=150))  # 100 ms ahead + 100 ms own
    assert hopeless is not None and hopeless.reason == "deadline"
    assert scheduler.admit(text, pending(0, deadline_ms=1_000)) is None
    full = scheduler.admit(text, pending(0, deadline_ms=10_000))
    assert full.reason == "queue_full" and full.retry_after_s == pytest.approx(0.15)


def test_a_deadline_shorter_than_the_requests_own_compute_time_is_told_apart_from_load():
    """Nothing ahead to blame: ``deadline_too_short`` (a retry cannot help); the same deadline behind queued work
    that alone makes it miss: ``deadline``, with the time to drain as the retry hint."""
    text = Lane(Route.TEXT, LaneSettings(max_batch_size=1, max_queue_size=4, max_queue_delay_ns=10**12))
    estimator = ServiceTimeEstimator()
    estimator.observe(Route.TEXT, 1, 100 * MS)
    scheduler = Scheduler([text], estimator, clock_ns=lambda: 10 * MS)
    too_short = scheduler.admit(text, pending(10, deadline_ms=60))
    assert too_short is not None and too_short.reason == "deadline_too_short"
    assert (too_short.service_ns, too_short.left_ns) == (100 * MS, 50 * MS)
    assert len(text.queue) == 0
    assert scheduler.admit(text, pending(10, deadline_ms=150)) is None  # 100 ms own, 140 ms left: admitted
    behind = scheduler.admit(text, pending(10, deadline_ms=150))  # the same deadline, 100 ms queued ahead
    assert behind is not None and behind.reason == "deadline"
    assert behind.retry_after_s == pytest.approx(0.1)


def test_a_closed_scheduler_drains_what_is_queued():
    text = Lane(Route.TEXT, LaneSettings(max_batch_size=8, max_queue_delay_ns=10**12))
    scheduler = Scheduler([text], ServiceTimeEstimator(), clock_ns=lambda: 0)
    scheduler.admit(text, pending(0, name="a"))
    scheduler.admit(text, pending(0, name="b"))
    scheduler.close()
    assert names(scheduler.next_batch().batch) == ["a", "b"]
    assert scheduler.next_batch() is None


def test_a_draining_scheduler_batches_by_the_policy_not_by_arrival():
    """Urgency first, images counted as work items, cancelled requests dropped: only the waiting stops."""
    vision = lane(Route.VISION, max_batch_size=2, delay_ms=10**6)
    scheduler = Scheduler([vision], ServiceTimeEstimator(), clock_ns=lambda: 0)
    gone = pending(0, text=False, name="gone")
    for queued in (pending(0, text=False, num_images=2, name="pair"), gone,
                   pending(0, text=False, name="solo"), pending(0, text=False, priority=Priority.HIGH, name="high")):
        assert scheduler.admit(vision, queued) is None
    gone.future.cancel()
    scheduler.close()
    batches = []
    while (decision := scheduler.next_batch()) is not None:
        batches.append(names(decision.batch))
    assert batches == [["high", "solo"], ["pair"]]


def test_service_time_estimates_learn_and_interpolate():
    estimator = ServiceTimeEstimator(smoothing=0.5)
    assert estimator.estimate_ns(Route.VISION, 4) == 0
    estimator.observe(Route.VISION, 2, 20 * MS)
    estimator.observe(Route.VISION, 8, 80 * MS)
    assert estimator.estimate_ns(Route.VISION, 4) == 40 * MS
    assert estimator.estimate_ns(Route.VISION, 16) == 160 * MS
    estimator.observe(Route.VISION, 2, 40 * MS)
    assert estimator.estimate_ns(Route.VISION, 2) == 30 * MS


def test_the_padded_size_is_the_next_warmed_shape():
    settings = LaneSettings(max_batch_size=12)
    assert settings.warm_batch_sizes == (1, 2, 4, 8, 12)
    assert [settings.padded_size(n) for n in (1, 3, 5, 9, 12)] == [1, 4, 8, 12, 12]
    assert LaneSettings(max_batch_size=8, preferred_batch_sizes=(4,)).warm_batch_sizes == (4, 8)


def test_a_lane_never_runs_twice_in_a_row_while_another_is_ready():
    """Isolation: with equal timeouts EDF is FIFO; a text request must not wait out every vision batch."""
    text, vision = lane(Route.TEXT, max_batch_size=1), lane(Route.VISION, max_batch_size=1)
    vision.queue.extend(pending(i, deadline_ms=1_000 + i, text=False, name=f"v{i}") for i in range(3))
    text.queue.append(pending(5, deadline_ms=1_005, name="text"))
    order, last = [], None
    for _ in range(4):
        decision = decide([text, vision], 10 * MS, no_estimate, last_route=last)
        order.append(names(decision.batch)[0])
        last = decision.lane.route
    assert order == ["v0", "text", "v1", "v2"]


def test_an_image_batch_with_room_takes_the_other_image_lanes_most_urgent_requests():
    """One vision-encoder pass for both image lanes, as one mixed queue would run, not two part-filled batches."""
    vision, fusion, text = lane(Route.VISION), lane(Route.FUSION), lane(Route.TEXT)
    vision.queue.extend([pending(0, deadline_ms=100, text=False, name="v0"),
                         pending(1, deadline_ms=101, text=False, name="v1")])
    fusion.queue.extend([pending(2, deadline_ms=300, name="f-late"), pending(3, deadline_ms=200, name="f-soon"),
                         pending(4, deadline_ms=400, name="f-last")])
    text.queue.append(pending(0, deadline_ms=50, name="t0"))
    decision = decide([text, vision, fusion], 10 * MS, no_estimate, last_route=Route.TEXT)
    assert decision.lane is vision
    assert names(decision.batch) == ["v0", "v1", "f-soon", "f-late"]  # the cap is 4
    assert names(fusion.queue) == ["f-last"]
    assert names(text.queue) == ["t0"]  # text never joins an image batch


def test_a_text_batch_takes_no_companions_and_a_full_image_batch_takes_none():
    vision, fusion, text = lane(Route.VISION, max_batch_size=2), lane(Route.FUSION, max_batch_size=2), lane()
    vision.queue.extend(pending(i, text=False, name=f"v{i}") for i in range(2))
    fusion.queue.append(pending(0, name="f0"))
    text.queue.append(pending(0, deadline_ms=50, name="t0"))
    first = decide([text, vision, fusion], 10 * MS, no_estimate)
    assert first.lane is text and names(first.batch) == ["t0"]
    second = decide([text, vision, fusion], 10 * MS, no_estimate, last_route=Route.TEXT)
    assert second.lane is vision and names(second.batch) == ["v0", "v1"] and names(fusion.queue) == ["f0"]


def test_image_lanes_warming_different_shapes_do_not_share_batches():
    vision, fusion = lane(Route.VISION, max_batch_size=4), lane(Route.FUSION, max_batch_size=8)
    vision.queue.append(pending(0, text=False, name="v0"))
    fusion.queue.append(pending(0, deadline_ms=20_000, name="f0"))
    decision = decide([vision, fusion], 10 * MS, no_estimate)
    assert decision.lane is vision and names(decision.batch) == ["v0"] and names(fusion.queue) == ["f0"]


def test_a_request_with_k_images_counts_as_k_items_against_the_cap():
    vision = lane(Route.VISION, max_batch_size=8)
    vision.queue.extend([pending(0, text=False, num_images=3, name="a"), pending(1, text=False, num_images=3, name="b"),
                         pending(2, text=False, num_images=3, name="c"), pending(3, text=False, num_images=2, name="d")])
    decision = decide([vision], now_ns=0, estimate_ns=no_estimate)
    # 3 + 3 = 6; c (3 more) would make 9, d (2 more) makes exactly 8: full, so it closes at once.
    assert names(decision.batch) == ["a", "b", "d"]
    assert names(vision.queue) == ["c"]


def test_a_request_with_more_images_than_the_cap_runs_alone():
    vision = lane(Route.VISION, max_batch_size=4)
    vision.queue.extend([pending(0, text=False, num_images=6, name="big"), pending(1, text=False, name="small")])
    assert names(select_batch(vision)) == ["big"]


def test_the_wait_estimate_counts_images_not_requests():
    vision = lane(Route.VISION, max_batch_size=4)
    vision.queue.extend([pending(i, text=False, num_images=4) for i in range(2)])
    per_batch_ns = 1_000

    def estimate(route: Route, size: int) -> int:
        return per_batch_ns * size // 4

    assert work_ahead_ns([vision], urgency_limit_ns=10**18, estimate_ns=estimate) == 2 * per_batch_ns
