"""The ops files under docker/: Prometheus config and alert rules (via promtool) and the Grafana dashboard.

Metric names used by alerts and dashboard queries are checked against what a
registry holding ``ServingMetrics`` and a registered ``Monitor`` really
exports, so renaming a series breaks this test rather than a dashboard.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from models.device_telemetry import DeviceReading, StageDeviceTime
from monitoring import ManualClock, Monitor, ServingMetrics
from server.runtime.device_metrics import DeviceMetricsCollector
from server.workers.metrics_view import ENGINE_LABELLED_FAMILIES
from server.workers.restarts import register_single_process_worker_series

REPO_ROOT = Path(__file__).resolve().parents[3]
PROMETHEUS_DIR = REPO_ROOT / "docker" / "prometheus"
GRAFANA_DIR = REPO_ROOT / "docker" / "grafana"
METRIC_NAME = re.compile(r"\bmmserve_[a-zA-Z0-9_]+")


class _EveryDeviceSeries:
    """Readings with every optional field set, so the collector yields every family it has."""

    def read(self) -> DeviceReading:
        return DeviceReading(1, 2, 50.0, 3, 4)

    def stage_times(self) -> dict[str, StageDeviceTime]:
        return {"vision": StageDeviceTime(1, 0.01)}


def exported_sample_names() -> set[str]:
    """Every sample name the app's registry can expose, derived from the registered families."""
    registry = CollectorRegistry()
    ServingMetrics(registry)
    Monitor(clock=ManualClock()).register(registry)
    registry.register(DeviceMetricsCollector(_EveryDeviceSeries()))  # registered on CUDA servers only
    register_single_process_worker_series(registry)  # the restart counts and live API processes, whatever N
    suffixes = {
        "counter": ("_total", "_created"),
        "gauge": ("",),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("", "_sum", "_count", "_created"),
    }
    names: set[str] = set()
    for family in registry.collect():
        names.update(family.name + suffix for suffix in suffixes[family.type])
        names.update(sample.name for sample in family.samples)
    return names


def run_promtool(promtool: str, *args: str) -> str:
    result = subprocess.run(
        [promtool, *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True, timeout=60, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


def test_promtool_accepts_the_config(prometheus_binary) -> None:
    output = run_promtool(prometheus_binary("promtool"), "check", "config", "prometheus.yml")
    assert "SUCCESS" in output and "1 rule files found" in output


def test_promtool_accepts_the_rules(prometheus_binary) -> None:
    assert "SUCCESS: 7 rules found" in run_promtool(prometheus_binary("promtool"), "check", "rules", "alerts.yml")


def test_promtool_rule_unit_tests_pass(prometheus_binary) -> None:
    assert "SUCCESS" in run_promtool(prometheus_binary("promtool"), "test", "rules", "alerts_test.yml")


def test_scrape_config_targets_mmserve() -> None:
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "mmserve"
    assert job["static_configs"] == [{"targets": ["mmserve:8000"]}]
    assert config["rule_files"] == ["alerts.yml"]


def test_alert_rules_use_only_exported_metrics() -> None:
    rules = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    used = {name for expr in exprs for name in METRIC_NAME.findall(expr)}
    assert {"mmserve_drift_active", "mmserve_requests_total", "mmserve_queue_depth", "mmserve_rejected_total",
            "mmserve_engine_restarts_total"} <= used
    assert used - exported_sample_names() == set()


def dashboard_queries(dashboard: dict) -> list[str]:
    queries = []
    for panel in dashboard["panels"]:
        queries.extend(target["expr"] for target in panel.get("targets", []))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(variable["query"]["query"])
    return queries


def test_dashboard_parses_and_queries_only_exported_metrics() -> None:
    dashboard = json.loads((GRAFANA_DIR / "dashboards" / "mmserve.json").read_text())
    queries = dashboard_queries(dashboard)
    used = {name for query in queries for name in METRIC_NAME.findall(query)}
    panels_without_metric = [
        p["title"] for p in dashboard["panels"]
        if p["type"] != "row" and not any(METRIC_NAME.search(t["expr"]) for t in p["targets"])
    ]
    assert panels_without_metric == []
    for needed in ("mmserve_stage_latency_seconds", "mmserve_drift_ks_statistic", "mmserve_drift_active",
                   "mmserve_batch_size_bucket", "mmserve_queue_depth", "mmserve_cache_events_total",
                   "mmserve_drift_tail_share_growth"):
        assert needed in used
    assert used - exported_sample_names() == set()


# An aggregation that drops the engine label: `without (..., engine, ...)`, or `by (...)` not listing it.
DROPS_ENGINE = re.compile(r"\bwithout\s*\([^)]*\bengine\b|\bby\s*\((?![^)]*\bengine\b)")


def reads_an_engine_labelled_series(query: str) -> bool:
    return any(name.startswith(family) for name in METRIC_NAME.findall(query) for family in ENGINE_LABELLED_FAMILIES)


def test_alerts_on_per_engine_series_judge_the_server_not_each_engine() -> None:
    """/metrics keeps one series per engine for these families (server.workers.metrics_view): an alert on one
    aggregates the engine label away, or a server of N engines raises N alerts for one lane."""
    rules = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    per_engine = [expr for expr in exprs if reads_an_engine_labelled_series(expr)]
    assert per_engine, "the queue alert reads mmserve_queue_depth"
    assert [expr for expr in per_engine if not DROPS_ENGINE.search(expr)] == []


def test_dashboard_panels_on_per_engine_series_aggregate_or_name_the_engine() -> None:
    """A panel over a per-engine family either sums/maxes the engines away or says which engine each line is."""
    dashboard = json.loads((GRAFANA_DIR / "dashboards" / "mmserve.json").read_text())
    targets = [(panel["title"], target) for panel in dashboard["panels"] for target in panel.get("targets", [])
               if reads_an_engine_labelled_series(target["expr"])]
    unnamed = [title for title, target in targets
               if "{{engine}}" not in target.get("legendFormat", "") and not DROPS_ENGINE.search(target["expr"])]
    assert unnamed == []
    per_engine_queue = [title for title, target in targets
                        if "mmserve_queue_depth" in target["expr"] and "{{engine}}" in target.get("legendFormat", "")]
    assert per_engine_queue == ["Queue depth per engine"]


def test_grafana_provisioning_points_at_the_dashboard_datasource() -> None:
    datasources = yaml.safe_load((GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (datasource,) = datasources["datasources"]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    dashboard = json.loads((GRAFANA_DIR / "dashboards" / "mmserve.json").read_text())
    uids = {p["datasource"]["uid"] for p in dashboard["panels"] if "datasource" in p}
    assert uids == {datasource["uid"]}
    providers = yaml.safe_load((GRAFANA_DIR / "provisioning" / "dashboards" / "mmserve.yml").read_text())
    assert providers["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
