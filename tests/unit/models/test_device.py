"""DeviceWork on the CPU: the runner's device calls must be exact no-ops there."""

import numpy as np
import torch

from models.device import DeviceWork


def test_host_tensor_on_cpu_shares_the_array_unpinned() -> None:
    work = DeviceWork(torch.device("cpu"))
    pixels = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    tensor = work.host_tensor(pixels)
    assert not work.is_cuda
    assert not tensor.is_pinned()
    assert tensor.data_ptr() == pixels.ctypes.data  # no copy on the CPU path
    assert torch.equal(tensor, torch.from_numpy(pixels.copy()))


def test_stream_and_wait_leave_cpu_work_on_the_calling_thread() -> None:
    work = DeviceWork(torch.device("cpu"))
    with work.stream(high_priority=True):
        total = torch.ones(8).sum()
        work.wait()
    assert total.item() == 8.0
