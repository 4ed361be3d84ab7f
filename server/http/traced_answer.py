"""What a route tells the tracer when it has answered, and what the answer gets back (no OpenTelemetry import).

The request layer (``server.request_layer``) builds a ``TracedAnswer`` only
while tracing is on and hands it to ``answer_traced``, which finishes the trace (``server.http.tracing``), puts
the server span's ``traceparent`` on the response (its sampled flag says
whether the trace was kept, so a client can look it up) and returns the
exemplar for the request-duration histogram (``None`` for a dropped trace).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.responses import Response

from router.intake import IntakeOutcome
from router.item_facts import ItemFacts
from server.ingest.inputs import ParsedInput

if TYPE_CHECKING:
    from server.http.tracing import RequestTrace, RequestTracer


@dataclass(frozen=True)
class TracedItem:
    """One item of a request: what it sent, its facts (``router.item_facts``) and its intake outcome if it got one.

    ``facts``: the outcome's, or, for an item whose request failed, those of what it sent.
    """

    parsed: ParsedInput
    facts: ItemFacts | None = None
    outcome: IntakeOutcome | None = None


@dataclass(frozen=True)
class TracedAnswer:
    """What ``RequestTracer.finish`` needs: the answer and what the request did, all measured already.

    ``items`` empty: the request failed before an item was parsed.
    ``respond`` is ``(started_ns, duration_ns)`` of building the answer.
    """

    http_route: str
    metrics_route: str
    status_code: int
    ended_ns: int
    items: Sequence[TracedItem] = ()
    error_code: str | None = None
    error_row: int | None = None
    respond: tuple[int, int] | None = None
    as_rows: bool = False  # a many-item protocol: a "row" span per item


def answer_traced(tracer: RequestTracer, trace: RequestTrace, answer: TracedAnswer,
                  response: Response) -> dict[str, str] | None:
    """Finish the trace, echo ``traceparent``; the histogram exemplar if the trace was kept."""
    is_kept = tracer.finish(trace, answer)
    response.headers["traceparent"] = trace.traceparent(is_kept)
    return {"trace_id": trace.trace_id_hex} if is_kept else None
