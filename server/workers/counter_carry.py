"""Counters that never go down when a process of the server is restarted or misses a scrape.

``/metrics`` sums every process's counters (``server.workers.metrics_view``). A
process that dies takes its counts with it, and a restarted one starts from
zero, so a plain sum of the live processes goes *down* at every restart;
Prometheus reads any decrease as a counter reset, and ``rate()``/``increase()``
then show a false spike (the error-ratio alert and the request panels read
these). So whoever sums keeps, in the run directory (every API process may
answer a scrape, and each must carry the same counts):

    departed       one accumulated set of monotonic series: every departed process's last-seen values,
                   added together (bounded: a process is folded into it once, and it is never a list)
    engines        per engine index, the pid it last answered with and its last-seen monotonic series
    published      per monotonic series, the largest value a scrape has shown

and a scrape adds ``departed`` to the live sum, plus, for an engine that did not
answer this scrape, its last-seen series (so a slow engine does not dip and
come back). What the scrape then shows is never below ``published``: floats
summed in another order (another API process answers, or a process is folded
into ``departed``) can land one rounding step lower, 10.780651473 after
10.780651473000002, and Prometheus reads even that as a reset. A process is known by its pid, never by its slot: a restarted
engine answers under the same index with a new pid, and only then is the old
pid's last-seen set folded into ``departed``; an API process's snapshot file
(``metrics/PID.json``, ``server.workers.metrics_snapshots``) is folded once
its pid no longer runs, and removed. A live process is never in ``departed``.

Monotonic series are the samples of counter, histogram and summary families
(``_total``, ``_bucket``, ``_count``, ``_sum``), not a summary's quantiles nor
a ``_created`` timestamp; gauges are not carried (a dead process's gauges go
away). The state is read and written under an exclusive ``flock`` on
``metrics/carried.lock`` by the one scrape at a time that sums, and replaced
whole (a scrape killed midway leaves the previous state).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

MONOTONIC_TYPES = ("counter", "histogram", "summary")
STATE_FILE = "carried.json"
LOCK_FILE = "carried.lock"

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted labels)
SeriesInfo = tuple[str, str, str, float]  # (family name, family type, documentation, value)
Series = dict[SeriesKey, SeriesInfo]


def monotonic_series(text: str, extra_labels: Mapping[str, str] | None = None,
                     extra_labelled: frozenset[str] = frozenset()) -> Series:
    """The monotonic samples of an exposition ``text``; families in ``extra_labelled`` get ``extra_labels``
    (an engine's ``engine="<i>"``, as the merged view labels them)."""
    series: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not is_monotonic_sample(family.type, sample.name, sample.labels):
                continue
            labels = dict(sample.labels)
            if extra_labels and family.name in extra_labelled:
                labels.update(extra_labels)
            key = (sample.name, tuple(sorted(labels.items())))
            series[key] = (family.name, family.type, family.documentation, sample.value)
    return series


def add_into(total: Series, addend: Series) -> None:
    """``addend``'s values added to ``total``'s, series by series (a series new to ``total`` is copied)."""
    for key, (family, kind, documentation, value) in addend.items():
        known = total.get(key)
        total[key] = (family, kind, documentation, value + (known[3] if known is not None else 0.0))


def _rows(series: Series) -> list[list]:
    return [[name, [list(pair) for pair in labels], *info] for (name, labels), info in series.items()]


def _series(rows: Iterable[list]) -> Series:
    return {(name, tuple((key, value) for key, value in labels)): (family, kind, documentation, float(value))
            for name, labels, family, kind, documentation, value in rows}


@dataclass
class CarriedCounts:
    """The run directory's carried state (this module's docstring): departed processes, engines' last-seen."""

    departed: Series = field(default_factory=dict)
    engines: dict[int, tuple[int, Series]] = field(default_factory=dict)  # index -> (pid, last-seen series)
    published: dict[SeriesKey, float] = field(default_factory=dict)  # the largest value each series was shown with

    def saw_engine(self, index: int, pid: int, series: Series) -> None:
        """Engine ``index`` answered as ``pid`` with ``series``; a new pid under that index folds the old one.

        The same pid keeps, series by series, the larger of what it was seen with and ``series``: two
        scrapes at once (two Prometheus replicas) may ask the engine in one order and get here in the
        other, and the last-seen set must not fall behind what either scrape showed."""
        known = self.engines.get(index)
        if known is not None and known[0] != pid:
            add_into(self.departed, known[1])
        elif known is not None:
            series = dict(series)
            for key, info in known[1].items():
                if key not in series or series[key][3] < info[3]:
                    series[key] = info
        self.engines[index] = (pid, series)

    def carried(self, missing_engines: Iterable[int]) -> Series:
        """What this scrape adds to the live sum: ``departed`` and each missing engine's last-seen series."""
        total: Series = dict(self.departed)
        for index in missing_engines:
            if index in self.engines:
                add_into(total, self.engines[index][1])
        return total

    def not_below_published(self, key: SeriesKey, value: float) -> float:
        """``value`` for monotonic series ``key``, raised to the largest value a scrape has shown it with
        (and remembered as that from now on)."""
        shown = max(value, self.published.get(key, value))
        self.published[key] = shown
        return shown

    def to_json(self) -> dict:
        return {"departed": _rows(self.departed),
                "engines": {str(index): {"pid": pid, "series": _rows(series)}
                            for index, (pid, series) in self.engines.items()},
                "published": [[name, [list(pair) for pair in labels], value]
                              for (name, labels), value in self.published.items()]}

    @classmethod
    def from_json(cls, document: dict) -> CarriedCounts:
        return cls(_series(document.get("departed", ())),
                   {int(index): (int(record["pid"]), _series(record["series"]))
                    for index, record in document.get("engines", {}).items()},
                   {(name, tuple((key, value) for key, value in labels)): float(shown)
                    for name, labels, shown in document.get("published", ())})


def is_monotonic_sample(family_type: str, sample_name: str, labels: Mapping[str, str]) -> bool:
    """A sample ``monotonic_series`` carries: of a counter, histogram or summary, not a quantile nor ``_created``."""
    return family_type in MONOTONIC_TYPES and "quantile" not in labels and not sample_name.endswith("_created")


@contextmanager
def carried_counts(directory: Path) -> Iterator[CarriedCounts]:
    """The state in ``directory`` (``metrics/`` of the run directory), held under the lock and written back."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / LOCK_FILE, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = directory / STATE_FILE
        try:
            state = CarriedCounts.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            state = CarriedCounts()
        yield state
        staging = path.with_suffix(f".{os.getpid()}.writing")
        staging.write_text(json.dumps(state.to_json()))
        os.replace(staging, path)
