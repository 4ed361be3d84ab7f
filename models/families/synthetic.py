"""The ``synthetic`` preset: towers whose stage times are drawn, not computed.

A drift drill must tell a 20 % stall of 172 ms from the everyday movement of
the latency distribution. With real encoders on shared cores the everyday
movement is large (a neighbour starting work moves CPU-bound stage times by
a KS distance of 0.1 to 0.6), so a drill could only use a full stall. These
towers instead *sleep* for a service time drawn from a seeded distribution
and do next to no arithmetic (a pooled projection of the pixels, an
embedding lookup), so neighbour CPU load barely moves their stage times,
and the drill can run as the incident happened.

What they compute is a few operations on tensors of a few thousand numbers:
split over torch's intra-op threads, each operation costs more in OpenMP
hand-offs (and spinning at its barrier, on a busy machine) than it saves, so
the towers ask for one thread (``MAX_INTRA_OP_THREADS``), which the model
passes on to the compute thread (``MultimodalModel.max_intra_op_threads``).

    distribution   a draw, in milliseconds
    constant       median
    lognormal      median * exp(spread * N(0, 1))      (spread is sigma of log)
    uniform        median * U(1 - spread, 1 + spread)

One draw per batch, per stage (a batch runs each encoder once, as the real
towers do). The outputs are deterministic functions of the inputs (seeded
weights), so segments, fusion and the cache behave as with any model; the
answers mean nothing and the server says the weights are random.
"""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.loading.config import PreprocessConfig, TextConfig
from models.graphs import TraceOutcome
from models.text import TextEncoder
from models.vision import UInt8VisionEncoder, VisionOutput

SERVICE_TIME_DISTRIBUTIONS: tuple[str, ...] = ("constant", "lognormal", "uniform")
MAX_INTRA_OP_THREADS = 1  # the towers' operations are too small to split over threads


@dataclass(frozen=True)
class ServiceTime:
    """How long one batch of one stage sleeps: a distribution around ``median_ms``."""

    median_ms: float
    distribution: str = "lognormal"
    spread: float = 0.25

    def __post_init__(self) -> None:
        if self.distribution not in SERVICE_TIME_DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {SERVICE_TIME_DISTRIBUTIONS}, got {self.distribution!r}")
        if self.median_ms < 0 or self.spread < 0:
            raise ValueError("median_ms and spread must be >= 0")
        if self.distribution == "uniform" and self.spread > 1:
            raise ValueError("a uniform spread above 1 would draw negative times")


@dataclass(frozen=True)
class SyntheticServiceTimes:
    """The stage times of the synthetic towers, and the seed their draws come from."""

    vision: ServiceTime = ServiceTime(median_ms=20.0)
    text: ServiceTime = ServiceTime(median_ms=4.0)
    seed: int = 0


class ServiceTimeSampler:
    """Seeded draws of one stage's service time, safe to call from several compute threads."""

    def __init__(self, service_time: ServiceTime, seed: int) -> None:
        self.service_time = service_time
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def draw_ms(self) -> float:
        median, spread = self.service_time.median_ms, self.service_time.spread
        with self._lock:
            if self.service_time.distribution == "lognormal":
                return median * math.exp(spread * self._random.gauss(0.0, 1.0))
            if self.service_time.distribution == "uniform":
                return median * self._random.uniform(1.0 - spread, 1.0 + spread)
            return median

    def sleep(self) -> None:
        time.sleep(self.draw_ms() / 1000.0)


def _untraceable(encoder: str) -> TraceOutcome:
    # A trace would record the arithmetic and drop the sleep the preset exists for.
    return TraceOutcome(encoder=encoder, graph=None, reason="synthetic towers sleep; a graph would not")


class SyntheticVisionEncoder(UInt8VisionEncoder):
    """Patch tokens from average-pooled pixels through one linear map; then sleep."""

    max_intra_op_threads = MAX_INTRA_OP_THREADS

    def __init__(self, preprocess: PreprocessConfig, width: int, grid: int, sampler: ServiceTimeSampler) -> None:
        super().__init__(preprocess, embed_dim=width, embedding_dim=width, num_tokens=grid * grid)
        self.grid = grid
        self.patch = nn.Linear(3, width)
        self.sampler = sampler
        # Normalisation as one multiply-add per channel: (x / 255 - mean) / std = x * scale + shift.
        std = torch.tensor(self.std, dtype=torch.float64)
        self.register_buffer("scale", (1.0 / (255.0 * std)).float().view(1, 3, 1, 1), persistent=False)
        self.register_buffer("shift", (-torch.tensor(self.mean, dtype=torch.float64) / std).float().view(1, 3, 1, 1),
                             persistent=False)

    def forward(self, images: torch.Tensor) -> VisionOutput:
        """``features`` of the normalised pixels, normalising the g x g pooled values instead of every pixel.

        Normalisation is an affine map per channel and pooling is a mean, so
        pooling first gives the same patches (to float rounding) for a few
        operations on 3 x g x g numbers instead of a dozen on every pixel.
        """
        if self.graph is not None:
            return super().forward(images)
        planar = images.permute(0, 3, 1, 2).float()  # (B, 3, S, S)
        pooled = F.adaptive_avg_pool2d(planar, self.grid)  # (B, 3, g, g)
        normalized = torch.addcmul(self.shift, pooled, self.scale).to(self.parameter_dtype())  # (B, 3, g, g)
        tokens, pooled_tokens = self._encode_patches(normalized)
        return VisionOutput(tokens=tokens, pooled=pooled_tokens)

    def features(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._encode_patches(F.adaptive_avg_pool2d(pixels, self.grid))  # (B, 3, g, g)

    def _encode_patches(self, patches: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, 3, g, g) normalised patch means -> tokens (B, g*g, width) and their mean; then sleep."""
        tokens = torch.tanh(self.patch(patches.flatten(2).transpose(1, 2)))  # (B, g*g, width)
        self.sampler.sleep()
        return tokens, tokens.mean(dim=1)

    def trace_graph(self) -> TraceOutcome:
        return _untraceable("vision")


class SyntheticTextEncoder(TextEncoder):
    """Token states from an embedding table, masked-mean pooled; then sleep."""

    max_intra_op_threads = MAX_INTRA_OP_THREADS

    def __init__(self, config: TextConfig, vocab_size: int, sampler: ServiceTimeSampler) -> None:
        super().__init__(nn.Embedding(vocab_size, config.hidden_size), hidden_size=config.hidden_size,
                         max_tokens=config.max_position_embeddings, vocab_size=vocab_size)
        self.sampler = sampler

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Token states and their masked mean: in numpy when the table is a float32 array on the CPU.

        Each torch call releases the GIL and must take it back; beside a busy
        event loop that costs a wait and a string of futile wake-ups, more
        than the arithmetic. With these few operations in numpy one process
        under wrk answered 1.18x the text requests per second (two
        alternated pairs of runs; BENCHMARKS.md, history), the measured request path no longer slowed by the tower.
        Other devices and dtypes (numpy has no bfloat16) take the torch path.
        """
        weight = self.model.weight
        if weight.device.type == "cpu" and weight.dtype == torch.float32:
            tokens_np, pooled_np = _pooled_token_states(weight.detach().numpy(), input_ids.numpy(),
                                                        attention_mask.numpy())
            tokens, pooled = torch.from_numpy(tokens_np), torch.from_numpy(pooled_np)
        else:
            tokens = self.model(input_ids)  # (B, Lt, d_t)
            mask = attention_mask.unsqueeze(-1).to(tokens.dtype)  # (B, Lt, 1)
            pooled = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)  # (B, d_t)
        self.sampler.sleep()
        return tokens, pooled

    def trace_graph(self) -> TraceOutcome:
        return _untraceable("text")


def _pooled_token_states(table: np.ndarray, input_ids: np.ndarray,
                         attention_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``table`` for (B, Lt) ids, and their mean over the mask's ones (B, d_t); the torch path's arithmetic."""
    tokens = table[input_ids]  # (B, Lt, d_t)
    mask = attention_mask[..., None].astype(table.dtype)  # (B, Lt, 1)
    return tokens, (tokens * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1.0)


def synthetic_towers(preprocess: PreprocessConfig, text: TextConfig, vocab_size: int,
                     times: SyntheticServiceTimes) -> tuple[SyntheticVisionEncoder, SyntheticTextEncoder]:
    """Both towers, each with its own seeded sampler (the two streams of draws never interleave)."""
    vision = SyntheticVisionEncoder(preprocess, width=text.hidden_size, grid=4,
                                    sampler=ServiceTimeSampler(times.vision, seed=times.seed))
    text_encoder = SyntheticTextEncoder(text, vocab_size, ServiceTimeSampler(times.text, seed=times.seed + 1))
    return vision, text_encoder
