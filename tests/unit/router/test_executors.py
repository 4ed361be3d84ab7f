"""Executor plans: every lane served exactly once, and a thread's priority lowered only for itself."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from router.executors import ExecutorPlan, executor_plans, lower_current_thread_priority, shared_executor, validate
from router.request import Route


def test_the_text_lane_gets_its_own_executor_and_the_image_lanes_a_lower_priority():
    text, image = executor_plans(separate_text=True, image_nice=7)
    assert text.routes == (Route.TEXT,) and text.nice == 0 and text.high_priority_stream
    assert set(image.routes) == {Route.VISION, Route.FUSION} and image.nice == 7
    assert not image.high_priority_stream


def test_without_a_separate_text_executor_one_thread_serves_every_lane():
    (only,) = executor_plans(separate_text=False, image_nice=7)
    assert set(only.routes) == set(Route) and only.nice == 0
    assert executor_plans(separate_text=False, image_nice=7) == shared_executor()


@pytest.mark.parametrize("routes", [
    ((Route.TEXT,), (Route.VISION,)),  # fusion unserved
    ((Route.TEXT, Route.VISION), (Route.VISION, Route.FUSION)),  # vision twice
])
def test_a_lane_unserved_or_served_twice_is_refused(routes):
    with pytest.raises(ValueError, match="exactly one executor"):
        validate(tuple(ExecutorPlan(f"e{i}", group) for i, group in enumerate(routes)))


def test_an_executor_cannot_raise_its_priority():
    with pytest.raises(ValueError, match="nice >= 0"):
        ExecutorPlan("greedy", (Route.TEXT,), nice=-5)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are a Linux notion")
def test_lowering_a_thread_priority_leaves_the_other_threads_alone():
    main_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = {}

    def lowered() -> None:
        seen["applied"] = lower_current_thread_priority(5)
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    thread = threading.Thread(target=lowered)
    thread.start()
    thread.join()
    assert seen == {"applied": True, "nice": min(19, main_nice + 5)}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_nice
    assert lower_current_thread_priority(0) is False
