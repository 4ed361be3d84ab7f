"""Something a benchmark does every few seconds beside its load, on a thread of its own, for a ``with`` block."""

from __future__ import annotations

import threading
from typing import Self


class PeriodicThread:
    """Calls ``tick()`` every ``interval_s`` from entering the block until leaving it.

    ``is_ticking_at_start``: the first tick comes as the block starts (a
    reading of the state before the load) rather than one interval in.
    """

    def __init__(self, interval_s: float, name: str, *, is_ticking_at_start: bool) -> None:
        self.interval_s = interval_s
        self._is_ticking_at_start = is_ticking_at_start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def tick(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        if self._is_ticking_at_start:
            self.tick()
        while not self._stop.wait(self.interval_s):
            self.tick()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
