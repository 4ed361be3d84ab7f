"""Decoded pixels on their way to the engine: fixed-size slots in one shared-memory block per API process.

An API process decodes each image the engine does not already hold into the
model's (S, S, 3) uint8 input; when the request is sent, each of those images
is written into a free slot and only the slot's number travels in the frame.
The engine copies the pixels out as the call arrives, before anything of the
call runs, and marks the slot free in the block itself: no answer frame, no
wait for the call's answer. So a slot is held only while its image is in
transit (sent, not yet read by the engine), never while its request waits in
a lane or computes, and slots do not change which requests are accepted:
the lanes' queue bounds and the decode queue refuse first, as in one process.

    block = header (8 bytes: num_slots, 8 bytes per slot: its state) | slot 0 | slot 1 | ...
    state  > 0   held since that ``perf_counter_ns`` (the API process wrote the pixels and sent them)
           < 0   copied out by the engine at minus that ``perf_counter_ns``: free again
           = 0   free

Each side writes only its own transition (the API process free -> held and
copied -> free, the engine held -> copied), as one aligned 8-byte store, and
the engine stores "copied" after its copy: the owner never sees a slot free
whose pixels the engine still reads. ``perf_counter_ns`` is CLOCK_MONOTONIC
on Linux, one clock for every process, so each copy also measures how long
its slot was held; that pace sets ``Retry-After`` when every slot is held
(503 ``overloaded``), as the decode pool and the lanes pace theirs, and counts
in ``mmserve_rejected_total{lane="intake", reason="pixel_slots_full"}`` as
theirs do (``on_full``).

How many: ``MMSERVE_PIXEL_SLOTS`` (``pixel_slots_of``), by default as many
images as the image lanes' largest queue bound holds requests of the most
images. Free slots are handed out lowest number first, so the block's pages
are touched only as deep as the most images ever in transit at once (the
block is sparse until written).

Whose block: a file in ``/dev/shm`` named ``block_prefix(supervisor pid, API
process pid)`` + a random part, opened and mapped as ``shared_rate_buckets``
maps its table, not through ``multiprocessing.shared_memory``: that module
registers every block it creates or attaches with the process's resource
tracker (Python 3.11, 3.12), which unlinks what is still registered when the
process dies and warns ``There appear to be N leaked shared_memory objects``:
after an API process killed with SIGKILL, a warning of a leak there was not.
Its owner unlinks it instead (``close``), and when it cannot, the supervisor
as it notes the process's death, and when the server stops, removes every
block under the prefix (``remove_blocks``); an API process orphaned by a
killed supervisor removes its own (``server.workers.orphan_guard``).
"""

from __future__ import annotations

import mmap
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from server.errors import ApiError
from server.settings import Settings

_HEADER_ALIGN = 64
_PACE_SMOOTHING = 0.1
_INITIAL_HOLD_S = 0.001
_SHARED_MEMORY_DIRECTORY = Path("/dev/shm")


def block_prefix(supervisor_pid: int, api_pid: int | None = None) -> str:
    """How the names of a server's blocks (of its API process ``api_pid``'s, when given) begin."""
    return f"mmserve-pixels-{supervisor_pid}-" + ("" if api_pid is None else f"{api_pid}-")


def _directory() -> Path:
    """``/dev/shm`` where there is one (Linux: memory), else the temporary directory."""
    return _SHARED_MEMORY_DIRECTORY if _SHARED_MEMORY_DIRECTORY.is_dir() else Path(tempfile.gettempdir())


def remove_blocks(prefix: str) -> None:
    """Unlink every block whose name begins with ``prefix`` (a process mapping one keeps its memory)."""
    for path in _directory().glob(f"{prefix}*"):
        path.unlink(missing_ok=True)


def _mapped(path: Path, size_bytes: int | None = None) -> mmap.mmap:
    """The file at ``path`` mapped; created first (mode 0600, it must not exist) with ``size_bytes``."""
    flags = os.O_RDWR if size_bytes is None else os.O_RDWR | os.O_CREAT | os.O_EXCL
    fd = os.open(path, flags, 0o600)
    try:
        if size_bytes is not None:
            os.ftruncate(fd, size_bytes)
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def pixel_slots_of(settings: Settings) -> int:
    """``pixel_slots`` when set, else ``max_images_per_request`` x the largest image lane's queue bound."""
    if settings.pixel_slots is not None:
        return settings.pixel_slots
    bound = max(settings.lane_value("vision", "max_queue_size"), settings.lane_value("fusion", "max_queue_size"))
    return settings.max_images_per_request * int(bound)


def _layout(num_slots: int) -> int:
    """Where slot 0 starts: past the count and the states, aligned."""
    header = 8 * (1 + num_slots)
    return -(-header // _HEADER_ALIGN) * _HEADER_ALIGN


class PixelSlots:
    """The API process's side: owns the block, writes images into free slots (on the event loop's thread)."""

    def __init__(self, slot_shape: tuple[int, int, int], num_slots: int,
                 on_full: Callable[[], object] | None = None, supervisor_pid: int | None = None) -> None:
        """``supervisor_pid``: the server's, whose prefix the block's name takes (default: this process's)."""
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.slot_shape = slot_shape
        self.slot_bytes = int(np.prod(slot_shape))
        self.num_slots = num_slots
        self._on_full = on_full
        self._offset = _layout(num_slots)
        prefix = block_prefix(os.getpid() if supervisor_pid is None else supervisor_pid, os.getpid())
        self._path = _directory() / f"{prefix}{secrets.token_hex(4)}"
        self._memory = _mapped(self._path, self._offset + self.slot_bytes * num_slots)
        header = np.ndarray((1 + num_slots,), np.int64, self._memory, 0)
        header[0] = num_slots
        self._states = header[1:]  # (num_slots,) the protocol above
        self._taken_ns = np.zeros(num_slots, np.int64)  # when each held slot was taken (this side's copy)
        self._mean_hold_s = _INITIAL_HOLD_S

    @property
    def name(self) -> str:
        """The block's path, which the engine attaches."""
        return str(self._path)

    @property
    def num_held(self) -> int:
        """Slots sent and not yet copied out by the engine."""
        return int(np.count_nonzero(self._states > 0))

    @property
    def mean_hold_s(self) -> float:
        """How long a slot has recently stayed with the engine, from taken to copied out (smoothed)."""
        return self._mean_hold_s

    def put(self, images: Sequence[np.ndarray]) -> list[int]:
        """Each image written into a free slot, now held until the engine copies it; their numbers.

        All or nothing: with fewer free slots than images, 503 ``overloaded``
        whose ``Retry-After`` is the time the shortfall takes to come back at
        the recent pace, and no slot is taken.
        """
        for pixels in images:
            if pixels.shape != self.slot_shape or pixels.dtype != np.uint8:
                raise ValueError(f"a slot holds {self.slot_shape} uint8 pixels, got {pixels.dtype} {pixels.shape}")
        now_ns = time.perf_counter_ns()
        self._collect_copied()
        free = np.flatnonzero(self._states == 0)
        if len(images) > len(free):
            shortfall = len(images) - len(free)
            if self._on_full is not None:
                self._on_full()
            raise ApiError(503, "overloaded",
                           f"all {self.num_slots} shared-memory pixel slots of this API process hold images on "
                           "their way to the engine", retry_after_s=shortfall * self._mean_hold_s / self.num_slots)
        chosen = [int(slot) for slot in free[:len(images)]]
        for slot, pixels in zip(chosen, images):
            self.view(slot)[...] = pixels
            self._taken_ns[slot] = now_ns
            self._states[slot] = now_ns
        return chosen

    def give_back(self, slots: Sequence[int]) -> None:
        """Slots put but never sent (the engine will not copy them)."""
        for slot in slots:
            self._states[slot] = 0
            self._taken_ns[slot] = 0

    def give_back_uncopied(self, slots: Sequence[int]) -> None:
        """Of ``slots``, sent to an engine that died before answering, those it had not copied out yet: no engine
        ever will (a new one does not read the calls the dead one was sent), so they would stay held for good.
        The ones it copied are collected as usual (``put``)."""
        self.give_back([slot for slot in slots if self._states[slot] > 0])

    def _collect_copied(self) -> None:
        """Slots the engine copied out since: free again, and how long each was held feeds the pace."""
        copied = np.flatnonzero(self._states < 0)
        if not len(copied):
            return
        held_ns = -self._states[copied] - self._taken_ns[copied]  # (k,)
        self._states[copied] = 0
        self._taken_ns[copied] = 0
        self._mean_hold_s += _PACE_SMOOTHING * (float(held_ns.mean()) / 1e9 - self._mean_hold_s)

    def view(self, slot: int) -> np.ndarray:
        start = self._offset + slot * self.slot_bytes
        return np.ndarray(self.slot_shape, np.uint8, self._memory, start)

    def close(self) -> None:
        self._states = self._taken_ns = None  # type: ignore[assignment]  # views of the buffer go first
        self._memory.close()
        self._path.unlink(missing_ok=True)


class AttachedSlots:
    """The engine's side of one API process's block: copies pixels out of a slot and frees it."""

    def __init__(self, name: str, slot_shape: tuple[int, int, int]) -> None:
        """``name``: the block's path (``PixelSlots.name``); the API process owns and unlinks it."""
        self._memory = _mapped(Path(name))
        num_slots = int(np.ndarray((1,), np.int64, self._memory, 0)[0])
        self._states = np.ndarray((num_slots,), np.int64, self._memory, 8)
        self._offset = _layout(num_slots)
        self.slot_shape = slot_shape
        self.slot_bytes = int(np.prod(slot_shape))

    def take_out(self, slot: int) -> np.ndarray:
        """The slot's pixels, copied; the slot is the API process's again once this returns."""
        start = self._offset + slot * self.slot_bytes
        pixels = np.ndarray(self.slot_shape, np.uint8, self._memory, start).copy()
        self._states[slot] = -time.perf_counter_ns()
        return pixels

    def close(self) -> None:
        self._states = None  # type: ignore[assignment]
        self._memory.close()
