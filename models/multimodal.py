"""The whole model: vision encoder, text encoder and the cross-modal layer.

Tensors in, tensors out, one item per list entry: the router batches, the
cache stores per-item segments, and this module only computes. Segments stay
on the model's device.

    encode_images: (B, S, S, 3) uint8           -> [ImageSegment] * B
    encode_texts:  B token-id sequences         -> [TextSegment]  * B
    fuse:          [ImageSegment], [TextSegment] -> [FusedOutput] * B     one image per text
    fuse_multi:  [[ImageSegment]], [TextSegment] -> [FusedOutput] * B     any number of images per text

A segment's ``pooled`` is the embedding the server answers with, float32
whatever the model's dtype: the tower's own, L2-normalised when ``normalize_embeddings`` is set (the convention of the
pretrained families). ``fuse`` gives the fusion head's outputs and, for models
that have one, the model's own calibrated score (``models.scores``).

A text with several images gets one ``FusedOutput``: its tokens attend over
all its images' tokens at once, the fusion head compares the fused embedding
with the mean of the images' embeddings, and the calibrated ``score`` is the
best of the images' scores -- does the text describe any of its images (a
mean would let unrelated images dilute a match) -- with every image's own
score kept in ``image_scores``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.loading.config import ModelConfig
from models.fusion import LowRankCrossAttention
from models.cuda_graphs import CapturedForward, GraphBackend
from models.device import KeepsWeightsPlacement
from models.device_telemetry import DeviceClock
from models.graphs import TraceOutcome
from models.scores import CalibratedScore
from models.text import TextEncoder
from models.vision import UInt8VisionEncoder


@dataclass(frozen=True)
class ImageSegment:
    """What one image contributes: its embedding and its fusion keys/values."""

    pooled: torch.Tensor  # (d_v,)
    k: torch.Tensor  # (Lv, r)
    v: torch.Tensor  # (Lv, d_v)

    @property
    def num_tokens(self) -> int:
        return int(self.k.shape[0])

    @property
    def size_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.pooled, self.k, self.v))

    def compact(self) -> "ImageSegment":
        """A copy owning just its own bytes.

        The encoder's outputs are rows of batch tensors; a row kept as a view
        would keep the whole batch's storage alive, and ``size_bytes`` would
        undercount what is held.
        """
        return ImageSegment(pooled=self.pooled.clone(), k=self.k.clone(), v=self.v.clone())


@dataclass(frozen=True)
class TextSegment:
    """What one text contributes: its embedding and its fusion queries."""

    pooled: torch.Tensor  # (d_t,)
    q: torch.Tensor  # (Lt, r), real tokens only

    @property
    def num_tokens(self) -> int:
        return int(self.q.shape[0])

    @property
    def size_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.pooled, self.q))

    def compact(self) -> "TextSegment":
        """A copy owning just its own bytes (see ``ImageSegment.compact``)."""
        return TextSegment(pooled=self.pooled.clone(), q=self.q.clone())


@dataclass(frozen=True)
class FusedOutput:
    """One text fused with all of its images (K >= 0 of them)."""

    fused: torch.Tensor  # (E_t,)
    match_score: torch.Tensor  # (), the fusion head's; meaningful only once trained
    # (), the model's calibrated score: the max of image_scores; None when it has none or K = 0
    score: torch.Tensor | None
    # (K,), the model's calibrated score of the text with each image, in order; None when it has none
    image_scores: torch.Tensor | None = None


class MultimodalModel(KeepsWeightsPlacement):
    """Vision + text encoders and the low-rank cross-modal attention."""

    def __init__(self, config: ModelConfig, vision: UInt8VisionEncoder, text: TextEncoder, *,
                 score: CalibratedScore | None = None, normalize_embeddings: bool = False) -> None:
        super().__init__()
        self.config = config
        self.vision = vision
        self.text = text
        self.score = score
        self.normalize_embeddings = normalize_embeddings
        self.device_clock: DeviceClock | None = None  # CUDA: each batch's device time (models.device_telemetry)
        self.fusion = LowRankCrossAttention(
            text_dim=text.hidden_size,
            image_dim=vision.embed_dim,
            rank=config.fusion.rank,
            backend=config.fusion.backend,
            text_embedding_dim=text.embedding_dim,
            image_embedding_dim=vision.embedding_dim,
        )

    @property
    def max_intra_op_threads(self) -> int | None:
        """The torch threads a call on this model should use at most: the towers' caps (``None``: no cap).

        The fusion head is as small as the text it projects; the towers'
        size decides. The compute thread applies it to itself
        (the router's compute thread applies it to itself). Under ONNX
        Runtime torch only normalises pixels and runs the fusion head, on one
        thread, so its pool never spins on the cores the sessions compute on.
        """
        if self.runtime != "torch":  # the towers run in their own runtime's pool; torch's would spin beside it
            return 1
        caps = [cap for cap in (self.vision.max_intra_op_threads, self.text.max_intra_op_threads)
                if cap is not None]
        return min(caps) if caps else None

    @property
    def runtime(self) -> str:
        """``"onnxruntime"`` when both towers run from ONNX Runtime sessions (``models.onnx``), else ``"torch"``."""
        towers = (self.vision.graph, self.text.graph)
        return "onnxruntime" if all(getattr(graph, "runs_outside_torch", False) for graph in towers) else "torch"

    def _served(self, embedding: torch.Tensor) -> torch.Tensor:
        """(B, E) -> (B, E) float32, L2-normalised if this model serves normalised embeddings.

        float32 whatever the model computes in: the answer's numbers, the
        calibrated score and the cache hold the embedding as computed, not
        rounded again to half precision (it is E numbers; K and V, the bulk
        of a segment, stay in the model's dtype).
        """
        embedding = embedding.float()
        return F.normalize(embedding, dim=-1) if self.normalize_embeddings else embedding

    def _timed(self, stage: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if self.device_clock is None else self.device_clock.measure(stage)

    @property
    def device(self) -> torch.device:
        return self.weights_placement()[0]

    def trace_encoders(self) -> list[TraceOutcome]:
        """Run both encoders as TorchScript graphs where they trace faithfully (``models.graphs``).

        Call it after the model is on its device in its dtype; an encoder
        already traced is left as it is.
        """
        return [encoder.trace_graph() if encoder.graph is None else TraceOutcome(name, encoder.graph)
                for name, encoder in (("vision", self.vision), ("text", self.text))]

    def capture_encoder_graphs(self, backend_for: Callable[[], GraphBackend]) -> list[CapturedForward]:
        """Run both encoders from CUDA graphs, each shape captured when first met (``models.cuda_graphs``).

        ``backend_for`` gives each encoder its own backend (its own memory
        pool). Call it after the model is on its device in its dtype, before
        warm-up: warm-up then captures every bucket shape.
        """
        return [self.vision.capture_graphs(backend_for()), self.text.capture_graphs(backend_for())]

    def seal_encoder_graphs(self) -> None:
        """No more captures: a shape not captured by now runs eager."""
        for encoder in (self.vision, self.text):
            if isinstance(encoder.graph, CapturedForward):
                encoder.graph.seal()

    def drop_encoder_graphs(self) -> None:
        """Run both encoders eager again (after ``trace_encoders``, or from ONNX Runtime sessions)."""
        self.vision.graph = self.text.graph = None

    @torch.inference_mode()
    def encode_images(self, images: torch.Tensor) -> list[ImageSegment]:
        """``images``: (B, S, S, 3) uint8 on any device; moved to the model's."""
        with self._timed("vision"):
            out = self.vision(images.to(self.device, non_blocking=True))
            k, v = self.fusion.project_image(out.tokens)  # (B, Lv, r), (B, Lv, d_v)
            pooled = self._served(out.pooled)  # (B, E_v)
        return [ImageSegment(pooled=pooled[i], k=k[i], v=v[i]) for i in range(images.shape[0])]

    @torch.inference_mode()
    def encode_texts(self, token_ids: Sequence[Sequence[int]], pad_to: int | None = None,
                     pad_token_id: int = 0) -> list[TextSegment]:
        """Right-pad to ``pad_to`` (or the longest), encode, and keep each text's real rows."""
        lengths = [len(ids) for ids in token_ids]
        width = max(lengths) if pad_to is None else pad_to
        if width < max(lengths):
            raise ValueError(f"pad_to={pad_to} is shorter than the longest text ({max(lengths)})")
        # Padded in numpy: a row copied there costs about a microsecond, a torch slice assignment ten.
        padded_ids = np.full((len(token_ids), width), pad_token_id, dtype=np.int64)  # (B, Lt)
        mask = np.zeros((len(token_ids), width), dtype=np.int64)  # (B, Lt)
        for row, ids in enumerate(token_ids):
            padded_ids[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1
        input_ids, attention_mask = torch.from_numpy(padded_ids), torch.from_numpy(mask)  # (B, Lt) int64 each
        with self._timed("text"):
            out = self.text(input_ids.to(self.device), attention_mask.to(self.device))
            q = self.fusion.project_text(out.tokens)  # (B, Lt, r)
            pooled = self._served(out.pooled)  # (B, E_t)
        return [
            TextSegment(pooled=pooled[i], q=q[i, : lengths[i]]) for i in range(len(token_ids))
        ]

    def fuse(self, images: Sequence[ImageSegment], texts: Sequence[TextSegment]) -> list[FusedOutput]:
        """Pair ``images[i]`` with ``texts[i]``: ``fuse_multi`` with one image per text."""
        if len(images) != len(texts):
            raise ValueError(f"{len(images)} image segments but {len(texts)} text segments")
        return self.fuse_multi([[image] for image in images], texts)

    @torch.inference_mode()
    def fuse_multi(self, images: Sequence[Sequence[ImageSegment]],
                   texts: Sequence[TextSegment]) -> list[FusedOutput]:
        """Fuse ``texts[i]`` with all of ``images[i]`` (0 or more); text and image tokens are packed, not padded.

        Text i attends over the concatenated tokens of its images, in order. The
        fusion head's image embedding for it is the mean of its images'
        embeddings; the calibrated ``score`` is the max over its images' scores
        (``image_scores``). A text with no image attends to nothing and its
        head sees a zero image embedding (``models.fusion`` says what that
        gives); its ``score`` is None and its ``image_scores`` empty.
        """
        if len(images) != len(texts):
            raise ValueError(f"{len(images)} image lists but {len(texts)} text segments")
        if not texts:
            return []
        with self._timed("fusion"):
            return self._fuse_multi(images, texts)

    def _fuse_multi(self, images: Sequence[Sequence[ImageSegment]],
                    texts: Sequence[TextSegment]) -> list[FusedOutput]:
        num_images = [len(per_text) for per_text in images]
        segments = [segment for per_text in images for segment in per_text]  # text by text
        q = torch.cat([t.q for t in texts], dim=0)  # (T, r)
        cu_seqlens_q = _cu_seqlens([t.num_tokens for t in texts])  # (B+1,)
        cu_seqlens_k = _cu_seqlens([sum(s.num_tokens for s in per_text) for per_text in images])  # (B+1,)
        text_embeddings = torch.stack([t.pooled for t in texts])  # (B, E_t)
        if segments:
            k = torch.cat([s.k for s in segments])  # (Tk, r)
            v = torch.cat([s.v for s in segments])  # (Tk, d_v)
            image_embeddings = torch.stack([s.pooled for s in segments])  # (N, E_v)
        else:
            k = q.new_empty((0, q.shape[1]))  # (0, r)
            v = q.new_empty((0, self.fusion.v_proj.out_features))  # (0, d_v)
            image_embeddings = text_embeddings.new_empty((0, self.vision.embedding_dim))  # (0, E_v)
        counts = torch.tensor(num_images, device=text_embeddings.device)  # (B,)
        text_of_image = torch.repeat_interleave(torch.arange(len(texts), device=counts.device), counts)  # (N,)
        summed = image_embeddings.new_zeros((len(texts), image_embeddings.shape[1]))  # (B, E_v)
        summed.index_add_(0, text_of_image, image_embeddings)
        mean_image = summed / counts.clamp_min(1).unsqueeze(1).to(summed.dtype)  # (B, E_v), zeros for K = 0
        out = self.fusion(q, cu_seqlens_q.to(q.device), k, v, text_embeddings, mean_image,
                          cu_seqlens_k=cu_seqlens_k.to(q.device))
        image_scores = None
        if self.score is not None:
            every_score = self.score(image_embeddings, text_embeddings[text_of_image])  # (N,)
            image_scores = torch.split(every_score, num_images)  # B x (K,)
        return [
            FusedOutput(
                fused=out.fused[i],
                match_score=out.match_score[i],
                score=None if image_scores is None or num_images[i] == 0 else image_scores[i].max(),
                image_scores=None if image_scores is None else image_scores[i],
            )
            for i in range(len(texts))
        ]


def _cu_seqlens(lengths: Sequence[int]) -> torch.Tensor:
    """Row offsets (B+1,) int32 of items of ``lengths`` rows, packed one after another."""
    cu_seqlens = torch.zeros(len(lengths) + 1, dtype=torch.int32)  # (B+1,)
    cu_seqlens[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), dim=0)
    return cu_seqlens
