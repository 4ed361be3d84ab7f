"""Each API process's counts and digests, written to the run directory when a scrape asks for them.

The API process that answers ``/metrics`` merges every other API process's
registry (``server.workers.metrics_view``); those live in other processes, so
each writes a snapshot file (its exposition text and its exemplars; the
latency digests are the engine's alone, ``server.workers.engine_monitor``).
A snapshot is written only when asked, not on a clock: written every half
second (when they still held digests: thousands of centroids as JSON), they
took half of an API process's CPU under load, and their GIL holds stalled its
event loop.

    scraper (fresh_snapshots)                 every other API process (answer_snapshot_requests)
    -------------------------                 -------------------------------------------------
    token = now; create metrics/wanted-TOKEN  every POLL_S: the largest wanted-* token above
                                              the last one answered?
                                                write metrics/PID.json (off the event loop),
                                                then metrics/PID.answered = token
    wait until every running process's .answered >= token (at most WAIT_S; a process that does
    not answer in time is read as it last wrote), remove wanted-TOKEN, read the snapshots

A process writes one snapshot as it starts, so a scrape knows every running
process; the snapshot of a process that is no longer running is left out.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector


SNAPSHOT_DIRECTORY = "metrics"
POLL_S = 0.05  # how often a process looks for a request: a scrape waits about this long
WAIT_S = 2.0  # how long a scrape waits for the others' answers
_WANTED_PREFIX = "wanted-"

ExemplarRow = list  # [sample name, sample labels, exemplar labels, value, timestamp]: JSON and frames carry it


def snapshot_path(run_directory: str, pid: int) -> Path:
    return Path(run_directory) / SNAPSHOT_DIRECTORY / f"{pid}.json"


def _answered_path(run_directory: str, pid: int) -> Path:
    return Path(run_directory) / SNAPSHOT_DIRECTORY / f"{pid}.answered"


def exemplars_of(histogram: Collector) -> list[ExemplarRow]:
    """The exemplars ``histogram``'s samples carry now (only buckets of kept requests have one)."""
    return [[sample.name, dict(sample.labels), dict(sample.exemplar.labels), sample.exemplar.value,
             sample.exemplar.timestamp]
            for family in histogram.collect() for sample in family.samples if sample.exemplar is not None]


def write_snapshot(run_directory: str, registry: CollectorRegistry, exemplars_from: Collector,
                   token: int = 0) -> None:
    """This process's snapshot, then the request ``token`` it answers (so a reader never sees the token first)."""
    path = snapshot_path(run_directory, os.getpid())
    path.parent.mkdir(exist_ok=True)
    staging = path.with_suffix(".writing")
    staging.write_text(json.dumps({"text": generate_latest(registry).decode(),
                                   "exemplars": exemplars_of(exemplars_from)}, allow_nan=False))
    os.replace(staging, path)
    answered = _answered_path(run_directory, os.getpid())
    answered.with_suffix(".answering").write_text(str(token))
    os.replace(answered.with_suffix(".answering"), answered)


def _largest_wanted(directory: Path) -> int:
    try:
        names = [entry.name for entry in os.scandir(directory) if entry.name.startswith(_WANTED_PREFIX)]
    except FileNotFoundError:
        return 0
    return max((int(name.removeprefix(_WANTED_PREFIX)) for name in names), default=0)


async def answer_snapshot_requests(run_directory: str, registry: CollectorRegistry,
                                   exemplars_from: Collector) -> None:
    """Write a snapshot now and then whenever a scrape asks (off the event loop), until cancelled."""
    pid = os.getpid()
    directory = Path(run_directory) / SNAPSHOT_DIRECTORY
    answered = 0
    try:
        await asyncio.to_thread(write_snapshot, run_directory, registry, exemplars_from)
        while True:
            await asyncio.sleep(POLL_S)
            wanted = _largest_wanted(directory)
            if wanted > answered:
                await asyncio.to_thread(write_snapshot, run_directory, registry, exemplars_from, wanted)
                answered = wanted
    finally:
        snapshot_path(run_directory, pid).unlink(missing_ok=True)
        _answered_path(run_directory, pid).unlink(missing_ok=True)


def _is_running(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _answered_token(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def fresh_snapshots(run_directory: str, wait_s: float = WAIT_S,
                    clock: Callable[[], float] = time.monotonic) -> dict[int, dict]:
    """Every other running API process's snapshot, written after this call began (or, past ``wait_s``, the
    latest one it wrote), by pid."""
    directory = Path(run_directory) / SNAPSHOT_DIRECTORY
    directory.mkdir(exist_ok=True)
    token = time.time_ns()
    wanted = directory / f"{_WANTED_PREFIX}{token}"
    wanted.touch()
    try:
        deadline = clock() + wait_s
        while True:
            pids = [int(path.stem) for path in directory.glob("*.json")
                    if int(path.stem) != os.getpid() and _is_running(int(path.stem))]
            waiting = [pid for pid in pids if _answered_token(_answered_path(run_directory, pid)) < token]
            if not waiting or clock() >= deadline:
                break
            time.sleep(POLL_S / 5)
    finally:
        wanted.unlink(missing_ok=True)
    snapshots = {}
    for pid in pids:
        try:
            snapshots[pid] = json.loads(snapshot_path(run_directory, pid).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            continue  # the process stopped meanwhile
    return snapshots
