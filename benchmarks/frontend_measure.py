"""The arithmetic of ``benchmarks/frontend.py``: runs pooled per server, ratios to the HTTP floor, verdicts.

A server's CPU per request is pooled over its runs (every run's CPU over
every run's answers). Targets: mmserve's CPU per request, text <= 3.0 x the
floor's, image <= 1.5 x (the floor's + the JPEG's decode alone); and the one
engine process every request passes, as the serial part: text <= 0.6 x the
floor's, image <= 1.0 x. ``capacity_rows`` turns that into requests/s per
engine core and the API-process cores that rate needs. Text answers/s of
--api-workers 2 over 1 is reported without a target: on 2 cores scaling
shows in where the CPU goes, not in throughput. Nothing here starts a server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.harness.cpu_accounting import MAIN_THREAD
from benchmarks.harness.figures import Figure

FLOOR = "floor"
TEXT_CPU_TARGET = 3.0
IMAGE_CPU_TARGET = 1.5
ENGINE_CPU_TARGETS = {"text": 0.6, "image": 1.0}  # the engine's CPU per request, x the floor's
ENGINE, API, SUPERVISOR = "engine_process", "api_process", "supervisor"
ENGINE_MAIN_THREAD = ENGINE + MAIN_THREAD  # its event loop: part of ENGINE's CPU (cpu_by_process_kind)


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


def _split_ms(runs: Sequence[RunResult]) -> dict[tuple[str, str], tuple[dict[str, float], float]]:
    """Per (server, kind): CPU ms per answered request by kind of process, and the runs' wall seconds."""
    split: dict[tuple[str, str], tuple[dict[str, float], float]] = {}
    for server, kind in dict.fromkeys((run.server, run.kind) for run in runs if run.cpu_s_by_process):
        ours = [run for run in runs if (run.server, run.kind) == (server, kind)]
        num_ok = max(sum(run.num_ok for run in ours), 1)
        by_process: dict[str, float] = {}
        for run in ours:
            for process, cpu_s in run.cpu_s_by_process:
                by_process[process] = by_process.get(process, 0.0) + 1000.0 * cpu_s / num_ok
        split[(server, kind)] = by_process, sum(run.wall_s for run in ours)
    return split


def process_split_rows(runs: Sequence[RunResult]) -> list[list[str]]:
    """CPU ms per answered request by kind of process, pooled per mmserve server and request kind."""
    rows = [["kind", "server", "process", "CPU ms/req", "cores"]]
    for (server, kind), (by_process, wall_s) in _split_ms(runs).items():
        if server == FLOOR:
            continue
        num_ok = sum(run.num_ok for run in runs if (run.server, run.kind) == (server, kind))
        for process, cpu_ms in by_process.items():
            cores = cpu_ms * num_ok / 1000.0 / wall_s if wall_s > 0 else 0.0
            rows.append([kind, server, process, f"{cpu_ms:.3f}", f"{cores:.2f}"])
    return rows


def capacity_rows(runs: Sequence[RunResult], floor_ms: dict[str, float]) -> list[list[str]]:
    """The engine as the serial part, per server of several processes and kind of request.

    ``engine/s/core``: requests one engine takes at 100 % of one core
    (1000 / its CPU ms per request); ``API cores``: the API-process cores that
    rate needs (their CPU ms per request x that rate / 1000). ``x floor`` is
    the engine's CPU per request over the floor's (``floor_ms``, by kind),
    judged against ``ENGINE_CPU_TARGETS``. ``main thread`` and ``other
    threads`` split the engine's figure: its event loop (frames, the intake,
    the answers: what each request costs it) and the rest (the compute
    threads' batches, pools), where the split was read.
    """
    rows = [["kind", "server", "engine ms/req", "x floor", "target", "verdict", "engine/s/core", "API ms/req",
             "API cores", "supervisor ms/req", "main thread ms/req", "other threads ms/req"]]
    for (server, kind), (by_process, _) in _split_ms(runs).items():
        if ENGINE not in by_process:
            continue
        engine_ms, api_ms = by_process[ENGINE], by_process.get(API, 0.0)
        rate = 1000.0 / engine_ms if engine_ms > 0 else float("inf")
        floor = floor_ms.get(kind)
        ratio = engine_ms / floor if floor else None
        target = ENGINE_CPU_TARGETS.get(kind)
        verdict = "" if target is None or ratio is None else "met" if ratio <= target else "missed"
        rows.append([kind, server, f"{engine_ms:.3f}", "" if ratio is None else f"{ratio:.2f}",
                     "" if target is None else f"<= {target:g} x floor", verdict, f"{rate:.0f}", f"{api_ms:.3f}",
                     f"{api_ms * rate / 1000.0:.2f}", f"{by_process.get(SUPERVISOR, 0.0):.3f}",
                     *_engine_threads(by_process)])
    return rows


def _engine_threads(by_process: dict[str, float]) -> list[str]:
    """The engine's CPU ms per request in its main thread and in its other threads ("" where not read)."""
    main_ms = by_process.get(ENGINE_MAIN_THREAD)
    if main_ms is None:
        return ["", ""]
    return [f"{main_ms:.3f}", f"{by_process[ENGINE] - main_ms:.3f}"]


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


def headline_figures(table: Sequence[Sequence[str]], capacity: Sequence[Sequence[str]]) -> list[Figure]:
    """The headline's two rows, read off the printed tables (so they match them digit for digit).

    CPU per request against the floor: one process (``mmserve w1``) per kind,
    and its text CPU ms beside the floor's; engine capacity: ``mmserve w2``'s
    engine CPU per text and the requests one engine core takes per kind.
    """
    cells = {(row[0], row[1]): row for row in table[1:]}
    figures = []
    for kind in ("text", "image"):
        if (kind, "mmserve w1") in cells:
            figures.append(Figure("cpu_vs_floor", f"{kind}, one process, x floor", float(cells[kind, "mmserve w1"][5]),
                                  ""))
    if ("text", "mmserve w1") in cells and ("text", FLOOR) in cells:
        figures.append(Figure("cpu_vs_floor", f"text CPU ms/req (floor {cells['text', FLOOR][3]})",
                              float(cells["text", "mmserve w1"][3]), ""))
    engine = {(row[0], row[1]): row for row in capacity[1:]}
    if ("text", "mmserve w2") in engine:
        figures.append(Figure("engine_capacity", "text, engine ms/req", float(engine["text", "mmserve w2"][2]), ""))
    for kind, label in (("text", "texts"), ("image", "images")):
        if (kind, "mmserve w2") in engine:
            figures.append(Figure("engine_capacity", f"{label} per engine core", int(engine[kind, "mmserve w2"][6]),
                                  "/s"))
    return figures
