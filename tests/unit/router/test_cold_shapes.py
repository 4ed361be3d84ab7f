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
