"""One protocol request carrying one or many items -> one router intake call for all of them.

Every protocol comes this way (the request layer, ``server.request_layer``,
calls it), native ``/v1/infer`` with its one item included.

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
from typing import cast, get_args

from router.errors import IntakeItemError
from router.intake import IntakeItem, IntakeOutcome
from router.request import InferenceResult
from server.http.error_mapping import api_error_from
from server.errors import ApiError
from server.ingest.inputs import ParsedInput
from server.protocols.errors import RowFailedError
from server.settings import LaneName, Settings
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


def max_rows_per_request(settings: Settings) -> int:
    """The most rows a request may carry whatever its lane: the smallest lane queue bound.

    ``check_row_counts`` refuses more rows in one lane than that lane can
    queue; a request of this many rows fits every lane. It is the v2
    model configuration's ``max_batch_size`` (Triton's: the most rows one
    request may carry), not the largest batch a lane runs.
    """
    return min(int(settings.lane_value(lane, "max_queue_size")) for lane in get_args(LaneName))


def check_row_counts(rows: Sequence[ParsedInput], state: ServerState, rows_field: str = "inputs") -> None:
    """413 ``too_many_rows`` when one lane would have to queue more rows than it holds; ``rows_field`` is the
    protocol's name for the rows (v2's ``inputs``, OpenAI's ``input``).

    One row always fits (every lane holds at least one: the settings say ``ge=1``), so most requests
    skip the count.
    """
    if len(rows) <= 1:
        return
    for lane, num_rows in Counter(row.route for row in rows).items():
        max_queue_size = int(state.settings.lane_value(cast(LaneName, lane), "max_queue_size"))
        if num_rows > max_queue_size:
            raise ApiError(
                413, "too_many_rows",
                f"the request has {num_rows} {lane} rows; the {lane} lane queues at most {max_queue_size} "
                f"(MMSERVE_{lane.upper()}_MAX_QUEUE_SIZE or MMSERVE_MAX_QUEUE_SIZE)", rows_field,
            )


async def infer_rows(state: ServerState, rows: Sequence[ParsedInput], items: Sequence[IntakeItem],
                     started_ns: int, rows_field: str = "inputs") -> list[RowOutcome]:
    """Every row through the intake at once; ``items`` are the rows as the intake takes them (same order).

    All rows share the deadline ``started_ns + timeout``. Raises ``ApiError``,
    ``RowFailedError`` or the router's typed errors.
    """
    check_row_counts(rows, state, rows_field)
    try:
        outcomes = await state.intake.run(items, started_ns)
    except IntakeItemError as e:
        raise RowFailedError(e.item_index, e.error) from e.error
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
