"""``benchmarks.engine_floor``'s arithmetic: runs pooled per (engine, tick), the printed table, the saved figures.

Pure functions over plain numbers, so the table's figures are tested without
starting a process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.harness.figures import Figure

MMSERVE = "mmserve engine"
BATCHER = "bare batcher"
FLOOR = "HTTP floor (wrk)"
TARGET_X_FLOOR = 0.6  # issue #42: the engine's CPU per text at most 0.6x the floor's
FIGURE_ROW = "engine_floor"  # benchmarks.headline's row


@dataclass(frozen=True)
class Run:
    """One measured run of one server (the floor under wrk, or an engine under the two clients).

    ``num_batches``/``num_batched``: batches the text lane ran and texts in
    them over the run (None for the floor, which has no batches).
    """

    name: str
    tick_ms: float | None
    cpu_s: float
    wall_s: float
    num_answered: int
    num_failed: int
    num_batches: float | None = None
    num_batched: float | None = None

    @property
    def cpu_ms_per_request(self) -> float:
        return 1000.0 * self.cpu_s / max(self.num_answered, 1)

    @property
    def answered_per_s(self) -> float:
        return self.num_answered / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def mean_batch(self) -> float | None:
        if self.num_batches is None or self.num_batched is None or not self.num_batches:
            return None
        return self.num_batched / self.num_batches


def pooled(runs: Sequence[Run]) -> Run:
    """Several rounds' runs of one (server, tick) as one: CPU, wall time, counts and batches summed."""
    first = runs[0]
    if any((run.name, run.tick_ms) != (first.name, first.tick_ms) for run in runs):
        raise ValueError("pooled runs must be of one server and tick")
    batches = [run.num_batches for run in runs]
    batched = [run.num_batched for run in runs]
    return Run(first.name, first.tick_ms, sum(run.cpu_s for run in runs), sum(run.wall_s for run in runs),
               sum(run.num_answered for run in runs), sum(run.num_failed for run in runs),
               None if None in batches else sum(batches), None if None in batched else sum(batched))  # type: ignore[arg-type]


def pooled_by_key(runs: Sequence[Run]) -> list[Run]:
    """Every (server, tick) pooled, in the order each first ran."""
    keys = list(dict.fromkeys((run.name, run.tick_ms) for run in runs))
    return [pooled([run for run in runs if (run.name, run.tick_ms) == key]) for key in keys]


def x_floor(run: Run, floor: Run) -> float:
    return run.cpu_ms_per_request / floor.cpu_ms_per_request


def table_rows(floor: Run, engines: Sequence[Run]) -> list[list[str]]:
    """Header, the floor, then a row per (engine, tick): answered/s, CPU ms per request, x floor, batch, failed."""
    rows = [["server", "tick ms", "answered/s", "CPU ms/req", "x floor", "mean batch", "failed"],
            [floor.name, "-", f"{floor.answered_per_s:.0f}", f"{floor.cpu_ms_per_request:.3f}", "1.00", "-",
             str(floor.num_failed)]]
    for run in engines:
        batch = run.mean_batch
        rows.append([run.name, f"{run.tick_ms:g}", f"{run.answered_per_s:.0f}", f"{run.cpu_ms_per_request:.3f}",
                     f"{x_floor(run, floor):.2f}", "-" if batch is None else f"{batch:.2f}", str(run.num_failed)])
    return rows


def target_line(floor: Run) -> str:
    return f"target {TARGET_X_FLOOR:g} x floor = {TARGET_X_FLOOR * floor.cpu_ms_per_request:.3f} ms"


def headline_figures(floor: Run, engines: Sequence[Run]) -> list[Figure]:
    """The floor's CPU ms per request, and mmserve's engine and the bare batcher against it at the largest tick,
    rounded as the table prints them."""
    figures = [Figure(FIGURE_ROW, "HTTP floor CPU ms/req", round(floor.cpu_ms_per_request, 3), "ms")]
    largest = max((run.tick_ms for run in engines if run.tick_ms is not None), default=None)
    for name in (MMSERVE, BATCHER):
        run = next((run for run in engines if run.name == name and run.tick_ms == largest), None)
        if run is not None:
            figures.append(Figure(FIGURE_ROW, f"{name} CPU per text, tick {largest:g} ms, x floor",
                                  round(x_floor(run, floor), 2), "x"))
    return figures
