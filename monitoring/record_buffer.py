"""The hot path's side of the monitor: a bounded buffer of records, appended without a lock, folded in bulk.

    request threads                       one drainer at a time (the folder thread, stop(), mark_ready())
    ---------------                       ---------------------------------------------------------------
    append(route, stage_ns, ...)          drain_and_fold():
      len < capacity: deque.append          pop what is there now -> fold_records -> FoldResult
      else: num_dropped += 1              (under a lock of its own: record() never waits for it)

``deque.append`` and ``popleft`` are atomic, so writers need no lock; the
buffer is bounded so a stopped or fallen-behind folder costs a count of
dropped records, never memory.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from itertools import repeat, starmap

from monitoring.ingest import FoldResult, Record, fold_records
from monitoring.inputs import RequestInputs


class RecordBuffer:
    """At most ``capacity`` records waiting to be folded; what does not fit is counted, not kept."""

    def __init__(self, capacity: int) -> None:
        self._buffer: deque[Record] = deque()
        self._capacity = capacity
        self._drain_lock = threading.Lock()
        self.num_dropped = 0

    def append(self, route: str, stage_ns: Mapping[str, int], batch_size: int | None, cache_hit: bool | None,
               inputs: RequestInputs | None) -> None:
        """O(1), no lock, never raises; ``stage_ns`` is kept, not copied."""
        buffer = self._buffer
        if len(buffer) < self._capacity:
            buffer.append((route, stage_ns, batch_size, cache_hit, inputs))
        else:
            self.num_dropped += 1

    def drain_and_fold(self) -> FoldResult:
        """Everything appended so far, folded into one array of seconds per cell."""
        # append() only appends, so len() is a safe lower bound of what can be popped.
        with self._drain_lock:
            buffer = self._buffer
            # starmap pops in a C loop: half what a comprehension costs per record.
            records = list(starmap(buffer.popleft, repeat((), len(buffer))))
        return fold_records(records)
