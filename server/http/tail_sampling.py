"""Which traces are kept: decided when the request is answered, so errors and slow requests always are.

A request's spans are emitted once it is answered (``server.http.tracing``),
so the decision can use what only the end knows. In order:

    the client's traceparent says sampled      keep   (the caller records this trace: honour it)
    5xx answer (the server's failure)          keep
    slower than trace_slow_ms (if > 0)         keep
    the client's traceparent says not sampled  drop   (its caller chose; only the rules above override)
    otherwise                                  keep if the trace id falls under the ratio

The ratio test is OpenTelemetry's ``TraceIdRatioBased``: the low 64 bits of
the trace id below ``ratio * 2**64``. It is deterministic on the trace id, so
every service using the same ratio keeps the same traces. 4xx answers are the
client's fault and follow the ratio like successes (a bad client must not be
able to fill the trace backend); they still carry their status and error code.

Pure arithmetic, no OpenTelemetry import: unit-tested on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

_TRACE_ID_LIMIT = (1 << 64) - 1


@dataclass(frozen=True)
class TailSampler:
    """The keep-or-drop rule above; ``slow_ns`` 0 turns the slow rule off."""

    ratio: float
    slow_ns: int

    def __post_init__(self) -> None:
        if not 0.0 <= self.ratio <= 1.0:
            raise ValueError(f"the sampling ratio must lie in [0, 1], got {self.ratio}")
        if self.slow_ns < 0:
            raise ValueError(f"the slow threshold must be >= 0, got {self.slow_ns}")
        object.__setattr__(self, "_bound", round(self.ratio * (_TRACE_ID_LIMIT + 1)))

    def is_ratio_sampled(self, trace_id: int) -> bool:
        """``TraceIdRatioBased``'s test on ``trace_id``."""
        return trace_id & _TRACE_ID_LIMIT < self._bound  # type: ignore[attr-defined]

    def should_keep(self, trace_id: int, *, parent_sampled: bool | None, status_code: int,
                    duration_ns: int) -> bool:
        """``parent_sampled``: the traceparent's sampled flag; ``None`` when the request came without one."""
        if parent_sampled:
            return True
        if status_code >= 500 or (self.slow_ns > 0 and duration_ns >= self.slow_ns):
            return True
        if parent_sampled is False:
            return False
        return self.is_ratio_sampled(trace_id)
