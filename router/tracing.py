"""What the router knows about tracing: span ids a request brings, and the record of each batch it ran.

The server emits spans once a request is answered, when it knows the status
and the duration and so can decide whether the trace is kept (tail-biased
sampling). A batch runs before any of its requests is answered, so the
router does not emit a batch span either; it records one:

    arrival (server)    SpanIds(trace_id, span_id) of the request's server span, made up front
                          └─> IntakeItem.trace -> InferenceRequest.trace
    compute thread      BatchTracer.record(...) -> BatchTrace: its own SpanIds, lane, sizes,
                          shapes, device, start and stage times, and the SpanIds of every
                          request it served (links)
                          └─> InferenceResult.batch_trace
    answer (server)     the request span links to its batch; the first kept request of a
                        batch emits the batch span (linked back to the requests it served)

Plain values only (no OpenTelemetry import): the server turns them into
spans. With tracing off the router is given no ``BatchTracer`` and none of
this runs.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from router.lanes import LaneSettings
from router.request import InferenceRequest, Route

_STAGE_ORDER = ("vision", "text", "fusion")  # the order BatchRunner.run_batch runs them in


@dataclass(frozen=True)
class SpanIds:
    """A span's W3C ids: a 128-bit trace id and a 64-bit span id (both non-zero)."""

    trace_id: int
    span_id: int


def new_span_ids(trace_id: int | None = None, rng: random.Random | None = None) -> SpanIds:
    """Fresh ids (in ``trace_id``'s trace if given); random, as the W3C spec asks, never zero."""
    draw = (rng or random).getrandbits
    span_id = draw(64) or 1
    return SpanIds(trace_id if trace_id else (draw(128) or 1), span_id)


@dataclass(frozen=True)
class BatchTrace:
    """One executed batch as a span-to-be. Times are ``perf_counter_ns`` values of the compute thread.

    ``stage_ns`` holds each stage the batch ran, in the order it ran them
    (vision, text, fusion), back to back from ``started_ns``: a request's own
    ``vision``/``text``/``fusion`` time is the batch's.
    """

    ids: SpanIds
    lane: Route
    executor: str
    device: str
    num_requests: int
    num_work_items: int  # images to encode (each counts) or one per request
    padded_size: int
    image_shape: tuple[int, ...]  # (rows, S, S, 3) through the vision encoder; () if it did not run
    text_shape: tuple[int, ...]  # (rows, padded length) through the text encoder; () if it did not run
    started_ns: int
    elapsed_ns: int
    stage_ns: tuple[tuple[str, int], ...]
    links: tuple[SpanIds, ...]  # the request spans it served, each once
    num_failed: int = 0
    # When each stage it ran began, laid out once here, where the batch is recorded: the server reads
    # it after the answer as a plain value.
    stage_starts_ns: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        starts_ns, offset_ns = {}, 0
        for name, duration_ns in self.stage_ns:
            starts_ns[name] = self.started_ns + offset_ns
            offset_ns += duration_ns
        object.__setattr__(self, "stage_starts_ns", starts_ns)

    def stage_started_ns(self, stage: str) -> int | None:
        """When ``stage`` began in this batch; ``None`` if the batch did not run it."""
        return self.stage_starts_ns.get(stage)


class BatchTracer:
    """Records a ``BatchTrace`` per batch on the compute thread; the router holds one only while tracing is on.

    Args:
        device: The model's device as the span shows it (``"cpu"``, ``"cuda:0"``).
        image_size: The model's square input side S, for the vision shape.
    """

    def __init__(self, device: str, image_size: int, rng: random.Random | None = None) -> None:
        self.device = device
        self.image_size = image_size
        self._rng = rng

    def record(self, lane: Route, settings: LaneSettings, executor: str, requests: Sequence[InferenceRequest],
               stage_ns: Sequence[Mapping[str, int]], *, num_work_items: int, padded_size: int,
               text_width: int, batch_rows: Callable[[str, int], int], started_ns: int, elapsed_ns: int,
               num_failed: int) -> BatchTrace:
        """``stage_ns``: each answered request's stage times (the batch ran a stage if any request shows it).

        The shapes are the ones ``BatchRunner`` runs: the images to encode
        (at most ``max_batch_size`` per forward) and the texts to encode, each
        as ``batch_rows(encoder, num_items)`` rows (``BatchRunner.batch_rows``); texts at ``text_width``
        tokens (``BatchRunner.text_width``).
        """
        ran: dict[str, int] = {}
        for times in stage_ns:
            for stage in _STAGE_ORDER:
                if stage in times:
                    ran[stage] = max(ran.get(stage, 0), times[stage])
        num_images = min(sum(r.num_images_to_encode for r in requests), settings.max_batch_size)
        num_texts = min(sum(r.needs_text for r in requests), settings.max_batch_size)
        links: dict[int, SpanIds] = {}
        for request in requests:
            if request.trace is not None:
                links.setdefault(request.trace.span_id, request.trace)
        size = self.image_size
        return BatchTrace(
            ids=new_span_ids(rng=self._rng),
            lane=lane,
            executor=executor,
            device=self.device,
            num_requests=len(requests),
            num_work_items=num_work_items,
            padded_size=padded_size,
            image_shape=(batch_rows("vision", num_images), size, size, 3) if "vision" in ran else (),
            text_shape=(batch_rows("text", num_texts), text_width) if "text" in ran else (),
            started_ns=started_ns,
            elapsed_ns=elapsed_ns,
            stage_ns=tuple((stage, ran[stage]) for stage in _STAGE_ORDER if stage in ran),
            links=tuple(links.values()),
            num_failed=num_failed,
        )
