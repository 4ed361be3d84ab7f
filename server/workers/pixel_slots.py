"""Decoded pixels on their way to the engine: fixed-size slots in one shared-memory block per API process.

An API process decodes each image the engine does not already hold into the
model's (S, S, 3) uint8 input, writes it into a free slot, and sends only the
slot's index; the engine copies the pixels out when the call arrives, so the
slot is free again as soon as the engine answers the call. Every slot holds
exactly one model input, so no image can outgrow its slot (the number of
images is bounded before, by ``MMSERVE_MAX_IMAGES_PER_REQUEST``). When every
slot is taken the request is refused like a full decode queue: 503
``overloaded`` with ``Retry-After``.
"""

from __future__ import annotations

import threading
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from server.errors import ApiError

DEFAULT_NUM_SLOTS = 256


class PixelSlots:
    """The API process's side: owns the block, hands out and takes back slots (thread-safe)."""

    def __init__(self, slot_shape: tuple[int, int, int], num_slots: int = DEFAULT_NUM_SLOTS) -> None:
        self.slot_shape = slot_shape
        self.slot_bytes = int(np.prod(slot_shape))
        self.num_slots = num_slots
        self._memory = shared_memory.SharedMemory(create=True, size=self.slot_bytes * num_slots)
        self._free = list(range(num_slots))
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._memory.name

    def take(self, count: int) -> list[int]:
        """``count`` free slots; 503 ``overloaded`` when fewer are free."""
        with self._lock:
            if count > len(self._free):
                raise ApiError(503, "overloaded", f"all {self.num_slots} shared-memory pixel slots of this API "
                                                  "process are in use", retry_after_s=1.0)
            taken, self._free = self._free[:count], self._free[count:]
        return taken

    def give_back(self, slots: list[int]) -> None:
        with self._lock:
            self._free.extend(slots)

    def write(self, slot: int, pixels: np.ndarray) -> None:
        if pixels.shape != self.slot_shape or pixels.dtype != np.uint8:
            raise ValueError(f"a slot holds {self.slot_shape} uint8 pixels, got {pixels.dtype} {pixels.shape}")
        self.view(slot)[...] = pixels

    def view(self, slot: int) -> np.ndarray:
        start = slot * self.slot_bytes
        return np.ndarray(self.slot_shape, np.uint8, self._memory.buf[start:start + self.slot_bytes])

    def close(self) -> None:
        self._memory.close()
        self._memory.unlink()


class AttachedSlots:
    """The engine's side of one API process's block: copies pixels out of a slot."""

    def __init__(self, name: str, slot_shape: tuple[int, int, int]) -> None:
        # Attaching registers the block with this process's resource tracker, which would unlink it
        # at exit although the API process owns it: unregister (the owner unlinks).
        self._memory = shared_memory.SharedMemory(name=name)
        resource_tracker.unregister(self._memory._name, "shared_memory")  # type: ignore[attr-defined]
        self.slot_shape = slot_shape
        self.slot_bytes = int(np.prod(slot_shape))

    def copy_out(self, slot: int) -> np.ndarray:
        start = slot * self.slot_bytes
        return np.ndarray(self.slot_shape, np.uint8, self._memory.buf[start:start + self.slot_bytes]).copy()

    def close(self) -> None:
        self._memory.close()
