"""The batching policy: which lane runs next, with which requests, and when.

A function of the lanes, the clock and the service-time estimates, so it is
tested on a fake clock. The scheduler calls it under its lock.

Order of service — earliest deadline first, shifted by priority class:

    urgency = deadline - priority_step   (high)
            = deadline                   (normal)
            = deadline + priority_step   (low)

A low request is therefore served before any normal request that arrived
more than ``priority_step`` after it: the offset is bounded, so waiting ages
a low request past newcomers and it is never starved.

A lane's batch closes when any of these holds:

    * it is full (``max_batch_size`` items chosen, or the queue holds that many);
      an item is one image to encode (a request with K new images is K items)
      or one text, so a vision batch of 8 is 8 images, whoever sent them;
    * its oldest item has waited ``max_queue_delay``;
    * waiting longer would make its most urgent item miss its deadline,
      given the measured service time of a batch of this (padded) size.

Among closed lanes the one whose head is most urgent runs, except that a
lane never runs twice in a row while another lane has a closed batch: with
equal timeouts, EDF alone is FIFO across lanes, and a text request would
wait behind every queued vision batch. With the rule it waits for at most
one batch of another lane (the isolation the lanes exist for).

The two image lanes share their batches: a vision or fusion batch with room
left takes the most urgent requests of the other image lane (when both lanes
warm the same batch shapes). Every request in it needs the vision encoder, so
one encoder pass serves both lanes, as a single mixed queue would, instead of
two part-filled batches in turn, each waiting for the other's; text encoding
and fusion then run for the fusion rows only. Requests whose
deadline has passed are taken out (to be answered 504) and cancelled ones are
dropped, so neither ever holds a batch slot. Text batches group requests of
the same length bucket (then shorter ones), so a batch pads to its bucket,
not to the longest text in the queue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from router.lanes import Lane, Pending
from router.request import Priority, Route

EstimateNs = Callable[[Route, int], int]


def urgency_ns(deadline_ns: int, priority: Priority, priority_step_ns: int) -> int:
    if priority == Priority.HIGH:
        return deadline_ns - priority_step_ns
    if priority == Priority.LOW:
        return deadline_ns + priority_step_ns
    return deadline_ns


def _service_order(pending: Pending) -> tuple[int, int]:
    return pending.urgency_ns, pending.enqueued_ns


def num_work_items(batch: Sequence[Pending]) -> int:
    return sum(p.num_work_items for p in batch)


def _up_to(candidates: Sequence[Pending], limit: int, *, is_head_included: bool = True) -> list[Pending]:
    """The candidates, in order, whose work items fit in ``limit``; one that does not fit is passed over
    for smaller ones behind it. ``is_head_included``: the first goes whatever its size (a request with
    more images than the cap runs alone, its images in several encoder passes)."""
    chosen: list[Pending] = []
    room = limit
    for pending in candidates:
        if room <= 0:
            break
        if pending.num_work_items > room and (chosen or not is_head_included):
            continue
        chosen.append(pending)
        room -= pending.num_work_items
    return chosen


def select_batch(lane: Lane) -> list[Pending]:
    """The lane's next batch: its most urgent item plus the best companions, up to ``max_batch_size`` items."""
    ordered = sorted(lane.queue, key=_service_order)
    limit = lane.settings.max_batch_size
    head_bucket = ordered[0].length_bucket
    if head_bucket == 0:
        return _up_to(ordered, limit)
    same = [p for p in ordered if p.length_bucket == head_bucket]
    shorter = [p for p in ordered if p.length_bucket < head_bucket]
    return _up_to(same + shorter, limit)


@dataclass(frozen=True)
class Decision:
    """Run ``batch`` of ``lane`` now, or sleep ``wait_ns`` (None: until a put).

    What ``decide`` returns and what the scheduler hands the compute thread
    (``Scheduler.next_batch``): ``lane`` is ``None`` when there is no batch
    to run, only ``expired`` requests to answer (or nothing yet).
    """

    lane: Lane | None
    batch: list[Pending] = field(default_factory=list)
    expired: list[Pending] = field(default_factory=list)
    wait_ns: int | None = None


def _take_out_dead(lane: Lane, now_ns: int, expired: list[Pending]) -> None:
    alive = []
    for pending in lane.queue:
        if pending.is_cancelled:
            continue
        if pending.deadline_ns <= now_ns:
            expired.append(pending)
        else:
            alive.append(pending)
    if len(alive) < len(lane.queue):
        lane.queue.replace(alive)


_IMAGE_ROUTES = frozenset({Route.VISION, Route.FUSION})


def _take(lane: Lane, batch: Sequence[Pending]) -> None:
    chosen = set(map(id, batch))
    lane.queue.replace(p for p in lane.queue if id(p) not in chosen)


def _image_companions(lane: Lane, lanes: Sequence[Lane], room: int) -> list[Pending]:
    """Up to ``room`` of the most urgent requests of the other image lanes, taken out of their queues.

    Only for an image lane, and only from image lanes that warm the same
    batch shapes (the mixed batch runs at the leading lane's shapes).
    """
    if room <= 0 or lane.route not in _IMAGE_ROUTES:
        return []
    companions: list[Pending] = []
    for other in lanes:
        if (other is lane or other.route not in _IMAGE_ROUTES or not other.queue
                or other.settings.warm_batch_sizes != lane.settings.warm_batch_sizes):
            continue
        taken = _up_to(sorted(other.queue, key=_service_order), room - num_work_items(companions),
                       is_head_included=False)
        _take(other, taken)
        companions += taken
    return companions


def decide(lanes: Sequence[Lane], now_ns: int, estimate_ns: EstimateNs,
           last_route: Route | None = None, *, is_draining: bool = False) -> Decision:
    """The next batch; ``last_route`` is the lane that ran the previous one.

    ``is_draining``: the server is shutting down and no more requests will
    come, so waiting for fuller batches gains nothing: every lane with a
    queue counts as closed, and the usual order and batch choice decide.
    """
    expired: list[Pending] = []
    ready: list[tuple[tuple[int, int], Lane, list[Pending]]] = []
    earliest_close_ns: int | None = None
    for lane in lanes:
        _take_out_dead(lane, now_ns, expired)
        if not lane.queue:
            continue
        batch = select_batch(lane)
        settings = lane.settings
        num_items = num_work_items(batch)
        service_ns = estimate_ns(lane.route, settings.padded_size(min(num_items, settings.max_batch_size)))
        close_ns = min(
            min(p.enqueued_ns for p in batch) + settings.max_queue_delay_ns,
            min(p.deadline_ns for p in batch) - service_ns,
        )
        is_full = num_items >= settings.max_batch_size or lane.queue.work_items >= settings.max_batch_size
        if is_full or close_ns <= now_ns or is_draining:
            ready.append((_service_order(batch[0]), lane, batch))
        elif earliest_close_ns is None or close_ns < earliest_close_ns:
            earliest_close_ns = close_ns
    if ready:
        others = [entry for entry in ready if entry[1].route != last_route]
        _, lane, batch = min(others or ready, key=lambda entry: entry[0])
        _take(lane, batch)
        batch = batch + _image_companions(lane, lanes, lane.settings.max_batch_size - num_work_items(batch))
        return Decision(lane=lane, batch=batch, expired=expired)
    wait_ns = None if earliest_close_ns is None else max(0, earliest_close_ns - now_ns)
    return Decision(lane=None, expired=expired, wait_ns=wait_ns)


def work_ahead_ns(lanes: Sequence[Lane], urgency_limit_ns: int, estimate_ns: EstimateNs) -> int:
    """Device time of the queued work that would run before an item of ``urgency_limit_ns``."""
    total_ns = 0
    for lane in lanes:
        ahead = lane.queue.work_items_up_to(urgency_limit_ns)
        if ahead:
            full, rest = divmod(ahead, lane.settings.max_batch_size)
            total_ns += full * estimate_ns(lane.route, lane.settings.max_batch_size)
            if rest:
                total_ns += estimate_ns(lane.route, lane.settings.padded_size(rest))
    return total_ns
