"""Each API process's counts and digests, written to the run directory when a scrape asks for them.

The API process that answers ``/metrics`` merges every other API process's
registry (``server.workers.metrics_view``); those live in other processes, so
each writes a snapshot file (its exposition text and its exemplars; the
latency digests are the engine's alone, ``server.workers.engine_monitor``).
A snapshot is written only when asked, and nothing runs on a clock while
nobody scrapes: written every half second (when they still held digests:
thousands of centroids as JSON), they took half of an API process's CPU under
load; a scan of the run directory every 50 ms for requests cost an idle API
process about 40 ms of CPU every 10 s. So each process listens on a Unix
socket of its own, and a scrape connects to it:

    scraper (fresh_snapshots, in /metrics's thread)    every other API process (answer_snapshot_requests)
    ------------------------------------------------    -----------------------------------------------
    connect to each metrics/PID.sock but its own         on a connection: write metrics/PID.json (off
    (refused or missing: that process is gone)           the event loop, one at a time), then send 1 byte
    wait for every byte, WAIT_S at most in all
    read each metrics/PID.json                           a process that did not answer in time is read
                                                         as it last wrote

A process writes one snapshot as it starts listening, so there is always one
to read, and the API process that answers a scrape writes its own from the very
text it sums: so a process's snapshot always holds at least what any scrape
showed of it. The snapshot of a process that is no longer running is not
deleted with it (the supervisor and the process itself remove only the request
socket): the next scrape folds its counters into the carried counts
(``server.workers.counter_carry``) and then removes it, so the server's
counters do not go down when an API process dies or is restarted.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from server.workers.counter_carry import CarriedCounts, add_into, monotonic_series

SNAPSHOT_DIRECTORY = "metrics"
WAIT_S = 2.0  # how long a scrape waits for the others' answers
_WRITTEN = b"w"
_writing = threading.Lock()  # a scrape's own snapshot and an asked one: the later text is the one on disk

ExemplarRow = list  # [sample name, sample labels, exemplar labels, value, timestamp]: JSON and frames carry it


def snapshot_path(run_directory: str, pid: int) -> Path:
    return Path(run_directory) / SNAPSHOT_DIRECTORY / f"{pid}.json"


def request_socket_path(run_directory: str, pid: int) -> Path:
    return Path(run_directory) / SNAPSHOT_DIRECTORY / f"{pid}.sock"


def remove_snapshot_files(run_directory: str, pid: int) -> None:
    """The snapshot and request socket of ``pid`` removed (its counters were folded into the carried counts)."""
    snapshot_path(run_directory, pid).unlink(missing_ok=True)
    request_socket_path(run_directory, pid).unlink(missing_ok=True)


def remove_request_socket(run_directory: str, pid: int) -> None:
    """``pid`` stopped or is gone: no scrape asks it any more; its snapshot stays until a scrape folds it."""
    request_socket_path(run_directory, pid).unlink(missing_ok=True)


def exemplars_of(histogram: Collector) -> list[ExemplarRow]:
    """The exemplars ``histogram``'s samples carry now (only buckets of kept requests have one)."""
    return [[sample.name, dict(sample.labels), dict(sample.exemplar.labels), sample.exemplar.value,
             sample.exemplar.timestamp]
            for family in histogram.collect() for sample in family.samples if sample.exemplar is not None]


def write_snapshot(run_directory: str, registry: CollectorRegistry, exemplars_from: Collector) -> dict:
    """This process's snapshot, written whole and renamed into place (a reader never sees half of one);
    returned, so a scrape this process answers sums exactly what it wrote."""
    path = snapshot_path(run_directory, os.getpid())
    path.parent.mkdir(exist_ok=True)
    staging = path.with_suffix(".writing")
    with _writing:  # read and written in one step: an older text never replaces a newer one
        snapshot = {"text": generate_latest(registry).decode(), "exemplars": exemplars_of(exemplars_from)}
        staging.write_text(json.dumps(snapshot, allow_nan=False))
        os.replace(staging, path)
    return snapshot


async def answer_snapshot_requests(run_directory: str, registry: CollectorRegistry,
                                   exemplars_from: Collector) -> None:
    """Listen on this process's request socket and write a snapshot for each connection, until cancelled."""
    pid = os.getpid()
    writing = asyncio.Lock()  # two scrapes at once: one staging file, one writer

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with writing:
                await asyncio.to_thread(write_snapshot, run_directory, registry, exemplars_from)
            writer.write(_WRITTEN)
            await writer.drain()
        except ConnectionError:
            pass  # the scraper gave up waiting
        finally:
            writer.close()

    path = request_socket_path(run_directory, pid)
    path.parent.mkdir(exist_ok=True)
    path.unlink(missing_ok=True)
    server = await asyncio.start_unix_server(answer, path=str(path))
    try:
        async with writing:  # the one a scrape reads if this process does not answer in time
            await asyncio.to_thread(write_snapshot, run_directory, registry, exemplars_from)
        await asyncio.Future()  # until cancelled
    finally:
        server.close()
        remove_request_socket(run_directory, pid)  # the snapshot is folded by a scrape once this process is gone


def _is_running(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def fresh_snapshots(run_directory: str, wait_s: float = WAIT_S,
                    clock: Callable[[], float] = time.monotonic) -> dict[int, dict]:
    """Every other running API process's snapshot, written after this call began (or, past ``wait_s``, the
    latest one it wrote), by pid. Blocking: call it off the event loop."""
    asked = ask_for_snapshots(run_directory, wait_s, clock)
    snapshots = {}
    for pid in asked:
        if not _is_running(pid):
            continue
        try:
            snapshots[pid] = json.loads(snapshot_path(run_directory, pid).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            continue  # the process stopped meanwhile
    return snapshots


def snapshots_folding_departed(run_directory: str, carried: CarriedCounts) -> dict[int, dict]:
    """Every other running API process's latest snapshot, by pid; the snapshot of each process no longer
    running is folded into ``carried.departed`` and removed (call it holding ``carried``'s lock, after
    ``ask_for_snapshots``: a snapshot is either read here as live or folded, never both)."""
    snapshots = {}
    for path in (Path(run_directory) / SNAPSHOT_DIRECTORY).glob("*.json"):
        if not path.stem.isdigit() or int(path.stem) == os.getpid():
            continue
        pid = int(path.stem)
        try:
            snapshot = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            continue
        if _is_running(pid):
            snapshots[pid] = snapshot
        else:
            add_into(carried.departed, monotonic_series(snapshot["text"]))
            remove_snapshot_files(run_directory, pid)
    return snapshots


def ask_for_snapshots(run_directory: str, wait_s: float = WAIT_S,
                      clock: Callable[[], float] = time.monotonic) -> list[int]:
    """Every other API process asked to write its snapshot now, waited for ``wait_s`` at most in all; the
    pids that accepted the request. Blocking: call it off the event loop."""
    directory = Path(run_directory) / SNAPSHOT_DIRECTORY
    deadline = clock() + wait_s
    asked: dict[int, socket.socket] = {}
    try:
        for path in directory.glob("*.sock"):
            pid = int(path.stem)
            if pid == os.getpid():
                continue
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            connection.settimeout(wait_s)
            try:
                connection.connect(str(path))
            except OSError:  # refused or removed: that process is gone
                connection.close()
                continue
            asked[pid] = connection
        for connection in asked.values():  # every process writes meanwhile
            connection.settimeout(max(deadline - clock(), 1e-3))
            try:
                connection.recv(1)
            except OSError:  # not in time (TimeoutError is one): read as it last wrote
                pass
    finally:
        for connection in asked.values():
            connection.close()
    return list(asked)
