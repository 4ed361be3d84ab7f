"""One protocol request carrying many items -> one ``InferenceRequest`` per item.

    rows ──prepare (decode pool, in parallel)──> all prepared? ──submit all at once──> results
                       a bad row stops here                     the batcher batches them

Every row is prepared before any is submitted, so one undecodable image costs
no compute for its neighbours. The rows then go to the router together (not
one after another), which is what lets the dynamic batcher put them in one
batch. A request with more rows in a lane than that lane can ever queue is
refused up front: it could never be admitted whole.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

from router.request import InferenceResult
from server.error_mapping import api_error_from
from server.errors import ApiError
from server.execution import prepare_input, run_prepared
from server.inputs import ParsedInput, PreparedInput
from server.monitoring_setup import cache_hit_of
from server.protocols.errors import RowFailedError
from server.settings import LaneName
from server.state import ServerState

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class RowOutcome:
    """One row's model-ready input (token counts live here) and its result."""

    prepared: PreparedInput
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


async def _all_or_first_error(awaitables: Sequence[Awaitable[T]]) -> list[T]:
    """Await every row; if any failed, raise the first failure (by row) with its index."""
    outcomes = await asyncio.gather(*awaitables, return_exceptions=True)
    for row_index, outcome in enumerate(outcomes):
        if isinstance(outcome, Exception):
            raise RowFailedError(row_index, outcome) from outcome
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes  # type: ignore[return-value]


async def infer_rows(state: ServerState, rows: Sequence[ParsedInput], request_id: str,
                     started_ns: int) -> list[RowOutcome]:
    """Prepare every row in the decode pool, then submit all rows concurrently.

    Row ``i`` becomes request ``{request_id}-{i}``; all rows share the deadline
    ``started_ns + timeout``. Raises ``ApiError`` or ``RowFailedError``.
    """
    check_row_counts(rows, state)
    prepared = await asyncio.gather(*(prepare_input(state, row) for row in rows), return_exceptions=True)
    failed = [(i, outcome) for i, outcome in enumerate(prepared) if isinstance(outcome, BaseException)]
    if failed:
        # One row is refused, so none is computed: hand back the cache claims the others took.
        for outcome in prepared:
            if not isinstance(outcome, BaseException):
                outcome.plan.abandon()
        row_index, error = failed[0]
        if isinstance(error, Exception):
            raise RowFailedError(row_index, error) from error
        raise error
    results = await _all_or_first_error([
        run_prepared(state, f"{request_id}-{row_index}", row, item, started_ns)
        for row_index, (row, item) in enumerate(zip(rows, prepared))
    ])
    for item, result in zip(prepared, results):
        # A row's queue and compute stages are its own and go to its lane's digests;
        # its decode and end-to-end times are the whole request's, so a row adds no
        # decode or total sample (those stay what /v1/infer requests measured).
        state.monitor.record(result.route.value, result.stage_ns, batch_size=result.batch_size,
                             cache_hit=cache_hit_of(item.plan.statuses()))
    return [RowOutcome(item, result) for item, result in zip(prepared, results)]


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
