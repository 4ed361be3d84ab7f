"""How a batch's tensors reach the model's device and when its results are ready.

The router decides which batch runs when and on which thread; this module
owns what that means on the device. On CUDA each compute thread runs on a
stream of its own (so a text batch can run beside a vision batch, and a
high-priority stream goes first), host pixels are pinned so their copy is
asynchronous, and "the batch is done" means the thread's own stream has
drained, not the whole device. On the CPU every call is a no-op: work is
done when the call returns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch


class DeviceWork:
    """Streams, pinned memory and waiting, for the calling thread's work on one device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.is_cuda = device.type == "cuda"

    def host_tensor(self, array: np.ndarray) -> torch.Tensor:
        """``array`` as a host tensor the device can copy from asynchronously (pinned on CUDA)."""
        tensor = torch.from_numpy(array)
        return tensor.pin_memory() if self.is_cuda else tensor

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
