"""A fault injector's drills copied to another (``--api-workers N``): watchers, entries, adopt."""

from __future__ import annotations

from router.faults import FaultInjector, FaultPlan


class Clock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def test_watchers_hear_every_activate_and_clear_and_entries_say_the_seconds_left():
    clock = Clock(100.0)
    injector = FaultInjector(clock_s=clock)
    heard = []
    injector.subscribe(lambda: heard.append(injector.entries()))
    plan = FaultPlan("decode", delay_ms=150, fraction=1.0, duration_s=60, only_encoding="png")
    injector.activate(plan)
    clock.now_s = 110.0
    assert heard == [((plan, 60.0),)]
    assert injector.entries() == ((plan, 50.0),)
    injector.clear()
    assert heard[-1] == () and len(heard) == 2
    clock.now_s = 200.0
    injector.activate(plan)
    clock.now_s = 261.0
    assert injector.entries() == ()  # over


def test_an_adopted_copy_delays_on_its_own_clock_until_the_originals_end():
    original_clock, copy_clock = Clock(1000.0), Clock(5.0)  # other processes, other clocks: only seconds left travel
    original = FaultInjector(clock_s=original_clock)
    slept: list[float] = []
    copy = FaultInjector(clock_s=copy_clock, sleep_s=slept.append)
    heard = []
    copy.subscribe(lambda: heard.append("changed"))
    original.activate(FaultPlan("decode", delay_ms=150, fraction=1.0, duration_s=30))
    original_clock.now_s = 1010.0
    copy.adopt(original.entries())
    assert heard == []  # a copy does not echo the change back
    copy.after_stage("decode", ("jpeg",))
    copy.after_stage("vision", ("jpeg",))
    assert slept == [0.15]
    copy_clock.now_s = 5.0 + 19.9
    copy.after_stage("decode", (None,))
    assert slept == [0.15, 0.15]
    copy_clock.now_s = 5.0 + 20.0  # the original's end: 30 s after it began
    copy.after_stage("decode", (None,))
    assert slept == [0.15, 0.15] and copy.active() == []


def test_adopting_nothing_ends_every_drill_and_a_later_entry_replaces_the_stage():
    copy = FaultInjector(clock_s=Clock(0.0))
    first = FaultPlan("vision", delay_ms=10, fraction=0.5, duration_s=5)
    copy.adopt([(first, 5.0), (FaultPlan("decode", delay_ms=1, fraction=1.0, duration_s=5), 5.0)])
    assert {plan.stage for plan in copy.active()} == {"vision", "decode"}
    copy.adopt([])
    assert copy.active() == []
    second = FaultPlan("vision", delay_ms=20, fraction=1.0, duration_s=5)
    copy.adopt([(first, 5.0)])
    copy.adopt([(second, 4.0)])
    assert copy.active() == [second]
