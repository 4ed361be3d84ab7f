"""One ``/metrics`` for the whole server, whichever API process answers the scrape.

Every process keeps its own registry: an API process counts its requests and
records its stage latencies (the request layer runs there), the engine counts
batches, queues and the cache. The answering API process merges:

    its own registry            now
    the other API processes'    their snapshots (exposition text + digests document), each written
                                every SNAPSHOT_PERIOD_S to the run directory by the process itself
    the engine's registry       now, over a short connection (``("metrics", id)``), with its digests
                                (the zero-shot routes run and record there: ``server.workers.engine_routes``)

into the same families, series and labels as one process exports:

    counters, histograms, summary _count/_sum   summed over the processes
    stage quantiles (the summary's quantiles)   from the T-Digests of every process merged
                                                (``monitoring.fleet``, as ``mmserve quantiles`` merges a fleet)
    gauges                                       the largest (a queue depth or cache size is set by one
                                                process; a drift flag is up if any process raised it)
    *_created                                    the earliest
    mmserve_api_worker_restarts_total            the supervisor's count (``server.workers.restarts``)

A snapshot of a process that is no longer running is left out; a scrape can
therefore lag another process by up to SNAPSHOT_PERIOD_S.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from monitoring import Monitor
from monitoring.collector import STAGE_LATENCY, SUMMARY_QUANTILES
from monitoring.digest import quantiles_of
from monitoring.fleet import DigestSource, merge_documents
from server.workers.frames import encode_frame, read_frame_blocking
from server.workers.restarts import register_restart_count

SNAPSHOT_PERIOD_S = 0.5
SNAPSHOT_DIRECTORY = "metrics"


def snapshot_path(run_directory: str, pid: int) -> Path:
    return Path(run_directory) / SNAPSHOT_DIRECTORY / f"{pid}.json"


def write_snapshot(run_directory: str, registry: CollectorRegistry, monitor: Monitor) -> None:
    path = snapshot_path(run_directory, os.getpid())
    path.parent.mkdir(exist_ok=True)
    staging = path.with_suffix(".writing")
    staging.write_text(json.dumps({"text": generate_latest(registry).decode(), "digests": monitor.digests_view()},
                                  allow_nan=False))
    os.replace(staging, path)


async def keep_snapshot_fresh(run_directory: str, registry: CollectorRegistry, monitor: Monitor) -> None:
    """Write this process's snapshot every SNAPSHOT_PERIOD_S (off the event loop), until cancelled."""
    try:
        while True:
            await asyncio.to_thread(write_snapshot, run_directory, registry, monitor)
            await asyncio.sleep(SNAPSHOT_PERIOD_S)
    finally:
        snapshot_path(run_directory, os.getpid()).unlink(missing_ok=True)


def engine_metrics(socket_path: str) -> tuple[str, dict]:
    """The engine registry's exposition and its monitor's digests (zero-shot routes record there)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(10.0)
        connection.connect(socket_path)
        connection.sendall(encode_frame(("metrics", 0)))
        return read_frame_blocking(connection)[2]


def _is_running(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _other_snapshots(run_directory: str) -> list[dict]:
    snapshots = []
    for path in (Path(run_directory) / SNAPSHOT_DIRECTORY).glob("*.json"):
        pid = int(path.stem)
        if pid == os.getpid() or not _is_running(pid):
            continue
        try:
            snapshots.append(json.loads(path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            continue  # replaced or being written meanwhile: the next scrape has it
    return snapshots


def merge_expositions(texts: list[str], digests_documents: list[dict]) -> list[Metric]:
    """The families of ``texts`` merged by the rules in this module's docstring."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple, float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            merged = values[family.name]
            for sample in family.samples:
                if family.name == STAGE_LATENCY and "quantile" in sample.labels:
                    continue  # from the merged digests below
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in merged:
                    merged[key] = sample.value
                elif sample.name.endswith("_created"):
                    merged[key] = min(merged[key], sample.value)
                elif family.type in ("gauge", "unknown"):
                    merged[key] = max(merged[key], sample.value)
                else:
                    merged[key] = merged[key] + sample.value
    for name, family in families.items():
        for (sample_name, labels), value in values[name].items():
            family.samples.append(Sample(sample_name, dict(labels), value))
    if STAGE_LATENCY in families and digests_documents:
        merged_digests = merge_documents(digests_documents, DigestSource.WINDOW)
        for (route, stage), (digest, _) in sorted(merged_digests.items()):
            for q, value_s in zip(SUMMARY_QUANTILES, quantiles_of(digest, list(SUMMARY_QUANTILES))):
                families[STAGE_LATENCY].samples.append(
                    Sample(STAGE_LATENCY, {"route": route, "stage": stage, "quantile": str(q)},
                           value_s if not math.isnan(value_s) else math.nan))
    return list(families.values())


class MergedMetrics:
    """The collector of the answering API process's ``/metrics`` registry."""

    def __init__(self, own: CollectorRegistry, monitor: Monitor, run_directory: str,
                 engine: Callable[[], tuple[str, dict]]) -> None:
        self._own = own
        self._monitor = monitor
        self._run_directory = run_directory
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        others = _other_snapshots(self._run_directory)
        engine_text, engine_digests = self._engine()
        texts = [generate_latest(self._own).decode(), engine_text, *(other["text"] for other in others)]
        documents = [self._monitor.digests_view(), engine_digests, *(other["digests"] for other in others)]
        yield from merge_expositions(texts, documents)


def merged_registry(own: CollectorRegistry, monitor: Monitor, run_directory: str, engine_socket: str) -> CollectorRegistry:
    """What the API process's ``/metrics`` encodes: the merged view and the restart count."""
    view = CollectorRegistry(auto_describe=False)
    view.register(MergedMetrics(own, monitor, run_directory, lambda: engine_metrics(engine_socket)))
    register_restart_count(view, run_directory)
    return view
