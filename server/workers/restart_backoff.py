"""When the supervisor starts a dead API process again, and when it gives up instead (a crash loop).

Starting a process again at once, for ever, turns a fault that repeats (a
poisoned request, memory the host does not have) into a busy loop of
imports that takes the cores from the processes still serving. So:

    a death           its slot waits, then starts a new process; the wait doubles per death of that
                      slot: 0.5 s, 1, 2, 4 ... at most 30 s, and is 0.5 s again once the slot's
                      process had run a minute before it died
    a crash loop      the 5th death of an API process (any of them) within 60 s: starting them
                      again is not going to help, so the server stops with its own exit status
                      (``server.workers.supervisor.EXIT_API_CRASH_LOOP``) for whatever supervises
                      it (systemd, Kubernetes) to see and act on

With the defaults a process that dies at every start is started again 4
times (0.5 + 1 + 2 + 4 s of waiting, plus its start-ups) before the server
gives up, 8 s or more after the first death; one that dies every few minutes
is started again for ever, each time after 0.5 s.

The clock is injected (``time.monotonic`` by default) so the timing is tested
without waiting.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    first_delay_s: float = 0.5
    max_delay_s: float = 30.0
    reset_after_up_s: float = 60.0  # a process that ran this long died of something new: wait first_delay_s
    max_crashes: int = 5  # this many deaths ...
    crash_window_s: float = 60.0  # ... within this long: a crash loop

    def __post_init__(self) -> None:
        if not 0 < self.first_delay_s <= self.max_delay_s:
            raise ValueError(f"need 0 < first_delay_s <= max_delay_s, got {self.first_delay_s}, {self.max_delay_s}")
        if self.max_crashes < 1 or self.crash_window_s <= 0:
            raise ValueError(f"need max_crashes >= 1 and crash_window_s > 0, got {self.max_crashes}, "
                             f"{self.crash_window_s}")


class RestartBackoff:
    """The supervisor's restart bookkeeping: one slot per API process, deaths counted over all of them."""

    def __init__(self, num_slots: int, policy: RestartPolicy = RestartPolicy(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._policy = policy
        self._clock = clock
        self._started_at = [clock()] * num_slots
        self._next_delay_s = [policy.first_delay_s] * num_slots
        self._deaths: deque[float] = deque()

    @property
    def policy(self) -> RestartPolicy:
        return self._policy

    def started(self, slot: int) -> None:
        """A process was started in ``slot`` now."""
        self._started_at[slot] = self._clock()

    def died(self, slot: int) -> float | None:
        """The clock time at which to start ``slot``'s process again; ``None``: a crash loop, give up."""
        now = self._clock()
        self._deaths.append(now)
        while self._deaths and self._deaths[0] <= now - self._policy.crash_window_s:
            self._deaths.popleft()
        if len(self._deaths) >= self._policy.max_crashes:
            return None
        if now - self._started_at[slot] >= self._policy.reset_after_up_s:
            self._next_delay_s[slot] = self._policy.first_delay_s
        delay_s = self._next_delay_s[slot]
        self._next_delay_s[slot] = min(delay_s * 2, self._policy.max_delay_s)
        return now + delay_s

    @property
    def num_recent_deaths(self) -> int:
        """Deaths within the crash window, as of the last ``died``."""
        return len(self._deaths)
