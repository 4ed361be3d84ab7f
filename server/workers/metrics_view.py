"""One ``/metrics`` for the whole server, whichever API process answers the scrape.

Every process keeps its own registry: an API process counts its requests
(the request layer runs there), the engine counts batches, queues and the
cache, and holds the one latency monitor, which every API process sends its
requests' records to (``server.workers.engine_monitor``). The answering API
process merges:

    its own registry            now
    the other API processes'    their snapshots (exposition text + exemplars), each written
                                to the run directory by the process itself when this scrape asks
                                (``server.workers.metrics_snapshots``)
    the engine's registry       now, over a short connection (``("metrics", id)``), with its monitor's
                                digests

into the same families, series and labels as one process exports:

    counters, histograms, summary _count/_sum   summed over the processes
    stage quantiles (the summary's quantiles)   from the engine monitor's T-Digests (through
                                                ``monitoring.fleet``, as ``mmserve quantiles`` merges a fleet)
    gauges                                       the largest (a queue depth or cache size is set by one
                                                process)
    *_created                                    the earliest
    mmserve_api_worker_restarts_total            the supervisor's count (``server.workers.restarts``)
    mmserve_api_workers_live                     the API processes serving now (``server.workers.readiness``)
    exemplars (request-duration buckets)         each bucket's most recent one, whichever process holds it

and in the order OpenMetrics asks (each series' samples together, ``_created``
inside its family), so the merged view encodes in either format.

Exemplars (the trace ids of kept requests, ``server.http.traced_answer``) are
read from each process's request-duration histogram (``exemplars_of``) beside
its exposition and put back on the merged buckets, so the OpenMetrics scrape
shows them as one process does; the classic text format drops them, as always.

A snapshot of a process that is no longer running is left out; one that does
not answer within ``metrics_snapshots.WAIT_S`` is read as it last wrote.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar, Sample

from monitoring.collector import STAGE_LATENCY, SUMMARY_QUANTILES
from monitoring.digest import quantiles_of
from monitoring.fleet import DigestSource, merge_documents
from server.workers.frames import encode_frame, read_frame_blocking
from server.workers.metrics_snapshots import ExemplarRow, exemplars_of, fresh_snapshots
from server.workers.readiness import register_live_workers
from server.workers.restarts import register_restart_count


def engine_metrics(socket_path: str) -> tuple[str, dict, list[ExemplarRow]]:
    """The engine registry's exposition, its monitor's digests and its exemplars (zero-shot routes record there)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(10.0)
        connection.connect(socket_path)
        connection.sendall(encode_frame(("metrics", 0)))
        return read_frame_blocking(connection)[2]


def _latest_exemplars(rows: Sequence[ExemplarRow]) -> dict[tuple, Exemplar]:
    """Per sample (name, sorted labels), the most recent exemplar of every process's."""
    latest: dict[tuple, Exemplar] = {}
    for name, labels, exemplar_labels, value, timestamp in rows:
        key = (name, tuple(sorted(labels.items())))
        known = latest.get(key)
        if known is None or (timestamp or 0.0) > (known.timestamp or 0.0):
            latest[key] = Exemplar(exemplar_labels, value, timestamp)
    return latest


def merge_expositions(texts: list[str], digests_documents: list[dict],
                      exemplar_rows: Sequence[ExemplarRow] = ()) -> list[Metric]:
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
    exemplars = _latest_exemplars(exemplar_rows)
    for name, family in families.items():
        for key, value in values[name].items():
            sample_name, labels = key
            family.samples.append(Sample(sample_name, dict(labels), value, exemplar=exemplars.get(key)))
    if STAGE_LATENCY in families and digests_documents:
        merged_digests = merge_documents(digests_documents, DigestSource.WINDOW)
        for (route, stage), (digest, _) in sorted(merged_digests.items()):
            for q, value_s in zip(SUMMARY_QUANTILES, quantiles_of(digest, list(SUMMARY_QUANTILES))):
                families[STAGE_LATENCY].samples.append(
                    Sample(STAGE_LATENCY, {"route": route, "stage": stage, "quantile": str(q)},
                           value_s if not math.isnan(value_s) else math.nan))
    _fold_created(families)
    for family in families.values():
        family.samples = _grouped(family.samples)
    return list(families.values())


_PARENT_TYPES = ("counter", "histogram", "summary")  # the families whose series have a ``_created`` sample
_WITHIN_GROUP_LABELS = ("le", "quantile")


def _fold_created(families: dict[str, Metric]) -> None:
    """Each ``X_created`` family of the classic text back into ``X``, as a registry yields it.

    The classic format writes ``_created`` samples as gauges of their own; in
    OpenMetrics they belong to their counter, histogram or summary (a family of
    their own there clashes with it). Both encoders then write them right.
    """
    for name in [name for name in families if name.endswith("_created")]:
        parent = families.get(name.removesuffix("_created"))
        if parent is not None and parent.type in _PARENT_TYPES:
            parent.samples.extend(families.pop(name).samples)


def _grouped(samples: list[Sample]) -> list[Sample]:
    """Each series' samples (its labels but ``le``/``quantile``) together, as OpenMetrics requires; stable."""
    first_seen: dict[tuple, int] = {}

    def group(sample: Sample) -> int:
        labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in _WITHIN_GROUP_LABELS))
        return first_seen.setdefault(labels, len(first_seen))

    return sorted(samples, key=group)


class MergedMetrics:
    """The collector of the answering API process's ``/metrics`` registry."""

    def __init__(self, own: CollectorRegistry, run_directory: str,
                 engine: Callable[[], tuple[str, dict, list[ExemplarRow]]], exemplars_from: Collector) -> None:
        self._own = own
        self._exemplars_from = exemplars_from
        self._run_directory = run_directory
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        others = list(fresh_snapshots(self._run_directory).values())
        engine_text, engine_digests, engine_exemplars = self._engine()
        texts = [generate_latest(self._own).decode(), engine_text, *(other["text"] for other in others)]
        documents = [engine_digests]  # the one monitor (server.workers.engine_monitor)
        exemplar_rows = [*exemplars_of(self._exemplars_from), *engine_exemplars,
                         *(row for other in others for row in other.get("exemplars", ()))]
        yield from merge_expositions(texts, documents, exemplar_rows)


def merged_registry(own: CollectorRegistry, run_directory: str, engine_socket: str,
                    exemplars_from: Collector) -> CollectorRegistry:
    """What the API process's ``/metrics`` encodes: the merged view, the restart count and the live API processes.

    ``exemplars_from``: this process's request-duration histogram (the others' come with their snapshots).
    """
    view = CollectorRegistry(auto_describe=False)
    view.register(MergedMetrics(own, run_directory, lambda: engine_metrics(engine_socket), exemplars_from))
    register_restart_count(view, run_directory)
    register_live_workers(view, run_directory)
    return view
