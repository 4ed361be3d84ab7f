"""Low-rank cross-modal attention: text tokens attend over image tokens.

    Q = text_tokens  @ Wq   (d_t -> r)      packed over the batch, no padding
    K = image_tokens @ Wk   (d_v -> r)      packed over the batch: all of an item's images
    V = image_tokens @ Wv   (d_v -> d_v)
    A = softmax(Q K^T / sqrt(r)) V          per item, only its own text rows and image tokens
    fused = LayerNorm(mean_t(A) @ Wo + text_embedding)       (B, E_t)
    score = cos(fused, image_embedding @ Wi)                 (B,)
    match_score = sigmoid(match_logit_scale * score + match_logit_bias)

An item with several images attends over the concatenation of their tokens,
and its ``image_embedding`` is whatever the caller passes for the item
(``MultimodalModel`` passes the mean of the images' embeddings). An item with
no image tokens attends to nothing: A is 0, so fused = LayerNorm(b_o +
text_embedding); with a zero image embedding its score is 0 (cosine with the
zero vector) and its match_score sigmoid(match_logit_bias).

Token widths (d_t, d_v) and embedding widths (E_t, E_v) are equal for the
presets; a pretrained tower's embedding is often a projection of another
width (CLIP). ``match_score`` is a probability that the text describes the
image once the head is trained (``mmserve train-fusion``); an untrained head's
numbers mean nothing, and the server says so instead of serving them.

The attention itself is ``kernels.lowrank_cross_attention``: a fused,
variable-length Triton kernel on CUDA and its torch reference on CPU, chosen by
``backend`` fixed at construction (like timm's ``fused_attn`` flag). Both give
the same result; tests flip the flag and compare.

In half precision (``--dtype bfloat16|float16``) the projections and the
attention run in the head's dtype with float32 accumulation (the kernel's
accumulators, cuBLAS's); the per-item mean, the cosine and the match
probability are computed in float32.

The three projections are split so each modality's part can be computed (and
cached) on its own: an image segment is (pooled, K, V), a text segment is
(pooled, Q, length), and ``forward`` only combines them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kernels import Backend, lowrank_cross_attention

BACKENDS: tuple[str, ...] = tuple(backend.value for backend in Backend)


@dataclass(frozen=True)
class FusionOutput:
    fused: torch.Tensor  # (B, d_t)
    score: torch.Tensor  # (B,)
    match_score: torch.Tensor  # (B,)


class LowRankCrossAttention(nn.Module):
    """Cross-modal attention of rank ``rank`` plus a pooled fusion head."""

    def __init__(self, text_dim: int, image_dim: int, rank: int = 16, backend: str = "auto", *,
                 text_embedding_dim: int | None = None, image_embedding_dim: int | None = None) -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        text_embedding_dim = text_dim if text_embedding_dim is None else text_embedding_dim
        image_embedding_dim = image_dim if image_embedding_dim is None else image_embedding_dim
        self.rank = rank
        self.backend = backend
        self.q_proj = nn.Linear(text_dim, rank, bias=False)
        self.k_proj = nn.Linear(image_dim, rank, bias=False)
        self.v_proj = nn.Linear(image_dim, image_dim, bias=False)
        self.out_proj = nn.Linear(image_dim, text_embedding_dim)
        self.norm = nn.LayerNorm(text_embedding_dim)
        self.image_proj = nn.Linear(image_embedding_dim, text_embedding_dim, bias=False)
        self.match_logit_scale = nn.Parameter(torch.tensor(10.0))
        self.match_logit_bias = nn.Parameter(torch.tensor(0.0))

    def project_text(self, text_tokens: torch.Tensor) -> torch.Tensor:
        """Packed text tokens (T, d_t) -> queries (T, r)."""
        return self.q_proj(text_tokens)

    def project_image(self, image_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Image tokens (..., Lv, d_v) -> keys (..., Lv, r) and values (..., Lv, d_v)."""
        return self.k_proj(image_tokens), self.v_proj(image_tokens)

    def forward(
        self,
        q: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        text_pooled: torch.Tensor,
        image_pooled: torch.Tensor,
        *,
        cu_seqlens_k: torch.Tensor | None = None,
    ) -> FusionOutput:
        """q (T, r) packed with offsets ``cu_seqlens_q`` (B+1,) int32; text_pooled (B, E_t); image_pooled (B, E_v).

        Keys and values packed with ``cu_seqlens_k`` (B+1,) int32: k (Tk, r), v (Tk, d_v), item b's
        rows ``cu_seqlens_k[b]:cu_seqlens_k[b+1]`` (all its images' tokens, maybe none); without
        it, dense k (B, Lv, r), v (B, Lv, d_v).
        """
        attended = lowrank_cross_attention(
            q, cu_seqlens_q, k, v, cu_seqlens_k=cu_seqlens_k, backend=self.backend
        )  # (T, d_v)
        head_dtype = self.out_proj.weight.dtype
        lengths = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).to(torch.long)  # (B,)
        item_of_row = torch.repeat_interleave(
            torch.arange(lengths.numel(), device=q.device), lengths
        )  # (T,)
        # The mean over each item's rows is summed in float32 whatever the head's dtype (bf16 sums of
        # hundreds of rows lose the low bits), then rounded back for the projection.
        summed = attended.new_zeros(lengths.numel(), attended.shape[1], dtype=torch.float32)  # (B, d_v)
        summed.index_add_(0, item_of_row, attended.float())
        pooled = (summed / lengths.clamp_min(1).unsqueeze(1).to(summed.dtype)).to(head_dtype)  # (B, d_v)
        fused = self.norm(self.out_proj(pooled) + text_pooled.to(head_dtype))  # (B, d_t)
        # The score and the calibrated match probability in float32: a bf16 sigmoid moves in steps of 0.004.
        image_side = self.image_proj(image_pooled.to(head_dtype)).float()  # (B, d_t)
        score = F.cosine_similarity(fused.float(), image_side, dim=-1)  # (B,)
        match_score = torch.sigmoid(self.match_logit_scale.float() * score + self.match_logit_bias.float())  # (B,)
        return FusionOutput(fused=fused, score=score, match_score=match_score)
