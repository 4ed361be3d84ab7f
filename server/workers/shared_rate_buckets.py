"""Rate-limit buckets shared by every API process: one table in shared memory, a lock per set.

With ``--api-workers N`` each API process holding its own ``InProcessTokenBuckets``
would give a key N times ``MMSERVE_RATE_LIMIT``. Instead the supervisor creates
this table once, a file in ``/dev/shm`` (memory that every process mapping it
shares; mode 0600, so only the server's user can read or reset a bucket),
hands its path to every API process it starts, restarted ones included (a
restart forgets no caller's bucket), and removes it when the server stops (a
supervisor killed with SIGKILL cannot: its API processes, exiting as orphans,
remove it, ``server.workers.orphan_guard``).
Each API process maps it and takes tokens through ``SharedTokenBuckets.take``,
the ``TokenBucketStore`` of ``server.http.rate_limit``, so the 429 answers,
``Retry-After`` and ``mmserve_rate_limited_total`` are the single process's.

Layout (little-endian; 65,536 buckets take 1.5 MiB)::

    header   magic b"mmsrb001" | num_sets u64 | zeros to 64 bytes
    set 0    slot | slot | slot | slot                   WAYS = 4 slots, 96 bytes
    set 1    ...
    slot     tag u64 | tokens f64 | updated_ns i64      24 bytes; tag 0: never used

Callers and collisions. A caller (``key:<key_id>`` or ``addr:<address>``) is
hashed to a 64-bit tag with BLAKE2b (``hash()`` is seeded per process, so it
would not agree between processes); the tag picks one set, and the caller's
bucket is the slot of that set holding its tag. A caller with no slot takes
the slot of its set updated longest ago (a never-used one first) and starts
with a full bucket. So at most four callers of one set are held at a time and,
as in ``InProcessTokenBuckets`` past its bound, the one seen longest ago is
forgotten: it starts full when it returns. Forgetting can only grant a caller
more than its limit, never less; only a flood of distinct callers (client
addresses) hashing into a set pushes a quiet caller out. Two callers with one
tag would share a bucket: about n² / 2⁶⁵ for n callers, never in practice.

Atomicity. ``take`` holds a POSIX record lock (``fcntl.lockf``) on its set's 96
bytes of the file while it reads the set, refills the bucket, takes a token and
writes the slot back; callers of other sets never wait. A record lock belongs
to a process, so a ``threading.Lock`` orders the threads of one process first
(an API process calls from its event loop only; the lock costs ~0.1 µs). A
lock dies with its process, so an API process killed mid-take blocks nobody,
which a semaphore or a lock word in the table could not promise. A take costs
about 5 µs of CPU against about 1 µs in process memory, most of it the two
``fcntl`` calls (one per set rather than ``flock`` on the whole file, about
1 µs cheaper, so that callers of different sets never wait for each other).

Clock. The ``now_ns`` passed in is ``time.monotonic_ns`` (CLOCK_MONOTONIC), one
clock for every process on the machine. A take whose reading is older than the
slot's (it read the clock, then waited for the lock) refills nothing and keeps
the newer time, so no interval is counted twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import tempfile
import threading
from functools import lru_cache
from pathlib import Path

from server.http.rate_limit import DEFAULT_MAX_BUCKETS, RateLimit

SHARED_MEMORY_DIRECTORY = "/dev/shm"
FILE_PREFIX = "mmserve-rate-buckets-"
MAGIC = b"mmsrb001"
HEADER = struct.Struct("<8sQ")
HEADER_BYTES = 64
WAYS = 4
SLOT = struct.Struct("<Qdq")  # tag, tokens, updated_ns
SET = struct.Struct("<" + "Qdq" * WAYS)
SET_BYTES = SET.size  # 96
DEFAULT_NUM_BUCKETS = DEFAULT_MAX_BUCKETS  # the in-process store's bound


def table_bytes(num_sets: int) -> int:
    return HEADER_BYTES + num_sets * SET_BYTES


@lru_cache(maxsize=4096)
def caller_tag(caller: str) -> int:
    """The caller's 64-bit tag, the same in every process; never 0 (0 marks a slot never used)."""
    tag = int.from_bytes(hashlib.blake2b(caller.encode(), digest_size=8).digest(), "little")
    return tag or 1


class SharedBucketTable:
    """The supervisor's side: creates the zeroed table file, and removes it when the server stops."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def create(cls, num_buckets: int = DEFAULT_NUM_BUCKETS, directory: str | None = None) -> SharedBucketTable:
        """A new table of ``num_buckets`` (rounded up to whole sets of WAYS) in shared memory.

        ``directory`` defaults to ``/dev/shm`` where there is one (Linux), else the temporary directory.
        """
        if num_buckets < 1:
            raise ValueError(f"a bucket table needs at least one bucket, got {num_buckets}")
        if directory is None:
            directory = SHARED_MEMORY_DIRECTORY if os.path.isdir(SHARED_MEMORY_DIRECTORY) else tempfile.gettempdir()
        num_sets = -(-num_buckets // WAYS)
        descriptor, path = tempfile.mkstemp(prefix=FILE_PREFIX, dir=directory)
        try:
            os.ftruncate(descriptor, table_bytes(num_sets))  # zero-filled: every slot unused
            os.pwrite(descriptor, HEADER.pack(MAGIC, num_sets), 0)
        finally:
            os.close(descriptor)
        return cls(path)

    def remove(self) -> None:
        remove_table(self.path)


def remove_table(path: str | None) -> None:
    """Remove the table file (the supervisor when the server stops; its orphans if it was killed)."""
    if path is not None:
        Path(path).unlink(missing_ok=True)


class SharedTokenBuckets:
    """An API process's side: the ``TokenBucketStore`` over the mapped table (see the module docstring)."""

    def __init__(self, path: str, limit: RateLimit) -> None:
        self.limit = limit
        self._burst = float(limit.burst)
        self._ns_per_token = 1e9 / limit.per_s
        self._descriptor = os.open(path, os.O_RDWR)
        try:
            magic, num_sets = HEADER.unpack(os.pread(self._descriptor, HEADER.size, 0))
            if magic != MAGIC or os.fstat(self._descriptor).st_size != table_bytes(num_sets):
                raise ValueError(f"{path} is not a rate-limit bucket table")
            self._table = mmap.mmap(self._descriptor, table_bytes(num_sets))
        except BaseException:
            os.close(self._descriptor)
            raise
        self.num_sets = num_sets
        self._thread_lock = threading.Lock()

    def take(self, caller: str, now_ns: int) -> float:
        """0.0 when a token was taken, else the seconds until the bucket holds one (one atomic step)."""
        tag = caller_tag(caller)
        offset = HEADER_BYTES + (tag % self.num_sets) * SET_BYTES
        burst = self._burst
        with self._thread_lock:
            fcntl.lockf(self._descriptor, fcntl.LOCK_EX, SET_BYTES, offset)
            try:
                fields = SET.unpack_from(self._table, offset)  # (tag, tokens, updated_ns) x WAYS
                tags = fields[0::3]
                if tag in tags:
                    way = tags.index(tag)
                    tokens, updated_ns = fields[3 * way + 1], fields[3 * way + 2]
                else:  # the slot updated longest ago (never used: 0) is forgotten; this caller starts full
                    updated = fields[2::3]
                    way = updated.index(min(updated))
                    tokens, updated_ns = burst, now_ns
                tokens = min(burst, tokens + max(0, now_ns - updated_ns) / self._ns_per_token)
                wait_s = 0.0
                if tokens >= 1.0:
                    tokens -= 1.0
                else:
                    wait_s = (1.0 - tokens) * self._ns_per_token / 1e9
                SLOT.pack_into(self._table, offset + way * SLOT.size, tag, tokens, max(updated_ns, now_ns))
            finally:
                fcntl.lockf(self._descriptor, fcntl.LOCK_UN, SET_BYTES, offset)
        return wait_s

    def close(self) -> None:
        self._table.close()
        os.close(self._descriptor)
