"""A real Prometheus scrapes a live mmserve and answers for its P99.99 stage latency.

The ``prometheus`` binary is Debian's ``prometheus`` package (CI installs
it in ``.ci/run``; without it the test skips, or fails under
``MMSERVE_REQUIRE_PROMETHEUS=1``). The test writes a config that scrapes the server every
second, starts Prometheus on a free loopback port with its data in a temp
directory, and queries its HTTP API until the series arrive.
"""

from __future__ import annotations

import math
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

SCRAPE_WAIT_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def prometheus_scraping(binary: str, target: str, tmp_path: Path) -> Iterator[str]:
    """Prometheus (``binary``) scraping ``target`` (host:port) every second; yields its base URL, kills it after."""
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: mmserve\n    scrape_timeout: 1s\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    port = free_port()
    log_path = tmp_path / "prometheus.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        yield f"http://127.0.0.1:{port}"
    except BaseException:
        print(log_path.read_text(errors="replace")[-4000:])
        raise
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def query(client: httpx.Client, promql: str) -> list[dict]:
    try:
        response = client.get("/api/v1/query", params={"query": promql})
    except httpx.TransportError:
        return []  # Prometheus is still starting
    if response.status_code != 200:
        return []
    body = response.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for_series(client: httpx.Client, promql: str, labels: dict[str, str]) -> list[dict]:
    deadline = time.monotonic() + SCRAPE_WAIT_S
    while time.monotonic() < deadline:
        result = query(client, promql)
        if any(labels.items() <= entry["metric"].items() for entry in result):
            return result
        time.sleep(0.25)
    raise AssertionError(f"{promql} with {labels} did not appear in Prometheus within {SCRAPE_WAIT_S} s")


def served_value(exposition: str, name: str, labels: dict[str, str]) -> float:
    """The sample's value in a /metrics body; NaN while the series does not exist yet."""
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return math.nan


def test_prometheus_scrapes_the_stage_latency_summary_down_to_p9999(live_server_factory, prometheus_binary,
                                                                    tmp_path):
    binary = prometheus_binary("prometheus")
    with live_server_factory() as server, server.client() as client:
        num_requests = 12
        for i in range(num_requests):
            assert client.post("/v1/infer", json={"text": f"scrape me {i}"}).status_code == 200
        # Let the monitor fold the records before the first scrape that counts.
        deadline = time.monotonic() + 10
        total = {"route": "text", "stage": "total"}
        while not served_value(client.get("/metrics").text, "mmserve_stage_latency_seconds_count",
                               total) >= num_requests:  # NaN (no series yet) is not >=
            assert time.monotonic() < deadline, "the monitor did not fold the records"
            time.sleep(0.1)
        target = server.url.removeprefix("http://")
        with prometheus_scraping(binary, target, tmp_path) as prometheus_url, httpx.Client(
                base_url=prometheus_url, timeout=5.0) as prometheus:
            labels = {"route": "text", "stage": "total", "quantile": "0.9999"}
            result = wait_for_series(prometheus, 'mmserve_stage_latency_seconds{quantile="0.9999"}', labels)
            count = wait_for_series(prometheus, "mmserve_stage_latency_seconds_count", {"route": "text"})
            up = query(prometheus, 'up{job="mmserve"}')
            active = wait_for_series(prometheus, "mmserve_drift_active", {"route": "text"})
        exposition = client.get("/metrics").text
    p9999 = next(entry for entry in result if labels.items() <= entry["metric"].items())
    stored = float(p9999["value"][1])
    assert stored == served_value(exposition, "mmserve_stage_latency_seconds", labels)
    assert 0 < stored < 30
    stages = {entry["metric"]["stage"] for entry in result if entry["metric"]["route"] == "text"}
    assert stages == {"decode", "queue", "text", "respond", "total"}
    counts = {entry["metric"]["stage"]: float(entry["value"][1])
              for entry in count if entry["metric"]["route"] == "text"}
    assert counts == {stage: num_requests for stage in stages}
    assert [float(entry["value"][1]) for entry in up] == [1.0]
    assert [float(entry["value"][1]) for entry in active if entry["metric"]["route"] == "text"] == [0.0]
