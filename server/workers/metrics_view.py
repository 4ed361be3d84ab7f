"""One ``/metrics`` for the whole server, whichever API process answers the scrape.

Every process keeps its own registry: an API process counts its requests
(the request layer runs there), each engine counts its batches, queues and
cache, and engine 0 holds the one latency monitor, which every API process
sends its requests' records to (``server.workers.engine_monitor``). The
answering API process merges:

    its own registry            now
    the other API processes'    their snapshots (exposition text + exemplars), each written
                                to the run directory by the process itself when this scrape asks
                                (``server.workers.metrics_snapshots``)
    each engine's registry      now, over a short connection to ``engine-<i>.sock`` (``("metrics", id)``),
                                all engines asked at once; engine 0's answer brings the monitor's digests

into the same families, series and labels as one process exports:

    counters, histograms, summary _count/_sum   summed over the processes, API processes and engines
                                                alike (a request count over two engines is the
                                                requests both served), plus the carried counts of
                                                processes that are gone or did not answer this scrape
                                                (``server.workers.counter_carry``): they never go down,
                                                not even by a rounding step of a sum in another order
    ENGINE_LABELLED_FAMILIES                    each engine's samples a series of their own, labelled
                                                ``engine="<i>"`` (one engine: ``engine="0"``), never
                                                summed or maxed across engines
    stage quantiles (the summary's quantiles)   from engine 0's monitor's T-Digests (through
                                                ``monitoring.fleet``, as ``mmserve quantiles`` merges a fleet)
    other gauges                                 the largest (a model-info or drift gauge is set by one
                                                process)
    *_created                                    the earliest
    mmserve_api_worker_restarts_total            the supervisor's counts (``server.workers.restarts``)
    mmserve_engine_restarts_total
    mmserve_api_workers_live                     the API processes running, not draining (``server.workers.readiness``)
    exemplars (request-duration buckets)         each bucket's most recent one, whichever process holds it

and in the order OpenMetrics asks (each series' samples together, ``_created``
inside its family), so the merged view encodes in either format.

Exemplars (the trace ids of kept requests, ``server.http.traced_answer``) are
read from each process's request-duration histogram (``exemplars_of``) beside
its exposition and put back on the merged buckets, so the OpenMetrics scrape
shows them as one process does; the classic text format drops them, as always.

A process that no longer runs is left out but for its counters: its last
snapshot is folded into the carried counts. An API process that does not answer
within ``metrics_snapshots.WAIT_S`` is read as it last wrote. An engine whose
socket is missing, refuses or breaks the connection, or does not answer within
``ENGINE_ANSWER_TIMEOUT_S`` (it is starting again) is left out of that scrape
but for its counters, which it adds as last seen: its gauges are absent until
it is back, the scrape still answers; without engine 0 the stage quantiles are
absent too. An engine is known by the pid it answers with: a new pid under its
index (a restart) folds the old one's last-seen counters into the carried ones.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar, Sample

from monitoring.collector import STAGE_LATENCY, SUMMARY_QUANTILES
from monitoring.digest import quantiles_of
from monitoring.fleet import DigestSource, merge_documents
from server.workers.counter_carry import (CarriedCounts, Series, carried_counts, is_monotonic_sample,
                                          monotonic_series)
from server.workers.frames import encode_frame, read_frame_blocking
from server.workers.metrics_snapshots import (SNAPSHOT_DIRECTORY, ExemplarRow, ask_for_snapshots,
                                              snapshots_folding_departed, write_snapshot)
from server.workers.readiness import LIVE_GAUGE, register_live_workers
from server.workers.restarts import (API_WORKER_RESTARTS, ENGINE_RESTARTS, register_engine_restart_count,
                                     register_restart_count)

ENGINE_LABEL = "engine"
ENGINE_LABELLED_FAMILIES: frozenset[str] = frozenset({
    "mmserve_queue_depth",
    "mmserve_batch_size",
    "mmserve_cache_bytes",
    "mmserve_cache_entries",
    "mmserve_device_memory_bytes",
    "mmserve_device_utilization_ratio",
    "mmserve_device_batch_seconds",
    "mmserve_device_batches",
})
"""The engine families whose samples keep one series per engine (label ``engine``), named as the parser names them.

Each is a fact of one engine that a sum or a max over engines would hide:

- ``mmserve_queue_depth{lane}``: each engine has its own lanes and queue bound; a queue building on one
  engine (a hot key's affinity engine, a stalled device) is what an operator looks for, and the total
  (``sum without (engine)``) is still one query away.
- ``mmserve_batch_size{lane}`` (histogram): how full each engine's batches run; a lone engine running
  batches of one while another runs full ones shows dispatch or a slow device.
- ``mmserve_cache_bytes{modality}``, ``mmserve_cache_entries{modality}``: each engine holds its own part of the
  segment cache (it is not copied between engines); whether each part fills to its budget is per engine.
- ``mmserve_device_memory_bytes{kind}``, ``mmserve_device_utilization_ratio``: one device per engine.
- ``mmserve_device_batch_seconds_total{stage}``, ``mmserve_device_batches_total{stage}``: their ratio is the
  device time per batch, per device; summed, a slow device would be averaged away.

Everything else is the server's, not an engine's: requests, rejections, cache events (the hit ratio of the
one cache the engines make together) and cold compiles are summed; the monitor's families are engine 0's.
"""

ENGINE_ANSWER_TIMEOUT_S = 10.0
SUPERVISOR_FAMILIES = frozenset({API_WORKER_RESTARTS, ENGINE_RESTARTS, LIVE_GAUGE})
"""Families the view reads from the run directory; a process's own copy (a single-process registry's 0) is left out."""

EngineAnswer = tuple[str, dict, list[ExemplarRow], int]  # exposition, digests, exemplars, the engine's pid


def engine_metrics(socket_path: str) -> EngineAnswer | None:
    """The engine registry's exposition, its monitor's digests, its exemplars (zero-shot routes record there)
    and its pid.

    None when the engine cannot answer now: no socket file, a refused or broken connection, or no answer
    within ``ENGINE_ANSWER_TIMEOUT_S`` (all ``OSError``s: the engine is starting again, or stuck).
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(ENGINE_ANSWER_TIMEOUT_S)
            connection.connect(socket_path)
            connection.sendall(encode_frame(("metrics", 0)))
            answer = read_frame_blocking(connection)
    except OSError:
        return None
    return answer[2] if answer[0] == "ok" else None


def engines_metrics(socket_paths: Sequence[str]) -> list[EngineAnswer | None]:
    """Each engine's answer, in engine order; asked at once, so one slow engine delays the scrape once."""
    if len(socket_paths) <= 1:
        return [engine_metrics(path) for path in socket_paths]
    with ThreadPoolExecutor(max_workers=len(socket_paths), thread_name_prefix="engine-metrics") as pool:
        return list(pool.map(engine_metrics, socket_paths))


def _latest_exemplars(rows: Sequence[ExemplarRow]) -> dict[tuple, Exemplar]:
    """Per sample (name, sorted labels), the most recent exemplar of every process's."""
    latest: dict[tuple, Exemplar] = {}
    for name, labels, exemplar_labels, value, timestamp in rows:
        key = (name, tuple(sorted(labels.items())))
        known = latest.get(key)
        if known is None or (timestamp or 0.0) > (known.timestamp or 0.0):
            latest[key] = Exemplar(exemplar_labels, value, timestamp)
    return latest


def _is_engine_labelled(family_name: str) -> bool:
    """A family of ``ENGINE_LABELLED_FAMILIES``, or the ``_created`` gauge the classic text writes beside one."""
    return family_name in ENGINE_LABELLED_FAMILIES or family_name.removesuffix("_created") in ENGINE_LABELLED_FAMILIES


def engine_series(text: str, engine: int) -> Series:
    """An engine's monotonic series, labelled as the merged view labels them."""
    return monotonic_series(text, {ENGINE_LABEL: str(engine)}, ENGINE_LABELLED_FAMILIES)


def merge_expositions(texts: list[str], digests_documents: list[dict],
                      exemplar_rows: Sequence[ExemplarRow] = (),
                      engine_texts: Mapping[int, str] | None = None,
                      carried: Series | None = None) -> list[Metric]:
    """The families of ``texts`` (API processes) and ``engine_texts`` (engine index -> its exposition) merged
    by the rules in this module's docstring, ``carried`` added to the sums; ``digests_documents`` give the
    stage quantiles."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple, float]] = {}
    for key, (family_name, kind, documentation, value) in (carried or {}).items():
        if family_name not in families:
            families[family_name] = Metric(family_name, documentation, kind)
            values[family_name] = {}
        values[family_name][key] = value
    engine_texts = engine_texts or {}
    sources = [(text, None) for text in texts] + [(engine_texts[index], index) for index in sorted(engine_texts)]
    for text, engine in sources:
        for family in text_string_to_metric_families(text):
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            merged = values[family.name]
            labelled = engine is not None and _is_engine_labelled(family.name)
            for sample in family.samples:
                if family.name == STAGE_LATENCY and "quantile" in sample.labels:
                    continue  # from the merged digests below
                labels = {**sample.labels, ENGINE_LABEL: str(engine)} if labelled else sample.labels
                key = (sample.name, tuple(sorted(labels.items())))
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


def _never_below_published(families: Sequence[Metric], state: CarriedCounts) -> None:
    """Each monotonic sample of ``families`` raised to the largest value a scrape has shown it with
    (``CarriedCounts.published``: a sum in another order may round one step lower)."""
    for family in families:
        family.samples = [
            sample._replace(value=state.not_below_published((sample.name, tuple(sorted(sample.labels.items()))),
                                                            sample.value))
            if is_monotonic_sample(family.type, sample.name, sample.labels) else sample
            for sample in family.samples]


class MergedMetrics:
    """The collector of the answering API process's ``/metrics`` registry."""

    def __init__(self, own: CollectorRegistry, run_directory: str,
                 engines: Callable[[], Sequence[EngineAnswer | None]], exemplars_from: Collector) -> None:
        self._own = own
        self._exemplars_from = exemplars_from
        self._run_directory = run_directory
        self._engines = engines  # engine i's answer at [i], None where it did not answer

    def collect(self) -> Iterator[Metric]:
        ask_for_snapshots(self._run_directory)
        answers = self._engines()
        own = write_snapshot(self._run_directory, self._own, self._exemplars_from)  # what a fold would carry
        with carried_counts(Path(self._run_directory) / SNAPSHOT_DIRECTORY) as state:
            others = list(snapshots_folding_departed(self._run_directory, state).values())
            for index, answer in enumerate(answers):
                if answer is not None:
                    state.saw_engine(index, answer[3], engine_series(answer[0], index))
            carried = state.carried(index for index, answer in enumerate(answers) if answer is None)
            texts = [own["text"], *(other["text"] for other in others)]
            engine_texts = {index: answer[0] for index, answer in enumerate(answers) if answer is not None}
            # The one monitor is engine 0's (server.workers.engine_monitor); the others' digests hold nothing.
            documents = [answers[0][1]] if answers and answers[0] is not None else []
            exemplar_rows = [*own["exemplars"],
                             *(row for answer in answers if answer is not None for row in answer[2]),
                             *(row for other in others for row in other.get("exemplars", ()))]
            merged = merge_expositions(texts, documents, exemplar_rows, engine_texts, carried)
            _never_below_published(merged, state)  # under the lock: two scrapes at once are shown in turn
        for family in merged:
            if family.name not in SUPERVISOR_FAMILIES:  # registered beside this collector, from the run directory
                yield family


def merged_registry(own: CollectorRegistry, run_directory: str, engine_sockets: Sequence[str] | str,
                    exemplars_from: Collector) -> CollectorRegistry:
    """What the API process's ``/metrics`` encodes: the merged view, the restart counts and the live API processes.

    ``engine_sockets``: engine i's socket at [i] (one path alone is read as ``[path]``).
    ``exemplars_from``: this process's request-duration histogram (the others' come with their snapshots).
    """
    sockets = [engine_sockets] if isinstance(engine_sockets, str) else list(engine_sockets)
    view = CollectorRegistry(auto_describe=False)
    view.register(MergedMetrics(own, run_directory, lambda: engines_metrics(sockets), exemplars_from))
    register_restart_count(view, run_directory)
    register_engine_restart_count(view, run_directory)
    register_live_workers(view, run_directory)
    return view
