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
to read; the files of a process that is no longer running are left out (and
the supervisor removes them when it reaps the process, ``remove_snapshot_files``).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector


SNAPSHOT_DIRECTORY = "metrics"
WAIT_S = 2.0  # how long a scrape waits for the others' answers
_WRITTEN = b"w"

ExemplarRow = list  # [sample name, sample labels, exemplar labels, value, timestamp]: JSON and frames carry it


def snapshot_path(run_directory: str, pid: int) -> Path:
    return Path(run_directory) / SNAPSHOT_DIRECTORY / f"{pid}.json"


def request_socket_path(run_directory: str, pid: int) -> Path:
    return Path(run_directory) / SNAPSHOT_DIRECTORY / f"{pid}.sock"


def remove_snapshot_files(run_directory: str, pid: int) -> None:
    """The snapshot and request socket of ``pid`` removed (it stopped, or it is gone)."""
    snapshot_path(run_directory, pid).unlink(missing_ok=True)
    request_socket_path(run_directory, pid).unlink(missing_ok=True)


def exemplars_of(histogram: Collector) -> list[ExemplarRow]:
    """The exemplars ``histogram``'s samples carry now (only buckets of kept requests have one)."""
    return [[sample.name, dict(sample.labels), dict(sample.exemplar.labels), sample.exemplar.value,
             sample.exemplar.timestamp]
            for family in histogram.collect() for sample in family.samples if sample.exemplar is not None]


def write_snapshot(run_directory: str, registry: CollectorRegistry, exemplars_from: Collector) -> None:
    """This process's snapshot, written whole and renamed into place (a reader never sees half of one)."""
    path = snapshot_path(run_directory, os.getpid())
    path.parent.mkdir(exist_ok=True)
    staging = path.with_suffix(".writing")
    staging.write_text(json.dumps({"text": generate_latest(registry).decode(),
                                   "exemplars": exemplars_of(exemplars_from)}, allow_nan=False))
    os.replace(staging, path)


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
        remove_snapshot_files(run_directory, pid)


def _is_running(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def fresh_snapshots(run_directory: str, wait_s: float = WAIT_S,
                    clock: Callable[[], float] = time.monotonic) -> dict[int, dict]:
    """Every other running API process's snapshot, written after this call began (or, past ``wait_s``, the
    latest one it wrote), by pid. Blocking: call it off the event loop."""
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
    snapshots = {}
    for pid in asked:
        if not _is_running(pid):
            continue
        try:
            snapshots[pid] = json.loads(snapshot_path(run_directory, pid).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            continue  # the process stopped meanwhile
    return snapshots
