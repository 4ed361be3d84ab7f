"""Latency accounting and Prometheus export for mmserve.

This package imports nothing else of mmserve's: whoever needs it receives the
objects through a constructor, so the serving code never reaches for globals.

    Monitor            record() on the hot path; digests, drift, JSON views
    MonitorConfig      windows, drift rule, digest sizes
    RequestInputs      what a request carried (fixed buckets), for attribution by input value
    MonitorCollector   scrape-time Prometheus export (Monitor.register)
    ServingMetrics     the plain counters, gauges and histograms
    monitoring.fleet   merge several replicas' digests into fleet quantiles
"""

from monitoring.clock import Clock, ManualClock, SystemClock
from monitoring.collector import SUMMARY_QUANTILES, MonitorCollector
from monitoring.config import MonitorConfig
from monitoring.drift import DriftState
from monitoring.errors import DigestFormatError, InvalidMonitorConfigError, MonitoringError, MonitorStateError
from monitoring.inputs import RequestInputs
from monitoring.monitor import Monitor
from monitoring.serving_metrics import ServingMetrics
from monitoring.status import BaselinePhase, RouteBaseline, RouteDriftStatus

__all__ = [
    "SUMMARY_QUANTILES",
    "BaselinePhase",
    "Clock",
    "DigestFormatError",
    "DriftState",
    "InvalidMonitorConfigError",
    "ManualClock",
    "Monitor",
    "MonitorCollector",
    "MonitorConfig",
    "MonitorStateError",
    "MonitoringError",
    "RequestInputs",
    "RouteBaseline",
    "RouteDriftStatus",
    "ServingMetrics",
    "SystemClock",
]
