"""The CUDA-graph bookkeeping, on the CPU: which shapes are captured and when, static buffers, sealing.

``RerunBackend`` keeps a graph's contract (inputs copied into the buffers it
was captured with, outputs overwritten by the next replay) without CUDA, so
everything here but the capture itself runs as it does on a GPU. The GPU
script (``benchmarks/gpu``) measures the real capture.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from models.cuda_graphs import CapturedForward, RerunBackend, shape_key
from models.loading.repository import build_preset
from router.lanes import LaneSettings
from router.request import InferenceRequest, Route
from router.runner import BatchRunner


def _double(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x * 2, x.sum(dim=-1)


def _random_like(inputs):
    return tuple(torch.randn_like(t) for t in inputs)


def test_a_shape_is_captured_once_on_synthetic_inputs_and_replayed_with_the_callers():
    backend = RerunBackend()
    captured = CapturedForward("toy", _double, _random_like, backend)
    first = torch.arange(6.0).reshape(2, 3)
    out = captured(first)
    torch.testing.assert_close(out[0], first * 2)
    graph = captured._graphs[shape_key((first,))]
    assert graph.static_inputs[0] is not first  # captured on its own buffer, refilled per call
    second = torch.ones(2, 3)
    again = captured(second)
    torch.testing.assert_close(again[0], second * 2)
    torch.testing.assert_close(out[0], first * 2)  # a returned output is a copy: the replay did not overwrite it
    assert backend.num_captures == 1
    captured(torch.ones(4, 3))
    assert backend.num_captures == 2 and len(captured.captured_shapes) == 2


def test_after_seal_a_new_shape_runs_eager_and_is_counted():
    backend = RerunBackend()
    captured = CapturedForward("toy", _double, _random_like, backend)
    captured(torch.ones(1, 3))
    captured.seal()
    out = captured(torch.ones(5, 3))
    torch.testing.assert_close(out[1], torch.full((5,), 3.0))
    assert backend.num_captures == 1 and captured.num_eager_calls_after_seal == 1
    captured(torch.ones(1, 3))  # a captured shape still replays
    assert captured.num_eager_calls_after_seal == 1


def test_a_forward_that_cannot_be_captured_runs_eager_for_that_shape_and_says_why():
    class FailingCapture(RerunBackend):
        def capture(self, forward, static_inputs):
            raise RuntimeError("operation not permitted when stream is capturing")

    captured = CapturedForward("toy", _double, _random_like, FailingCapture())
    out = captured(torch.ones(2, 3))
    torch.testing.assert_close(out[0], torch.full((2, 3), 2.0))
    assert captured.captured_shapes == []
    assert "operation not permitted" in captured.reasons[shape_key((torch.ones(2, 3),))]


def test_a_replay_that_disagrees_with_eager_is_not_kept():
    counter = itertools.count(1)

    def stateful(x: torch.Tensor) -> tuple[torch.Tensor]:  # not a function of its inputs: no graph can replay it
        return (x * next(counter),)

    captured = CapturedForward("toy", stateful, _random_like, RerunBackend())
    captured(torch.ones(2, 2))
    assert captured.captured_shapes == []
    assert "disagrees with eager" in next(iter(captured.reasons.values()))


def test_the_text_example_holds_padding_so_the_masked_path_is_captured():
    bundle = build_preset("tiny")
    captured = bundle.model.text.capture_graphs(RerunBackend())
    ids = torch.full((3, 8), 5, dtype=torch.long)
    mask = torch.ones(3, 8, dtype=torch.long)
    captured(ids, mask)
    (graph,) = [g for g in captured._graphs.values() if g is not None]
    static_mask = graph.static_inputs[1]
    assert static_mask.dtype == torch.long
    # What it was captured on was padded; it has since been refilled with the caller's all-ones mask.
    assert torch.equal(static_mask, mask)
    example_ids, example_mask = captured._example_inputs((ids, mask))
    assert example_mask[0].all() and not example_mask[1:].all() and int(example_mask[1].sum()) == 4
    single = captured._example_inputs((ids[:1], mask[:1]))[1]
    assert int(single.sum()) == 7  # one text: padded by one token
    bundle.model.drop_encoder_graphs()


def test_warm_up_captures_every_bucket_shape_and_serving_then_captures_nothing():
    bundle = build_preset("tiny")
    backends: list[RerunBackend] = []

    def backend() -> RerunBackend:
        backends.append(RerunBackend())
        return backends[-1]

    vision, text = bundle.model.capture_encoder_graphs(backend)
    lanes = {route: LaneSettings(max_batch_size=4) for route in Route}  # GPU-style: batches padded to 1, 2, 4
    runner = BatchRunner(bundle, lanes, max_images_per_request=2)
    runner.warm_up()
    batch_sizes = lanes[Route.TEXT].warm_batch_sizes
    assert sorted(key[0][0][0] for key in vision.captured_shapes) == sorted(batch_sizes)
    assert sorted(key[0][0] for key in text.captured_shapes) == sorted(
        (size, bucket) for size in batch_sizes for bucket in runner.text_buckets)
    captures_at_ready = [b.num_captures for b in backends]
    bundle.model.seal_encoder_graphs()
    runner.mark_ready()
    size_px = bundle.config.preprocess.input_size
    for num_requests in (1, 3):
        images = tuple(np.full((size_px, size_px, 3), 7, np.uint8) for _ in range(2))
        batch = [InferenceRequest(f"r{i}", token_ids=(2, 9, 10, 3), images=images, deadline_ns=10**18)
                 for i in range(num_requests)]
        results = runner.run_batch(Route.FUSION, batch)
        assert all(r.fused_embedding is not None for r in results)
    assert [b.num_captures for b in backends] == captures_at_ready
    assert vision.num_eager_calls_after_seal == text.num_eager_calls_after_seal == 0
    bundle.model.drop_encoder_graphs()

