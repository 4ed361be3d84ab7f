"""The supervisor's restart timing, on a fake clock: doubling waits, a reset after a minute up, a crash loop."""

from __future__ import annotations

import pytest

from server.workers.restart_backoff import RestartBackoff, RestartPolicy


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def waits_until_give_up(backoff: RestartBackoff, clock: FakeClock, slot: int, up_s: float) -> list[float]:
    """Each death's wait, a process running ``up_s`` each time, until the backoff gives up."""
    waits = []
    while True:
        clock.now_s += up_s
        restart_at = backoff.died(slot)
        if restart_at is None:
            return waits
        waits.append(restart_at - clock.now_s)
        clock.now_s = restart_at
        backoff.started(slot)


def test_waits_double_from_half_a_second_to_thirty_and_never_give_up_when_spread_out():
    clock = FakeClock()
    backoff = RestartBackoff(1, RestartPolicy(), clock)
    waits = []
    for _ in range(9):
        clock.now_s += 20.0  # up 20 s each time: 3 deaths a minute at most, no crash loop
        restart_at = backoff.died(0)
        assert restart_at is not None
        waits.append(restart_at - clock.now_s)
        clock.now_s = restart_at
        backoff.started(0)
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_a_minute_up_resets_the_wait():
    clock = FakeClock()
    backoff = RestartBackoff(1, RestartPolicy(), clock)
    for up_s in (20.0, 20.0, 20.0):
        clock.now_s += up_s
        clock.now_s = backoff.died(0)
        backoff.started(0)
    clock.now_s += 59.0
    assert backoff.died(0) - clock.now_s == 4.0  # the fourth wait: 59 s up is not a minute
    clock.now_s += 4.0
    backoff.started(0)
    clock.now_s += 60.0
    assert backoff.died(0) - clock.now_s == 0.5


def test_five_deaths_within_a_minute_are_a_crash_loop():
    """A process that dies at every start: started again 4 times (0.5 + 1 + 2 + 4 s), then given up."""
    clock = FakeClock()
    backoff = RestartBackoff(2, RestartPolicy(), clock)
    started_s = clock.now_s
    assert waits_until_give_up(backoff, clock, slot=0, up_s=0.3) == [0.5, 1.0, 2.0, 4.0]
    assert clock.now_s - started_s == pytest.approx(0.5 + 1 + 2 + 4 + 5 * 0.3)
    assert backoff.num_recent_deaths == 5


def test_deaths_of_every_slot_count_toward_the_loop_and_each_slot_has_its_own_wait():
    clock = FakeClock()
    backoff = RestartBackoff(3, RestartPolicy(max_crashes=5, crash_window_s=60.0), clock)
    assert backoff.died(0) == clock.now_s + 0.5
    assert backoff.died(1) == clock.now_s + 0.5  # another slot: its own first wait
    assert backoff.died(0) == clock.now_s + 1.0
    clock.now_s += 30.0
    assert backoff.died(2) is not None
    clock.now_s += 29.0
    assert backoff.died(1) is None  # the fifth within 59 s


def test_deaths_older_than_the_window_are_forgotten():
    clock = FakeClock()
    backoff = RestartBackoff(1, RestartPolicy(max_crashes=3, crash_window_s=10.0), clock)
    assert backoff.died(0) is not None
    clock.now_s += 6.0
    assert backoff.died(0) is not None
    clock.now_s += 5.0  # the first is 11 s old now
    assert backoff.died(0) is not None
    assert backoff.num_recent_deaths == 2
    clock.now_s += 1.0
    assert backoff.died(0) is None


@pytest.mark.parametrize("policy", [dict(first_delay_s=0.0), dict(first_delay_s=2.0, max_delay_s=1.0),
                                    dict(max_crashes=0), dict(crash_window_s=0.0)])
def test_a_policy_that_cannot_work_is_refused(policy):
    with pytest.raises(ValueError):
        RestartPolicy(**policy)
