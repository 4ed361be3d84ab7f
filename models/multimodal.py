"""The whole model: vision encoder, text encoder and the cross-modal layer.

Tensors in, tensors out, one item per list entry: the router batches, the
cache stores per-item segments, and this module only computes. Segments stay
on the model's device.

    encode_images: (B, S, S, 3) uint8           -> [ImageSegment] * B
    encode_texts:  B token-id sequences         -> [TextSegment]  * B
    fuse:          [ImageSegment], [TextSegment] -> [FusedOutput] * B

A segment's ``pooled`` is the embedding the server answers with: the tower's
own, L2-normalised when ``normalize_embeddings`` is set (the convention of the
pretrained families). ``fuse`` gives the fusion head's outputs and, for models
that have one, the model's own calibrated score (``models.scores``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.config import ModelConfig
from models.fusion import LowRankCrossAttention
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
    fused: torch.Tensor  # (E_t,)
    match_score: torch.Tensor  # (), the fusion head's; meaningful only once trained
    score: torch.Tensor | None  # (), the model's calibrated score; None when it has none


class MultimodalModel(nn.Module):
    """Vision + text encoders and the low-rank cross-modal attention."""

    def __init__(self, config: ModelConfig, vision: UInt8VisionEncoder, text: TextEncoder, *,
                 score: CalibratedScore | None = None, normalize_embeddings: bool = False) -> None:
        super().__init__()
        self.config = config
        self.vision = vision
        self.text = text
        self.score = score
        self.normalize_embeddings = normalize_embeddings
        self.fusion = LowRankCrossAttention(
            text_dim=text.hidden_size,
            image_dim=vision.embed_dim,
            rank=config.fusion.rank,
            backend=config.fusion.backend,
            text_embedding_dim=text.embedding_dim,
            image_embedding_dim=vision.embedding_dim,
        )

    def _served(self, embedding: torch.Tensor) -> torch.Tensor:
        """(B, E) -> (B, E), L2-normalised if this model serves normalised embeddings."""
        return F.normalize(embedding, dim=-1) if self.normalize_embeddings else embedding

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def trace_encoders(self) -> list[TraceOutcome]:
        """Run both encoders as TorchScript graphs where they trace faithfully (``models.graphs``).

        Call it after the model is on its device in its dtype; an encoder
        already traced is left as it is.
        """
        return [encoder.trace_graph() if encoder.graph is None else TraceOutcome(name, encoder.graph)
                for name, encoder in (("vision", self.vision), ("text", self.text))]

    def drop_encoder_graphs(self) -> None:
        """Run both encoders eager again (after ``trace_encoders``)."""
        self.vision.graph = self.text.graph = None

    @torch.inference_mode()
    def encode_images(self, images: torch.Tensor) -> list[ImageSegment]:
        """``images``: (B, S, S, 3) uint8 on any device; moved to the model's."""
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
        input_ids = torch.full((len(token_ids), width), pad_token_id, dtype=torch.long)  # (B, Lt)
        attention_mask = torch.zeros((len(token_ids), width), dtype=torch.long)  # (B, Lt)
        for row, ids in enumerate(token_ids):
            input_ids[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            attention_mask[row, : len(ids)] = 1
        out = self.text(input_ids.to(self.device), attention_mask.to(self.device))
        q = self.fusion.project_text(out.tokens)  # (B, Lt, r)
        pooled = self._served(out.pooled)  # (B, E_t)
        return [
            TextSegment(pooled=pooled[i], q=q[i, : lengths[i]]) for i in range(len(token_ids))
        ]

    @torch.inference_mode()
    def fuse(self, images: Sequence[ImageSegment], texts: Sequence[TextSegment]) -> list[FusedOutput]:
        """Pair ``images[i]`` with ``texts[i]``; text is packed, not padded."""
        if len(images) != len(texts):
            raise ValueError(f"{len(images)} image segments but {len(texts)} text segments")
        q = torch.cat([t.q for t in texts], dim=0)  # (T, r)
        lengths = torch.tensor([t.num_tokens for t in texts], dtype=torch.int32)
        cu_seqlens_q = torch.zeros(len(texts) + 1, dtype=torch.int32)  # (B+1,)
        cu_seqlens_q[1:] = torch.cumsum(lengths, dim=0)
        k = torch.stack([s.k for s in images])  # (B, Lv, r)
        v = torch.stack([s.v for s in images])  # (B, Lv, d_v)
        text_embeddings = torch.stack([t.pooled for t in texts])  # (B, E_t)
        image_embeddings = torch.stack([s.pooled for s in images])  # (B, E_v)
        out = self.fusion(q, cu_seqlens_q.to(q.device), k, v, text_embeddings, image_embeddings)
        score = None if self.score is None else self.score(image_embeddings, text_embeddings)  # (B,)
        return [FusedOutput(fused=out.fused[i], match_score=out.match_score[i],
                            score=None if score is None else score[i]) for i in range(len(texts))]
