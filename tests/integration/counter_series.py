"""A live server's counter series as Prometheus reads them, and the check that none went down.

Shared by the tests that restart an API process or an engine under ``/metrics``: Prometheus reads any
decrease of a counter as a reset, so every counter, histogram and summary count the server exposes must
stay at least where it was, whichever process died or missed the scrape.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

SeriesValues = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def counter_series(url: str) -> SeriesValues:
    """Every monotonic series of one ``/metrics`` scrape (on a new connection: either API process answers):
    the samples of counter, histogram and summary families but a summary's quantiles and ``_created``."""
    answer = httpx.get(f"{url}/metrics", headers={"Connection": "close"}, timeout=60)
    assert answer.status_code == 200, answer.text
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(answer.text)
            if family.type in ("counter", "histogram", "summary")
            for sample in family.samples
            if "quantile" not in sample.labels and not sample.name.endswith("_created")}


def went_down(before: SeriesValues, after: SeriesValues) -> dict:
    """The series of ``before`` that ``after`` shows lower or not at all: (before, after) by series."""
    return {key: (value, after.get(key)) for key, value in before.items()
            if after.get(key) is None or after[key] < value}


def text_requests(values: SeriesValues) -> float:
    return values.get(("mmserve_requests_total", (("code", "200"), ("route", "text"))), 0.0)
