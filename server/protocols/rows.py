"""One protocol request carrying many items -> one router intake call for all of them.

    rows ──intake.run──> prepare all (decode pool, in parallel) ──all prepared?──> submit all at once
                                         a bad row stops here, every claim handed back

The router's intake (``router.intake``) prepares every row before any is
submitted, so one undecodable image costs no compute for its neighbours, and
then submits the rows together (not one after another), which is what lets
the dynamic batcher put them in one batch. A request with more rows in a lane
than that lane can ever queue is refused up front: it could never be admitted
whole.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from router.errors import IntakeItemError
from router.intake import IntakeOutcome
from router.request import InferenceResult
from router.tracing import SpanIds
from server.http.error_mapping import api_error_from
from server.http.traced_answer import TracedAnswer, TracedItem
from server.errors import ApiError
from server.ingest.inputs import ParsedInput, intake_item
from server.runtime.monitoring_setup import cache_hit_of, request_inputs
from server.protocols.errors import RowFailedError
from server.settings import LaneName
from server.state import ServerState

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowOutcome:
    """One row's intake outcome (token counts live here) and its result."""

    prepared: IntakeOutcome
    result: InferenceResult


@dataclass(frozen=True)
class Failure:
    """Why a request failed, as an ``ApiError``, and the row it came from (if one did)."""

    error: ApiError
    row_index: int | None


def check_row_counts(rows: Sequence[ParsedInput], state: ServerState) -> None:
    """413 ``too_many_rows`` when one lane would have to queue more rows than it holds."""
    for lane, num_rows in Counter(row.route for row in rows).items():
        max_queue_size = int(state.settings.lane_value(cast(LaneName, lane), "max_queue_size"))
        if num_rows > max_queue_size:
            raise ApiError(
                413, "too_many_rows",
                f"the request has {num_rows} {lane} rows; the {lane} lane queues at most {max_queue_size} "
                f"(MMSERVE_{lane.upper()}_MAX_QUEUE_SIZE or MMSERVE_MAX_QUEUE_SIZE)", "inputs",
            )


async def infer_rows(state: ServerState, rows: Sequence[ParsedInput], request_id: str,
                     started_ns: int, *, protocol: str, trace: SpanIds | None = None) -> list[RowOutcome]:
    """Every row through the intake at once; row ``i`` becomes request ``{request_id}-{i}``.

    All rows share the deadline ``started_ns + timeout`` and the server span
    ``trace`` (while tracing is on). Raises ``ApiError``, ``RowFailedError``
    or the router's typed errors. ``protocol`` labels the rows' latency
    records (``kserve_v2``, ``openai``).
    """
    check_row_counts(rows, state)
    items = [intake_item(row, f"{request_id}-{row_index}", trace) for row_index, row in enumerate(rows)]
    try:
        outcomes = await state.intake.run(items, started_ns)
    except IntakeItemError as e:
        raise RowFailedError(e.item_index, e.error) from e.error
    for row, outcome in zip(rows, outcomes):
        # A row's queue and compute stages are its own and go to its lane's digests;
        # its decode and end-to-end times are the whole request's, so a row adds no
        # decode or total sample (those stay what /v1/infer requests measured).
        # Its inputs are the row's own: one row is one request to the monitor.
        state.monitor.record(outcome.result.route.value, outcome.result.stage_ns,
                             batch_size=outcome.result.batch_size, cache_hit=cache_hit_of(outcome.plan.statuses()),
                             inputs=request_inputs(row, outcome, protocol))
        if outcome.joint is not None:
            state.metrics.joint_tokens.labels(route=outcome.result.route.value).observe(outcome.joint.total)
    return [RowOutcome(outcome, outcome.result) for outcome in outcomes]


def failure_from(error: Exception, request_id: str) -> Failure:
    """The answer for any failure; an unexpected one is logged once, with the request id."""
    row_index = None
    if isinstance(error, RowFailedError):
        row_index, error = error.row_index, error.error
    api_error = api_error_from(error)
    if api_error is None:
        logger.error("unexpected error in request %s", request_id, exc_info=error)
        api_error = ApiError(500, "internal_error", f"internal error (request id {request_id})")
    return Failure(api_error, row_index)


def traced_rows(http_route: str, metrics_route: str, status_code: int, ended_ns: int, rows: Sequence[ParsedInput],
                outcomes: Sequence[RowOutcome], failure: Failure | None, respond_started_ns: int) -> TracedAnswer:
    """A many-row answer for the tracer (tracing on only): a row span per row, ``respond`` from its start to the end.

    A failed request has no outcomes: its rows show what they sent, the
    server span the error and the row it came from.
    """
    prepared = [outcome.prepared for outcome in outcomes] if len(outcomes) == len(rows) else [None] * len(rows)
    return TracedAnswer(
        http_route, metrics_route, status_code, ended_ns,
        items=tuple(TracedItem(row, outcome) for row, outcome in zip(rows, prepared)),
        error_code=failure.error.code if failure is not None else None,
        error_row=failure.row_index if failure is not None else None,
        respond=(respond_started_ns, ended_ns - respond_started_ns) if respond_started_ns else None,
        as_rows=True,
    )
