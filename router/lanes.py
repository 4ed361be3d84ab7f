"""Per-lane queues and their batching settings.

One ``Lane`` per route. A lane holds ``Pending`` items in arrival order; the
policy picks which of them form the next batch (most urgent first, texts of
similar length together). Lanes are only touched under the scheduler's lock.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from router.request import InferenceRequest, Route
from router.segments import SegmentPlan


@dataclass(frozen=True)
class LaneSettings:
    """Batching knobs of one lane (Triton's dynamic-batcher vocabulary)."""

    max_batch_size: int = 8
    max_queue_delay_ns: int = 5_000_000
    max_queue_size: int = 256
    default_timeout_ns: int = 30_000_000_000
    preferred_batch_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if self.max_queue_size < 1:
            raise ValueError("max_queue_size must be >= 1")
        if any(size < 1 or size > self.max_batch_size for size in self.preferred_batch_sizes):
            raise ValueError("preferred batch sizes must lie in [1, max_batch_size]")

    @property
    def warm_batch_sizes(self) -> tuple[int, ...]:
        """Every batch shape this lane runs: the preferred sizes, else powers of two."""
        if self.preferred_batch_sizes:
            sizes = set(self.preferred_batch_sizes)
        else:
            sizes = {1 << i for i in range(self.max_batch_size.bit_length()) if 1 << i <= self.max_batch_size}
        sizes.add(self.max_batch_size)
        return tuple(sorted(sizes))

    def padded_size(self, num_items: int) -> int:
        """The smallest warmed batch shape that holds ``num_items``."""
        return next(size for size in self.warm_batch_sizes if size >= num_items)


@dataclass(eq=False)
class Pending:
    """A queued request, its scheduling key and the way back to its awaiting coroutine.

    ``urgency_ns`` orders service (smaller first): the deadline shifted by the
    priority class's offset. ``length_bucket`` groups texts for padding (0
    for lanes without text). ``deadline_ns`` is the request's, or, for a
    request that set none, the one the router gave it from its lane's default
    timeout (kept here rather than in a copy of the frozen request).
    """

    request: InferenceRequest
    enqueued_ns: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    urgency_ns: int = 0
    length_bucket: int = 0
    plan: SegmentPlan | None = None  # cache claims to publish once computed
    deadline_ns: int | None = None  # None given: the request's own

    def __post_init__(self) -> None:
        if self.deadline_ns is None:
            self.deadline_ns = self.request.deadline_ns

    @property
    def is_cancelled(self) -> bool:
        return self.future.cancelled()

    @property
    def num_work_items(self) -> int:
        """What it counts against ``max_batch_size``: each image to encode (a vision batch of 8 is 8 images),
        else one (a text, or a fusion request whose images are all known)."""
        return max(1, self.request.num_images_to_encode)


@dataclass(eq=False)
class Lane:
    route: Route
    settings: LaneSettings
    queue: list[Pending] = field(default_factory=list)
