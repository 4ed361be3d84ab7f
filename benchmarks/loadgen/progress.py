"""The progress bar shown on stderr while a run is going.

The bar advances with wall time over the scheduled window (the one thing known
in advance for every mode: a Poisson run's request count is random, a closed
loop's unknown), and its postfix counts answers as they arrive. It is redrawn
by a ticker task a few times a second, so the sender never pays for drawing.
"""

from __future__ import annotations

import asyncio
import sys
import time

from tqdm import tqdm

from benchmarks.loadgen.runner import Sample

_TICK_S = 0.25


class RunProgress:
    """Counts answers (``on_sample``) and keeps a tqdm bar current while ``ticking``."""

    def __init__(self, window_s: float, is_enabled: bool) -> None:
        self._window_s = max(window_s, 1e-3)
        self.num_ok = 0
        self.num_errors = 0
        self._bar = tqdm(
            total=round(self._window_s, 1),
            unit="s",
            file=sys.stderr,
            disable=not is_enabled,
            dynamic_ncols=True,
            bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} s{postfix}",
        )

    def on_sample(self, sample: Sample) -> None:
        if sample.is_ok:
            self.num_ok += 1
        else:
            self.num_errors += 1

    async def tick_until_cancelled(self) -> None:
        started_at_s = time.perf_counter()
        while True:
            self._draw(time.perf_counter() - started_at_s)
            await asyncio.sleep(_TICK_S)

    def _draw(self, elapsed_s: float) -> None:
        self._bar.n = round(min(elapsed_s, self._window_s), 1)
        self._bar.set_postfix_str(f"ok={self.num_ok} errors={self.num_errors}", refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        self._bar.n = self._bar.total
        self._bar.set_postfix_str(f"ok={self.num_ok} errors={self.num_errors}", refresh=False)
        self._bar.close()
