"""How a batch's tensors reach the model's device and when its results are ready.

The router decides which batch runs when and on which thread; this module
owns what that means on the device. On CUDA each compute thread runs on a
stream of its own (so a text batch can run beside a vision batch, and a
high-priority stream goes first), and "the batch is done" means the thread's
own stream has drained, not the whole device. On the CPU every call is a
no-op: work is done when the call returns.

Image batches go up as uint8, already at the model's input size (resized on
the host as the reference processor resizes), through pinned staging
buffers and a copy stream of their own:

    numpy (B, S, S, 3) uint8 ──memcpy──> pinned slot i ──H2D, copy stream──> device (B, S, S, 3) uint8
                                          (2 slots, reused)       │ event
                                                                  v
                                        compute stream waits on the event, then normalises on the
                                        device (kernels.preprocess_uint8: rescale, mean, std)

Pinning a fresh tensor per batch (``Tensor.pin_memory``) costs a
``cudaHostAlloc`` each time, which is slower than the copy it enables; two
slots that grow to the largest batch are allocated during warm-up and reused.
A slot is refilled only after its previous copy has finished (its event), so
the host never overwrites bytes still in flight, and the compute stream never
waits on the host: the copy of batch n+1 overlaps the compute of batch n.
``to_host`` brings a batch's results back in one copy.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import torch

NUM_STAGING_SLOTS = 2


class PinnedStaging:
    """Reused pinned host buffers and a copy stream: host uint8 arrays -> device tensors without a stall."""

    def __init__(self, device: torch.device, num_slots: int = NUM_STAGING_SLOTS) -> None:
        self.device = device
        self._copy_stream = torch.cuda.Stream(device)
        self._slots: list[torch.Tensor | None] = [None] * num_slots  # pinned uint8, grown on demand
        self._copied: list[torch.cuda.Event | None] = [None] * num_slots
        self._next = 0
        self._lock = threading.Lock()
        self.num_allocations = 0  # pinned allocations so far: they stop once the largest batch has been seen

    def upload(self, array: np.ndarray) -> torch.Tensor:
        """``array`` (uint8) on the device; the calling thread's current stream waits for the copy."""
        with self._lock:
            index = self._next
            self._next = (index + 1) % len(self._slots)
            if self._copied[index] is not None:
                self._copied[index].synchronize()  # the slot's last copy is done (long since, in steady state)
            slot = self._slots[index]
            if slot is None or slot.numel() < array.nbytes:
                slot = torch.empty(array.nbytes, dtype=torch.uint8, pin_memory=True)
                self._slots[index] = slot
                self.num_allocations += 1
            staged = slot[: array.nbytes]
            staged.numpy()[:] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            compute = torch.cuda.current_stream(self.device)
            out = torch.empty(array.shape, dtype=torch.uint8, device=self.device)  # compute stream's allocation
            self._copy_stream.wait_stream(compute)  # ``out`` may reuse memory the compute stream just freed
            with torch.cuda.stream(self._copy_stream):
                out.view(-1).copy_(staged, non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(self._copy_stream)
            self._copied[index] = copied
            out.record_stream(self._copy_stream)
            compute.wait_event(copied)
            return out


class DeviceWork:
    """Streams, staging and waiting, for the calling thread's work on one device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.is_cuda = device.type == "cuda"
        self._staging: PinnedStaging | None = None

    def upload(self, array: np.ndarray) -> torch.Tensor:
        """A uint8 batch as a tensor the model takes without a stall.

        On CUDA it goes through the pinned staging slots on the copy stream
        (``PinnedStaging.upload``); on the CPU it is the array's own memory
        (no copy).
        """
        if not self.is_cuda:
            return torch.from_numpy(array)
        if self._staging is None:
            self._staging = PinnedStaging(self.device)
        return self._staging.upload(array)

    def to_host(self, tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
        """A batch's results (embeddings of any width, scalar scores) as float32 numpy arrays, in one copy.

        Every tensor is flattened and laid end to end on the device, so the
        whole batch crosses the bus in one device-to-host copy (one wait)
        instead of one per embedding; each array keeps its tensor's shape:

            [(d_v,), (d_t,), ()] ──cat──> (d_v + d_t + 1,) float32 ──one D2H──> split ──> (d_v,), (d_t,), ()
        """
        if not tensors:
            return []
        # (sum of numel,) float32 on the device
        flat = torch.cat([t.detach().reshape(-1).to(self.device, torch.float32) for t in tensors])
        host = flat.cpu().numpy()
        arrays, first = [], 0
        for tensor in tensors:
            arrays.append(host[first: first + tensor.numel()].reshape(tuple(tensor.shape)))
            first += tensor.numel()
        return arrays

    def wait(self) -> None:
        """Wait for the work this thread queued on the device (its stream only, not the others')."""
        if self.is_cuda:
            torch.cuda.current_stream(self.device).synchronize()

    @contextlib.contextmanager
    def stream(self, high_priority: bool = False) -> Iterator[None]:
        """Run the calling thread's work on a stream of its own (CUDA; nothing on CPU).

        Two threads on the default stream would serialise on the device
        exactly as one thread does; their own streams let them overlap.
        """
        if not self.is_cuda:
            yield
            return
        stream = torch.cuda.Stream(self.device, priority=-1 if high_priority else 0)
        with torch.cuda.stream(stream):
            yield


class KeepsWeightsPlacement(torch.nn.Module):
    """An ``nn.Module`` that reads where its weights live (device, dtype) once.

    ``parameters()`` walks the module tree, and every batch asks; the answer
    changes only when the module is moved or cast (``to``, ``cuda``,
    ``half``: all through ``_apply``, which forgets it, here or on a parent).
    """

    def weights_placement(self) -> tuple[torch.device, torch.dtype]:
        placement = self.__dict__.get("_weights_placement")
        if placement is None:
            weight = next(self.parameters())
            placement = self.__dict__["_weights_placement"] = (weight.device, weight.dtype)
        return placement

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202 - nn.Module's own signature
        self.__dict__.pop("_weights_placement", None)
        return super()._apply(fn, recurse)
