"""Typed errors of the monitoring package.

Monitoring must never take a request down: the hot path (``Monitor.record``)
raises nothing. These errors mark misuse at construction time (a bad
configuration) or a malformed document handed in from outside (a digest
exported by another replica).
"""

from __future__ import annotations


class MonitoringError(Exception):
    """Base class of everything the monitoring package raises."""


class InvalidMonitorConfigError(MonitoringError, ValueError):
    """A ``MonitorConfig`` field is out of range or inconsistent with another."""


class DigestFormatError(MonitoringError, ValueError):
    """A serialised digest or digests document does not have the expected shape."""


class MonitorStateError(MonitoringError, RuntimeError):
    """An operation was called in a lifecycle state that does not allow it."""
