"""A model whose towers are too small to split runs its compute thread on one torch thread.

The synthetic towers compute a few small operations per batch; over two
intra-op threads each costs an OpenMP hand-off (and a spin at its barrier)
for nothing. The cap is the compute thread's own (OpenMP's count is per
thread): a thread that already ran torch work keeps its count.
"""

from __future__ import annotations

import threading

import pytest
import torch

from models.families.synthetic import MAX_INTRA_OP_THREADS
from models.loading.repository import build_preset
from router.lanes import LaneSettings
from router.request import Route
from router.runner import BatchRunner


def _in_thread(work):
    """``work()``'s result, run on a new thread (the way a compute thread starts)."""
    box = []
    thread = threading.Thread(target=lambda: box.append(work()))
    thread.start()
    thread.join()
    return box[0]


@pytest.fixture(autouse=True)
def new_threads_start_at_this_threads_count():
    """New threads start at this thread's torch count, whatever an earlier test left.

    torch keeps the last count a thread set as the default of threads that
    start torch work later, so a test before these (an in-process server
    on the synthetic preset caps its compute thread at 1) would otherwise
    decide what a fresh thread sees here.
    """
    count = torch.get_num_threads()
    _in_thread(lambda: torch.set_num_threads(count))
    yield
    _in_thread(lambda: torch.set_num_threads(count))


def _runner(bundle) -> BatchRunner:
    return BatchRunner(bundle, {route: LaneSettings(max_batch_size=1) for route in Route})


def test_the_synthetic_compute_thread_uses_one_torch_thread_and_others_keep_theirs(tiny_bundle):
    synthetic = build_preset("synthetic")
    assert synthetic.model.max_intra_op_threads == MAX_INTRA_OP_THREADS == 1
    assert tiny_bundle.model.max_intra_op_threads is None  # a real tower: torch's own count
    before = torch.get_num_threads()  # this thread has run torch work: its count is its own
    runner = _runner(synthetic)
    applied, inside = _in_thread(lambda: (runner.limit_compute_threads(), torch.get_num_threads()))
    if before > 1:
        assert (applied, inside) == (1, 1)
    else:
        assert applied is None  # nothing to cap
    assert torch.get_num_threads() == before


def test_a_model_without_a_cap_leaves_the_compute_thread_at_torchs_count(tiny_bundle):
    before = torch.get_num_threads()
    runner = _runner(tiny_bundle)
    assert _in_thread(lambda: (runner.limit_compute_threads(), torch.get_num_threads())) == (None, before)
