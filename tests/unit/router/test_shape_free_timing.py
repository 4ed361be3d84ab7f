"""Under ONNX Runtime, warm-up times an image lane's largest batch only where that is cheap (router.shape_free_warm_up).

The tiny preset's towers run in torch here: ``time_image_sizes`` only calls
``encode_images``, whichever runtime serves it. What it runs is counted by
wrapping the real model.
"""

from __future__ import annotations

from router.lanes import LaneSettings
from router.request import Route
from router.runner import BatchRunner
from router.service_time import ServiceTimeEstimator
from router.shape_free_warm_up import time_image_sizes


class CountingModel:
    """The real model, with the batch sizes ``encode_images`` was called with."""

    def __init__(self, model):
        self._model = model
        self.image_batches: list[int] = []

    def __getattr__(self, name):
        return getattr(self._model, name)

    def encode_images(self, images, **kwargs):
        self.image_batches.append(int(images.shape[0]))
        return self._model.encode_images(images, **kwargs)


def _runner(tiny_bundle) -> BatchRunner:
    runner = BatchRunner(tiny_bundle, {route: LaneSettings(max_batch_size=8) for route in Route})
    runner.model = CountingModel(tiny_bundle.model)
    return runner


def test_a_cheap_largest_batch_is_timed_and_a_costly_one_left_to_the_estimate(tiny_bundle):
    sizes = LaneSettings(max_batch_size=8).warm_batch_sizes  # (1, 2, 4, 8)
    cheap = _runner(tiny_bundle)
    vision_ns: dict[int, int] = {}
    assert time_image_sizes(cheap, sizes, vision_ns, budget_s=60.0) == [1, 8]
    assert cheap.model.image_batches == [1, 8] and set(vision_ns) == {1, 8}

    costly = _runner(tiny_bundle)  # as if one image took longer than the budget allows eight
    vision_ns = {}
    assert time_image_sizes(costly, sizes, vision_ns, budget_s=0.0) == [1]
    assert costly.model.image_batches == [1] and set(vision_ns) == {1}

    estimator = ServiceTimeEstimator()
    estimator.observe(Route.VISION, 1, vision_ns[1])
    assert estimator.estimate_ns(Route.VISION, 8) == 8 * vision_ns[1]  # the untimed size, in proportion


def test_a_size_timed_for_another_lane_is_not_run_again(tiny_bundle):
    runner = _runner(tiny_bundle)
    vision_ns = {1: 123_456, 8: 987_654}
    assert time_image_sizes(runner, (1, 2, 4, 8), vision_ns, budget_s=60.0) == [1, 8]
    assert runner.model.image_batches == [] and vision_ns == {1: 123_456, 8: 987_654}
