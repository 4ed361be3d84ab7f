"""Warm-up and service-time measurement where the runtime compiles nothing per shape (ONNX Runtime on the CPU).

TorchScript, CUDA graphs and Triton kernels compile or capture per input
shape, so there ``BatchRunner.warm_up`` runs every batch size and length
bucket once before ready. ONNX Runtime on the CPU runs any shape with the
same kernels (MLAS picks its tiles per call); a new shape costs it a memory
plan, milliseconds. Running every shape there buys nothing but start-up
time, and with the ViT-L/16 preset (about 120 GFLOP an image) the vision
shapes alone were 15 images, and the service-time measurement that
followed 26 more: about two of its three minutes to ready on 2 cores.

So under ONNX Runtime:

    warm-up        each image lane's smallest batch size once, timed, and its largest too when that costs
                   at most ``TIMED_BATCH_BUDGET_S`` in proportion to the smallest's time (the largest then
                   also sizes the memory arena); text at its smallest and largest batch size, at the shortest
                   and longest length bucket, with fusion at each image count; every other shape of the lanes
                   is marked warm (nothing is compiled for it, so a batch meeting it is not cold)
    service times  vision: the warm-up's own timings, not run again; text: timed at its smallest and largest
                   size (cheap); fusion: what a fusion batch runs, in order: its images, its texts, the fusion
                   head, so the vision time plus the text and head timed here; the estimator interpolates
                   the sizes between, extrapolates in proportion past the largest timed, and updates every
                   size online from real batches

Why the budget: where one image takes seconds (ViT-L/16 on 2 cores, about
2 s), the fixed cost of a batch is lost in its compute, so a batch of 8
takes 8 times one image's time, as the estimator extrapolates; timing it
anyway cost 25-30 s of that preset's start-up and told nothing new. Where an
image takes milliseconds (the tiny and test models), the largest batch is
cheap and its fixed costs matter, so it is timed as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from router.request import InferenceRequest, Route

if TYPE_CHECKING:
    from models.multimodal import ImageSegment
    from router.runner import BatchRunner


TIMED_BATCH_BUDGET_S = 2.0


@dataclass
class ShapeFreeTimings:
    """What warm-up leaves for the service-time measurement that follows it, so nothing is run twice:
    the vision timings per batch size, and the one blank image's segment the fusion head is run with."""

    vision_ns: dict[int, int] = field(default_factory=dict)
    one_image: list[ImageSegment] | None = None  # encode_images' answer for one blank image

    def blank_image_segment(self, runner: BatchRunner) -> list[ImageSegment]:
        if self.one_image is None:
            size = runner.bundle.config.preprocess.input_size
            self.one_image = runner.model.encode_images(torch.zeros((1, size, size, 3), dtype=torch.uint8))
        return self.one_image


def time_image_sizes(runner: BatchRunner, sizes: tuple[int, ...], vision_ns: dict[int, int],
                     budget_s: float | None = None) -> list[int]:
    """Time an image lane's smallest batch size, and its largest within ``budget_s`` (the module's docstring).

    A size already in ``vision_ns`` (timed for another lane of these sessions)
    is not run again. Returns the sizes timed, in order.
    """
    budget_s = TIMED_BATCH_BUDGET_S if budget_s is None else budget_s  # read now: a test may set the module's
    smallest, largest = sizes[0], sizes[-1]
    if smallest not in vision_ns:
        vision_ns[smallest] = _time_images(runner, smallest)
    if largest != smallest and largest not in vision_ns \
            and vision_ns[smallest] * largest / smallest <= budget_s * 1e9:
        vision_ns[largest] = _time_images(runner, largest)
    return [size for size in sorted({smallest, largest}) if size in vision_ns]


def _time_images(runner: BatchRunner, size: int) -> int:
    input_size = runner.bundle.config.preprocess.input_size
    images = torch.zeros((size, input_size, input_size, 3), dtype=torch.uint8)  # (B, S, S, 3)
    started = time.perf_counter_ns()
    runner.model.encode_images(images)
    return time.perf_counter_ns() - started


def warm_up(runner: BatchRunner, timings: ShapeFreeTimings) -> int:
    """Run the shapes the module's docstring names, time the vision ones into ``timings``; the runs made."""
    model = runner.model
    one_image = timings.blank_image_segment(runner)  # the first run: the sessions' own warm-up, untimed
    vision_ns = timings.vision_ns
    warmed = runner.warmed_shapes
    num_runs = 0
    for route, settings in runner.lane_settings.items():
        sizes = settings.warm_batch_sizes
        ends = sorted({sizes[0], sizes[-1]})
        if route != Route.TEXT:
            if not all(("vision", size) in warmed for size in ends):
                num_before = len(vision_ns)
                time_image_sizes(runner, sizes, vision_ns)
                num_runs += len(vision_ns) - num_before
            warmed.update(("vision", size) for size in sizes)
        if route == Route.VISION:
            continue
        buckets = runner.text_buckets
        for size in ends:
            for bucket in sorted({buckets[0], buckets[-1]}):
                if ("text", size, bucket) in warmed:
                    continue
                texts = model.encode_texts([(runner.pad_token_id,) * bucket] * size, pad_to=bucket,
                                           pad_token_id=runner.pad_token_id)
                for num_images in range(1, runner.max_images_per_request + 1):
                    model.fuse_multi([one_image * num_images] * size, texts)
                num_runs += 1 + runner.max_images_per_request
        warmed.update(("text", size, bucket) for size in sizes for bucket in buckets)
        warmed.update(("fusion", bucket) for bucket in buckets)
    return num_runs


def measure_service_times(runner: BatchRunner, timings: ShapeFreeTimings,
                          observe: Callable[[Route, int, int], None]) -> None:
    """Each lane's smallest and largest batch, as the module's docstring says; after ``warm_up``."""
    model = runner.model
    bucket = runner.text_buckets[len(runner.text_buckets) // 2]
    token_ids = (runner.pad_token_id,) * bucket
    for lane, settings in runner.lane_settings.items():
        sizes = settings.warm_batch_sizes
        if lane == Route.TEXT:
            for size in sorted({sizes[0], sizes[-1]}):
                request = InferenceRequest(request_id="measure", token_ids=token_ids, images=(), deadline_ns=2**62)
                started = time.perf_counter_ns()
                runner.run_batch(lane, [request] * size)
                observe(lane, size, time.perf_counter_ns() - started)
            continue
        # Warmed by another executor through the same sessions, a size is timed here (within the budget).
        for size in time_image_sizes(runner, sizes, timings.vision_ns):
            images_ns = timings.vision_ns[size]
            if lane == Route.VISION:
                observe(lane, size, images_ns)
                continue
            one_image = timings.blank_image_segment(runner)  # the segment a fusion batch's head meets
            started = time.perf_counter_ns()
            texts = model.encode_texts([token_ids] * size, pad_to=bucket, pad_token_id=runner.pad_token_id)
            model.fuse_multi([one_image] * size, texts)
            observe(lane, size, images_ns + time.perf_counter_ns() - started)
