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

    warm-up        each image lane's smallest and largest batch size once (the largest sizes the memory
                   arena), timed; text at its smallest and largest batch size, at the shortest and longest
                   length bucket, with fusion at each image count; every other shape of the lanes is
                   marked warm (nothing is compiled for it, so a batch meeting it is not cold)
    service times  vision: the warm-up's own timings, not run again; text: timed at its smallest and largest
                   size (cheap); fusion: what a fusion batch runs, in order: its images, its texts, the fusion
                   head, so the vision time plus the text and head timed here; the estimator interpolates
                   the sizes between and updates every size online from real batches
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from router.request import InferenceRequest, Route

if TYPE_CHECKING:
    from router.runner import BatchRunner


def warm_up(runner: BatchRunner, vision_ns: dict[int, int]) -> int:
    """Run the shapes the module's docstring names, time the vision ones into ``vision_ns``; the runs made."""
    model = runner.model
    input_size = runner.bundle.config.preprocess.input_size
    image = torch.zeros((input_size, input_size, 3), dtype=torch.uint8)
    one_image = model.encode_images(image[None])
    warmed = runner.warmed_shapes
    num_runs = 0
    for route, settings in runner.lane_settings.items():
        sizes = settings.warm_batch_sizes
        ends = sorted({sizes[0], sizes[-1]})
        if route != Route.TEXT:
            for size in ends:
                if ("vision", size) not in warmed:
                    started = time.perf_counter_ns()
                    model.encode_images(image.expand(size, -1, -1, -1).contiguous())
                    vision_ns[size] = time.perf_counter_ns() - started
                    num_runs += 1
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


def measure_service_times(runner: BatchRunner, vision_ns: dict[int, int],
                          observe: Callable[[Route, int, int], None]) -> None:
    """Each lane's smallest and largest batch, as the module's docstring says; after ``warm_up``."""
    model = runner.model
    input_size = runner.bundle.config.preprocess.input_size
    bucket = runner.text_buckets[len(runner.text_buckets) // 2]
    token_ids = (runner.pad_token_id,) * bucket
    one_image = None  # the segment a fusion batch's head meets, encoded once
    for lane, settings in runner.lane_settings.items():
        sizes = settings.warm_batch_sizes
        for size in sorted({sizes[0], sizes[-1]}):
            if lane == Route.TEXT:
                request = InferenceRequest(request_id="measure", token_ids=token_ids, images=(), deadline_ns=2**62)
                started = time.perf_counter_ns()
                runner.run_batch(lane, [request] * size)
                observe(lane, size, time.perf_counter_ns() - started)
                continue
            images_ns = vision_ns.get(size)
            if images_ns is None:  # warmed by another executor through the same session: time it here
                image = np.zeros((size, input_size, input_size, 3), dtype=np.uint8)
                started = time.perf_counter_ns()
                model.encode_images(torch.from_numpy(image))
                images_ns = vision_ns[size] = time.perf_counter_ns() - started
            if lane == Route.VISION:
                observe(lane, size, images_ns)
                continue
            if one_image is None:
                one_image = model.encode_images(torch.zeros((1, input_size, input_size, 3), dtype=torch.uint8))
            started = time.perf_counter_ns()
            texts = model.encode_texts([token_ids] * size, pad_to=bucket, pad_token_id=runner.pad_token_id)
            model.fuse_multi([one_image] * size, texts)
            observe(lane, size, images_ns + time.perf_counter_ns() - started)
