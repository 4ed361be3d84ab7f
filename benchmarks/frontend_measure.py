"""The arithmetic of ``benchmarks/frontend.py``: runs pooled per server, ratios to the HTTP floor, verdicts.

Strings and numbers in, numbers and rows out; nothing here starts a server.

A server's CPU per request is pooled over its runs (every run's CPU seconds
over every run's answered requests), so a short run weighs what it
measured. The targets (issue "API processes in front of one engine"):

    text   mmserve CPU per request <= 3.0 x the floor's, same body
    image  mmserve CPU per request <= 1.5 x (the floor's + the JPEG's base64-decode, decode and resize alone)
    text   --api-workers 2 answers >= 1.4 x the requests/s of --api-workers 1
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FLOOR = "floor"
TEXT_CPU_TARGET = 3.0
IMAGE_CPU_TARGET = 1.5
WORKERS_SPEEDUP_TARGET = 1.4


@dataclass(frozen=True)
class RunResult:
    """One measured wrk run against one server with one kind of body."""

    server: str
    kind: str
    server_cpu_s: float
    wall_s: float
    num_ok: int
    num_failed: int  # non-2xx answers and socket errors
    cpu_s_by_process: tuple[tuple[str, float], ...] = ()  # (what the process runs, CPU seconds) over the run

    @property
    def ok_rps(self) -> float:
        return self.num_ok / self.wall_s if self.wall_s > 0 else 0.0


def process_split_rows(runs: Sequence[RunResult]) -> list[list[str]]:
    """CPU ms per answered request by kind of process, pooled per server and request kind (servers of several)."""
    rows = [["kind", "server", "process", "CPU ms/req", "cores"]]
    for server, kind in dict.fromkeys((run.server, run.kind) for run in runs if len(run.cpu_s_by_process) > 1):
        ours = [run for run in runs if (run.server, run.kind) == (server, kind)]
        num_ok = max(sum(run.num_ok for run in ours), 1)
        wall_s = sum(run.wall_s for run in ours)
        by_process: dict[str, float] = {}
        for run in ours:
            for process, cpu_s in run.cpu_s_by_process:
                by_process[process] = by_process.get(process, 0.0) + cpu_s
        for process, cpu_s in by_process.items():
            rows.append([kind, server, process, f"{1000.0 * cpu_s / num_ok:.3f}",
                         f"{cpu_s / wall_s if wall_s > 0 else 0.0:.2f}"])
    return rows


@dataclass(frozen=True)
class Pooled:
    """Every run of one server and kind, pooled."""

    server: str
    kind: str
    cpu_ms_per_request: float
    ok_rps: float  # mean over runs
    cores_used: float  # server CPU seconds over wall seconds
    num_failed: int


def pool(runs: Sequence[RunResult]) -> Pooled:
    """Runs of one server and kind -> their pooled CPU per answered request, mean answers/s, cores used."""
    if not runs or len({(run.server, run.kind) for run in runs}) != 1:
        raise ValueError("pool() takes one or more runs of one server and kind")
    cpu_s = sum(run.server_cpu_s for run in runs)
    wall_s = sum(run.wall_s for run in runs)
    return Pooled(runs[0].server, runs[0].kind, 1000.0 * cpu_s / max(sum(run.num_ok for run in runs), 1),
                  sum(run.ok_rps for run in runs) / len(runs), cpu_s / wall_s if wall_s > 0 else 0.0,
                  sum(run.num_failed for run in runs))


def run_order(names: Sequence[str], round_index: int) -> tuple[str, ...]:
    """A-B-B-A over any number of servers: rotated every two rounds, reversed on odd rounds.

    Two servers give A B, B A, B A, A B, ...; three take every place in turn.
    """
    shift = (round_index // 2) % len(names)
    order = tuple(names[shift:]) + tuple(names[:shift])
    return order[::-1] if round_index % 2 else order


def cpu_budget_ms(kind: str, floor_ms: float, decode_alone_ms: float | None) -> tuple[float, str] | None:
    """The CPU per request a kind may take and how it is built; ``None`` for a kind without a target."""
    if kind == "text":
        return TEXT_CPU_TARGET * floor_ms, f"{TEXT_CPU_TARGET:g} x floor"
    if kind == "image" and decode_alone_ms is not None:
        return IMAGE_CPU_TARGET * (floor_ms + decode_alone_ms), f"{IMAGE_CPU_TARGET:g} x (floor + decode)"
    return None


def table_rows(pooled: Sequence[Pooled], decode_alone_ms: float | None) -> list[list[str]]:
    """The result table: per kind, the floor, then each mmserve configuration against its target."""
    rows = [["kind", "server", "answered/s", "CPU ms/req", "cores", "x floor", "budget ms", "target", "verdict",
             "failed"]]
    floors = {p.kind: p for p in pooled if p.server == FLOOR}
    for p in pooled:
        floor = floors.get(p.kind)
        ratio = f"{p.cpu_ms_per_request / floor.cpu_ms_per_request:.2f}" if floor and p.server != FLOOR else ""
        budget = cpu_budget_ms(p.kind, floor.cpu_ms_per_request, decode_alone_ms) if floor else None
        budget_cells = ["", "", ""]
        if budget is not None and p.server != FLOOR:
            limit_ms, rule = budget
            budget_cells = [f"{limit_ms:.3f}", rule, "met" if p.cpu_ms_per_request <= limit_ms else "missed"]
        rows.append([p.kind, p.server, f"{p.ok_rps:.0f}", f"{p.cpu_ms_per_request:.3f}", f"{p.cores_used:.2f}",
                     ratio, *budget_cells, str(p.num_failed)])
    return rows


def workers_speedup(pooled: Sequence[Pooled], one: str, two: str, kind: str = "text") -> float | None:
    """``two``'s answers/s over ``one``'s for ``kind``; ``None`` if either was not measured."""
    by_server = {p.server: p for p in pooled if p.kind == kind}
    if one not in by_server or two not in by_server or by_server[one].ok_rps <= 0:
        return None
    return by_server[two].ok_rps / by_server[one].ok_rps
