"""After ready, a batch shape the warm-up did not run is reported (once); warmed shapes never are."""

from __future__ import annotations

import numpy as np

from router.lanes import LaneSettings
from router.request import InferenceRequest, Route
from router.runner import BatchRunner


def _fusion(i: int, num_tokens: int, num_images: int, size_px: int) -> InferenceRequest:
    ids = (2, *range(10, 10 + num_tokens - 2), 3)
    images = tuple(np.full((size_px, size_px, 3), 10 * i + k, np.uint8) for k in range(num_images))
    return InferenceRequest(request_id=f"r{i}", token_ids=ids, images=images, deadline_ns=10**18)


def test_every_warmed_bucket_runs_cold_free_and_an_unwarmed_one_is_reported_once(tiny_bundle):
    cold: list[tuple] = []
    lanes = {route: LaneSettings(max_batch_size=4) for route in Route}
    runner = BatchRunner(tiny_bundle, lanes, max_images_per_request=2, on_cold_shape=cold.append)
    runner.warm_up()
    runner.mark_ready()
    size_px = tiny_bundle.config.preprocess.input_size
    for bucket in runner.text_buckets:
        for num_requests in (1, 3, 4):
            for num_images in (1, 2):
                batch = [_fusion(i, bucket, num_images, size_px) for i in range(num_requests)]
                runner.run_batch(Route.FUSION, batch)
    assert cold == []

    # A lane whose warm-up was skipped: its first batch after ready is cold, and said once.
    unwarmed = BatchRunner(tiny_bundle, lanes, on_cold_shape=cold.append)
    unwarmed.mark_ready()
    unwarmed.run_batch(Route.TEXT, [InferenceRequest("t", token_ids=(2, 5, 3), deadline_ns=10**18)])
    unwarmed.run_batch(Route.TEXT, [InferenceRequest("u", token_ids=(2, 6, 3), deadline_ns=10**18)])
    assert cold == [("text", 1, runner.text_buckets[0])]


def test_under_a_runtime_that_compiles_nothing_per_shape_warm_up_runs_the_ends_and_times_vision_once(
        tiny_bundle, monkeypatch):
    """ONNX Runtime (router.shape_free_warm_up): the image lanes' smallest and largest batch run once, timed, and
    those timings are the vision service times (the largest batch is not run again); fusion's include them; every
    shape of the lanes counts as warm, so no batch after ready is cold."""
    from models.loading.repository import with_runtime
    from router import shape_free_warm_up

    # Whether the largest batch is timed depends on the smallest's time (tests/unit/router/test_shape_free_timing.py);
    # in a loaded parallel run a cold first image once took over 2 s / 8, and batch 8 was left untimed.
    monkeypatch.setattr(shape_free_warm_up, "TIMED_BATCH_BUDGET_S", 600.0)
    bundle = with_runtime(tiny_bundle, "onnxruntime")
    image_batches: list[int] = []
    encode_images = bundle.model.encode_images
    monkeypatch.setattr(bundle.model, "encode_images",
                        lambda pixels: image_batches.append(len(pixels)) or encode_images(pixels))
    cold: list[tuple] = []
    lanes = {route: LaneSettings(max_batch_size=8) for route in Route}
    runner = BatchRunner(bundle, lanes, max_images_per_request=2, on_cold_shape=cold.append)
    runner.warm_up()
    observed: dict[tuple[Route, int], int] = {}
    runner.measure_service_times(lambda lane, size, ns: observed.setdefault((lane, size), ns))
    assert image_batches.count(8) == 1, image_batches  # timed at warm-up, never run again to measure
    assert not [size for size in image_batches if 1 < size < 8], "the sizes between are interpolated"
    assert set(observed) == {(lane, size) for lane in Route for size in (1, 8)}
    assert all(observed[(Route.FUSION, size)] > observed[(Route.VISION, size)] for size in (1, 8))
    runner.mark_ready()
    size_px = bundle.config.preprocess.input_size
    for bucket in runner.text_buckets:
        for num_requests in (1, 3, 5, 8):
            runner.run_batch(Route.FUSION, [_fusion(i, bucket, 2, size_px) for i in range(num_requests)])
            runner.run_batch(Route.VISION, [_fusion(i, bucket, 1, size_px) for i in range(num_requests)])
    assert cold == []
