"""Runs one batch of one lane through the model; runs only on the compute thread.

Batches are padded to a warmed shape (batch size, and for text a length
bucket) so nothing after start-up meets a shape it has not run. On the CPU
nothing is compiled per shape, so there (unless the encoder replays captured
graphs) a batch runs as the rows it has and a text batch at its longest
text: padding every text to a power-of-two bucket (a 35-token text to 64)
nearly doubled the text tower's work, and padding 5-7 rows to 8 added 14-60 %
to it (under wrk the text lane's batches held 6.7 on average).
The warmed shape still groups texts in the batcher and names the shape for
the checks below. The runner
keeps the shapes its warm-up ran; once ``mark_ready`` is called, a batch
that meets another one reports it through ``on_cold_shape`` (the router
counts it in ``mmserve_cold_compiles_total{kind="shape"}``), so "nothing
compiles after ready" is watched, not assumed. A batch that raises is split
in halves down to single items, so one bad item fails alone and the others
still get their answers.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from models.device import DeviceWork
from models.multimodal import FusedOutput, ImageSegment, TextSegment
from models.text import TextEncoder
from models.vision import UInt8VisionEncoder
from models.loading.repository import ModelBundle
from router import shape_free_warm_up
from router.errors import ItemFailedError
from router.lanes import LaneSettings
from router.request import InferenceRequest, InferenceResult, Route

logger = logging.getLogger(__name__)

Outcome = InferenceResult | Exception


def text_length_buckets(max_tokens: int, smallest: int = 8) -> tuple[int, ...]:
    """Powers of two from ``smallest`` up to ``max_tokens`` (always included)."""
    buckets = []
    size = smallest
    while size < max_tokens:
        buckets.append(size)
        size *= 2
    buckets.append(max_tokens)
    return tuple(buckets)


@dataclass(frozen=True)
class _HostResults:
    """One request's embeddings and scores, back on the host as float32."""

    images: tuple[np.ndarray, ...]  # each (d_v,)
    text: np.ndarray | None  # (d_t,)
    fused: np.ndarray | None  # (E_t,)
    score: np.ndarray | None  # ()
    match_score: np.ndarray | None  # ()


StageHook = Callable[[str, Collection[str | None]], None]
"""Called after a compute stage ran, with its name and the image encodings of the requests it ran for."""


class BatchRunner:
    """Turns a list of same-lane requests into per-item outcomes."""

    def __init__(self, bundle: ModelBundle, lane_settings: dict[Route, LaneSettings],
                 stage_hook: StageHook | None = None,
                 max_images_per_request: int = 1,
                 on_cold_shape: Callable[[tuple], None] | None = None,
                 warmed_shapes: set[tuple] | None = None) -> None:
        """``warmed_shapes``: a set shared with the other executors' runners where they call the same
        sessions (ONNX Runtime: one session per tower for every executor, which plans memory per input
        shape, so a shape one executor ran is warm for all); None: this runner's own."""
        self.bundle = bundle
        self._on_cold_shape = on_cold_shape
        # What warm-up ran (here, or through the same sessions); after ready, anything else is cold.
        self.warmed_shapes: set[tuple] = set() if warmed_shapes is None else warmed_shapes
        # ONNX Runtime compiles nothing per shape: warm-up runs a few shapes, timed (router.shape_free_warm_up).
        self._is_shape_free = bundle.runtime == "onnxruntime"
        self._shape_free_timings = shape_free_warm_up.ShapeFreeTimings()
        self._is_ready = False
        self.max_images_per_request = max_images_per_request  # fusion is warmed for each count up to it
        self.model = bundle.model
        self.lane_settings = lane_settings
        fixed_length = self.model.text.fixed_length  # a tower trained on one padded length sees only it
        self.text_buckets = (fixed_length,) if fixed_length else text_length_buckets(bundle.tokenizer.max_tokens)
        self._serves_match_score = bundle.fusion_head.is_trained
        self.pad_token_id = bundle.tokenizer.pad_token_id
        # Fault drills delay here (StageHook).
        self._stage_hook = stage_hook
        # Streams, pinned copies and waiting are the model side's (models/device.py).
        self.device_work = DeviceWork(self.model.device)
        # Real (unpadded) rows through each encoder since start-up, warm-up excluded.
        self.num_images_encoded = 0
        self.num_texts_encoded = 0

    def limit_compute_threads(self) -> int | None:
        """Cap the calling (compute) thread's torch threads at the model's ``max_intra_op_threads``.

        Call it on the compute thread before its first torch call; returns the
        cap applied (``None``: none). Under OpenMP the count is the calling
        thread's own: threads that already ran torch work keep theirs, but
        torch also keeps the last count as the default of threads that start
        torch work later (decode threads). Only a model whose towers ask for
        a cap (the ``synthetic`` preset) sets one.
        """
        cap = self.model.max_intra_op_threads
        if cap is None or cap >= torch.get_num_threads():
            return None
        torch.set_num_threads(cap)
        return cap

    # -- timing -------------------------------------------------------------

    def _stage_done(self, stage: str, started_ns: int, stage_ns: dict[str, int],
                    requests: Sequence[InferenceRequest]) -> None:
        self.device_work.wait()
        if self._stage_hook is not None:
            self._stage_hook(stage, {r.image_encoding for r in requests})
        stage_ns[stage] = time.perf_counter_ns() - started_ns

    # -- one padded batch -------------------------------------------------------

    def _bucket(self, longest: int) -> int:
        bucket = next((b for b in self.text_buckets if b >= longest), None)
        if bucket is None:
            raise ValueError(f"a text of {longest} tokens is longer than the model's {self.text_buckets[-1]}")
        return bucket

    def _runs_warmed_shapes_only(self, encoder: UInt8VisionEncoder | TextEncoder) -> bool:
        """Whether ``encoder`` must see the shapes warm-up ran: off the CPU, or when it replays captured graphs."""
        return self.model.device.type != "cpu" or encoder.runs_captured_shapes

    def batch_rows(self, encoder: str, num_items: int, settings: LaneSettings) -> int:
        """The rows a batch of ``num_items`` images or texts runs as through ``encoder`` ("vision" or "text").

        The warmed batch size where shapes matter, else the items alone.
        """
        tower = self.model.vision if encoder == "vision" else self.model.text
        return settings.padded_size(num_items) if self._runs_warmed_shapes_only(tower) else num_items

    def _encode_images(self, pixels: Sequence[np.ndarray], settings: LaneSettings, stage_ns: dict[str, int],
                       owners: Sequence[InferenceRequest]) -> list[ImageSegment]:
        """Every image in ``pixels`` through the vision encoder, ``max_batch_size`` at a time, each chunk as
        ``batch_rows`` says.

        The batcher counts images, not requests, against the cap, so one
        chunk is the usual case; a request with more images than the cap
        runs in several. ``owners``: the request of each image.
        """
        started = time.perf_counter_ns()
        segments: list[ImageSegment] = []
        for first in range(0, len(pixels), settings.max_batch_size):
            chunk = np.stack(pixels[first: first + settings.max_batch_size])  # (n, S, S, 3) uint8
            self._check_shape(("vision", settings.padded_size(len(chunk))))
            rows = self.batch_rows("vision", len(chunk), settings)
            if rows > len(chunk):
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], rows - len(chunk), axis=0)])  # (rows, S, S, 3)
            segments += self.model.encode_images(self.device_work.upload(chunk))[: min(len(chunk), len(pixels) - first)]
        self._stage_done("vision", started, stage_ns, owners)
        self.num_images_encoded += len(pixels)
        return segments

    def _encode_texts(self, requests: Sequence[InferenceRequest], settings: LaneSettings,
                      stage_ns: dict[str, int]) -> list[TextSegment]:
        started = time.perf_counter_ns()
        token_ids = [r.token_ids for r in requests]
        token_ids += [token_ids[-1]] * (self.batch_rows("text", len(requests), settings) - len(requests))
        longest = max(len(ids) for ids in token_ids)
        self._check_shape(("text", settings.padded_size(len(requests)), self._bucket(longest)))
        segments = self.model.encode_texts(token_ids, pad_to=self.text_width(longest), pad_token_id=self.pad_token_id)
        self._stage_done("text", started, stage_ns, requests)
        self.num_texts_encoded += len(requests)
        return segments[: len(requests)]

    def _check_shape(self, shape: tuple) -> None:
        """After ready, report a shape warm-up did not run (once per shape)."""
        if self._is_ready and shape not in self.warmed_shapes:
            self.warmed_shapes.add(shape)
            if self._on_cold_shape is not None:
                self._on_cold_shape(shape)

    def mark_ready(self) -> None:
        """Warm-up is over: from now on a shape it did not run is cold."""
        self._is_ready = True

    def length_bucket(self, num_tokens: int) -> int:
        """The warmed length bucket of a text of ``num_tokens`` (the batcher groups texts by it)."""
        return self._bucket(num_tokens)

    def text_width(self, longest: int) -> int:
        """The length a text batch whose longest text has ``longest`` tokens is padded to and runs at."""
        text = self.model.text
        # A new shape costs nothing on the CPU unless it replays captured graphs; fixed-length towers always pad.
        if not self._runs_warmed_shapes_only(text) and not text.fixed_length:
            return longest
        return self._bucket(longest)

    def run_batch(self, lane: Route, requests: Sequence[InferenceRequest]) -> list[InferenceResult]:
        """Compute what each request still needs (segments it lacks, then fusion); raises on failure."""
        settings = self.lane_settings[lane]
        stage_ns: dict[str, int] = {}
        images = [list(r.image_segments) for r in requests]
        texts = [r.text_segment for r in requests]
        to_encode = [(row, index) for row, r in enumerate(requests) for index in r.image_rows_to_encode]
        if to_encode:
            computed = self._encode_images([requests[row].images[index] for row, index in to_encode],
                                           settings, stage_ns, [requests[row] for row, _ in to_encode])
            for (row, index), segment in zip(to_encode, computed):
                images[row][index] = segment
        text_rows = [i for i, r in enumerate(requests) if r.needs_text]
        if text_rows:
            computed = self._encode_texts([requests[i] for i in text_rows], settings, stage_ns)
            for row, segment in zip(text_rows, computed):
                texts[row] = segment
        fusion_rows = [i for i, r in enumerate(requests) if r.route == Route.FUSION]
        fused: dict[int, FusedOutput] = {}
        if fusion_rows:
            self._check_shape(("fusion", self._bucket(max(texts[i].num_tokens for i in fusion_rows))))
            started = time.perf_counter_ns()
            outputs = self.model.fuse_multi([images[i] for i in fusion_rows], [texts[i] for i in fusion_rows])
            fused = dict(zip(fusion_rows, outputs))
            self._stage_done("fusion", started, stage_ns, [requests[i] for i in fusion_rows])
        host = self._results_to_host(images, texts, [fused.get(i) for i in range(len(requests))])
        results = []
        for i, request in enumerate(requests):
            text, fusion = texts[i], fused.get(i)
            embeddings = host[i]
            results.append(InferenceResult(
                route=request.route,
                image_embeddings=embeddings.images,
                text_embedding=embeddings.text,
                fused_embedding=embeddings.fused,
                score=float(embeddings.score) if embeddings.score is not None else None,
                match_score=(float(embeddings.match_score) if fusion is not None and self._serves_match_score
                             else None),
                batch_size=len(requests),
                stage_ns={stage: ns for stage, ns in stage_ns.items()
                          if (stage != "vision" or request.needs_vision) and (stage != "text" or request.needs_text)
                          and (stage != "fusion" or fusion is not None)},
                image_segments=tuple(images[i]),
                text_segment=text,
            ))
        return results

    def _results_to_host(self, images: Sequence[Sequence[ImageSegment]], texts: Sequence[TextSegment | None],
                         fused: Sequence[FusedOutput | None]) -> list[_HostResults]:
        """Every request's embeddings and scores on the host, with one device-to-host copy for the whole batch.

        One copy per tensor would wait on the device once per embedding; the
        batch's tensors go together through ``DeviceWork.to_host`` instead and
        come back in request order.
        """
        tensors: list[torch.Tensor] = []

        def slot(tensor: torch.Tensor | None) -> int | None:
            if tensor is None:
                return None
            tensors.append(tensor)
            return len(tensors) - 1

        slots = [(tuple(slot(image.pooled) for image in images[i]),
                  slot(texts[i].pooled if texts[i] is not None else None),
                  slot(fused[i].fused if fused[i] is not None else None),
                  slot(fused[i].score if fused[i] is not None else None),
                  slot(fused[i].match_score if fused[i] is not None else None))
                 for i in range(len(images))]
        host = self.device_work.to_host(tensors)

        def get(index: int | None) -> np.ndarray | None:
            return None if index is None else host[index]

        return [_HostResults(tuple(host[j] for j in image_slots), get(text), get(fusion), get(score), get(match))
                for image_slots, text, fusion, score, match in slots]

    def run(self, route: Route, requests: Sequence[InferenceRequest]) -> list[Outcome]:
        """Per-item outcomes; a failing batch is split in halves down to single items."""
        try:
            return list(self.run_batch(route, requests))
        except Exception:  # noqa: BLE001 - any model failure is isolated by splitting
            if len(requests) == 1:
                error_id = uuid.uuid4().hex[:16]
                logger.exception("inference failed for request %s (error id %s)",
                                 requests[0].request_id, error_id)
                return [ItemFailedError(error_id)]
            middle = len(requests) // 2
            return self.run(route, requests[:middle]) + self.run(route, requests[middle:])

    # -- start-up -------------------------------------------------------------

    def warm_up(self) -> int:
        """Run every shape the lanes will meet once (under ONNX Runtime a few: ``router.shape_free_warm_up``);
        returns the number of shapes run.

        Vision runs once per batch size, text once per (batch size, length
        bucket), fusion once per (batch size, length bucket, images per
        request) -- the fused kernel's tiles follow the longest text, so each
        bucket is a variant to compile on a GPU; a shape two lanes share runs
        once. The shapes are remembered for the cold-shape check (fusion by
        its bucket, the one thing of its shape that selects a kernel variant).
        """
        if self._is_shape_free:
            return shape_free_warm_up.warm_up(self, self._shape_free_timings)
        input_size = self.bundle.config.preprocess.input_size
        image = torch.zeros((input_size, input_size, 3), dtype=torch.uint8)
        one_image = self.model.encode_images(image[None])  # the shape fusion meets is the segments'
        image_counts = range(1, self.max_images_per_request + 1)
        num_runs = 0
        for route, settings in self.lane_settings.items():
            for size in settings.warm_batch_sizes:
                if route != Route.TEXT and ("vision", size) not in self.warmed_shapes:
                    self.model.encode_images(image.expand(size, -1, -1, -1).contiguous())
                    self.warmed_shapes.add(("vision", size))
                    num_runs += 1
                if route == Route.VISION:
                    continue
                # Text, and fusion (which runs on the text lane too: a fusion request whose images are cached).
                for bucket in self.text_buckets:
                    if ("text", size, bucket) in self.warmed_shapes:
                        continue
                    ids = [(self.pad_token_id,) * bucket] * size
                    texts = self.model.encode_texts(ids, pad_to=bucket, pad_token_id=self.pad_token_id)
                    for num_images in image_counts:
                        self.model.fuse_multi([one_image * num_images] * size, texts)
                    self.warmed_shapes |= {("text", size, bucket), ("fusion", bucket)}
                    num_runs += 1 + len(image_counts)
        return num_runs

    def measure_service_times(self, observe: Callable[[Route, int, int], None]) -> None:
        """Time batches of the smallest, a middle and the largest warmed size per lane.

        Runs after ``warm_up``; the estimator interpolates the sizes between,
        and online updates refine every size. Text is measured at a middle
        length bucket. Under ONNX Runtime: ``router.shape_free_warm_up``.
        """
        if self._is_shape_free:
            shape_free_warm_up.measure_service_times(self, self._shape_free_timings, observe)
            self.num_images_encoded = self.num_texts_encoded = 0
            return
        input_size = self.bundle.config.preprocess.input_size
        image = np.zeros((input_size, input_size, 3), dtype=np.uint8)
        bucket = self.text_buckets[len(self.text_buckets) // 2]
        token_ids = (self.pad_token_id,) * bucket
        for lane, settings in self.lane_settings.items():
            request = InferenceRequest(
                request_id="measure",
                token_ids=None if lane == Route.VISION else token_ids,
                images=() if lane == Route.TEXT else (image,),
                deadline_ns=2**62,
            )
            sizes = settings.warm_batch_sizes
            for size in sorted({sizes[0], sizes[len(sizes) // 2], sizes[-1]}):
                started = time.perf_counter_ns()
                self.run_batch(lane, [request] * size)
                observe(lane, size, time.perf_counter_ns() - started)
        self.num_images_encoded = self.num_texts_encoded = 0
