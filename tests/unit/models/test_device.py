"""DeviceWork on the CPU: the runner's device calls must be exact no-ops there."""

import numpy as np
import torch

from models.device import DeviceWork
from models.loading.repository import build_preset


def test_upload_on_cpu_shares_the_array_unpinned() -> None:
    work = DeviceWork(torch.device("cpu"))
    pixels = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    tensor = work.upload(pixels)
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


def test_to_host_gives_float32_rows_in_one_copy() -> None:
    work = DeviceWork(torch.device("cpu"))
    rows = [torch.arange(4, dtype=torch.bfloat16), torch.ones(4, dtype=torch.bfloat16)]
    host = work.to_host(rows)
    assert [a.dtype for a in host] == [np.float32, np.float32]
    np.testing.assert_array_equal(host[0], [0, 1, 2, 3])
    assert work.to_host([]) == []


def test_to_host_keeps_each_shape_across_widths_and_scalars() -> None:
    """A batch mixes image rows (d_v,), text rows (d_t,) and 0-d scores: one copy, each back in its own shape."""
    work = DeviceWork(torch.device("cpu"))
    image_row = torch.arange(6, dtype=torch.bfloat16)
    text_row = torch.arange(3, dtype=torch.float32) + 10
    score = torch.tensor(0.25, dtype=torch.float16)
    host = work.to_host([image_row, text_row, score, image_row])
    assert [a.shape for a in host] == [(6,), (3,), (), (6,)]
    assert all(a.dtype == np.float32 for a in host)
    np.testing.assert_array_equal(host[1], [10, 11, 12])
    assert float(host[2]) == 0.25
    np.testing.assert_array_equal(host[3], np.arange(6))


def test_where_the_weights_live_is_read_once_and_follows_a_cast_or_move_of_the_model() -> None:
    model = build_preset("tiny").model
    assert model.device == torch.device("cpu") and model.vision.parameter_dtype() == torch.float32
    model.half()  # a cast on the parent reaches the towers' own _apply
    assert model.vision.parameter_dtype() == torch.float16 == next(model.vision.parameters()).dtype
    model.to("meta")
    assert model.device == torch.device("meta") == next(model.parameters()).device
