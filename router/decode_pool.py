"""The decode thread pool the intake prepares items in, with a bounded queue: overload is refused before decoding.

Admission control sits in the router, after decoding: a request must know its
lane and cost before the batcher can judge it. Under a flood that leaves a
gap, since ``ThreadPoolExecutor`` queues without limit: requests pile up
waiting for a decode thread, each to be parsed, decoded and only then shed,
and the ones admitted at the end have already spent their time in that queue.
So the pool refuses a submission once ``max_queued`` items wait for a thread:

    submit ──> running < threads           run now
           ──> waiting < max_queued        wait for a thread
           ──> otherwise                   503 overloaded + Retry-After, nothing decoded

``Retry-After`` is the time the waiting items take at the pool's recent pace.
The server builds the pool from its settings (``MMSERVE_DECODE_THREADS``,
``MMSERVE_MAX_DECODE_QUEUE``) and hands it to the intake; the refusal is the
router's typed ``DecodeQueueFullError``, which the server answers 503. Each
refusal also calls ``on_refused`` (the server counts it in
``mmserve_rejected_total{lane="intake", reason="decode_queue_full"}``, the
load-shedding signal the lanes' refusals feed too).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from router.errors import DecodeQueueFullError

_PACE_SMOOTHING = 0.1


class BoundedDecodePool(ThreadPoolExecutor):
    def __init__(self, max_workers: int, max_queued: int, thread_name_prefix: str = "mmserve-decode",
                 initializer: Callable[[], object] | None = None,
                 on_refused: Callable[[], object] | None = None) -> None:
        super().__init__(max_workers, thread_name_prefix=thread_name_prefix, initializer=initializer)
        self.max_queued = max_queued
        self._on_refused = on_refused
        self._num_workers = max_workers
        self._num_pending = 0  # submitted, not finished (running or waiting)
        self._mean_task_s = 0.005
        self._count_lock = threading.Lock()

    @property
    def num_waiting(self) -> int:
        return max(0, self._num_pending - self._num_workers)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        with self._count_lock:
            num_waiting = self._num_pending - self._num_workers
            if num_waiting >= self.max_queued:
                if self._on_refused is not None:
                    self._on_refused()
                raise DecodeQueueFullError(num_waiting, (num_waiting + 1) * self._mean_task_s / self._num_workers)
            self._num_pending += 1

        def timed() -> Any:
            started_s = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with self._count_lock:
                    self._num_pending -= 1
                    task_s = time.perf_counter() - started_s
                    self._mean_task_s += _PACE_SMOOTHING * (task_s - self._mean_task_s)

        try:
            return super().submit(timed)
        except BaseException:
            with self._count_lock:
                self._num_pending -= 1
            raise
