"""Seeded random inputs and error measures for the low-rank cross-attention tests."""

from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionCase:
    """One shape/dtype combination; ``seqlens`` are the packed text lengths per item."""

    seqlens: tuple[int, ...]
    seqlen_k: int
    rank: int
    value_dim: int
    dtype: torch.dtype
    scale: float | None = None

    @property
    def case_id(self) -> str:
        lengths = "-".join(str(n) for n in self.seqlens)
        dtype = str(self.dtype).removeprefix("torch.")
        return f"Lt{lengths}_Lv{self.seqlen_k}_r{self.rank}_d{self.value_dim}_{dtype}_s{self.scale}"

    @property
    def seed(self) -> int:
        """A seed of its own per case, stable across runs and processes."""
        return zlib.crc32(self.case_id.encode())


@dataclass(frozen=True)
class AttentionInputs:
    q: torch.Tensor  # (T, r)
    cu_seqlens_q: torch.Tensor  # (B + 1,) int32
    k: torch.Tensor  # (B, Lv, r)
    v: torch.Tensor  # (B, Lv, d)

    def to(self, dtype: torch.dtype) -> AttentionInputs:
        return AttentionInputs(self.q.to(dtype), self.cu_seqlens_q, self.k.to(dtype), self.v.to(dtype))


def offsets(seqlens: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(seqlens)], dtype=torch.int32)  # (B + 1,)


def make_inputs(case: AttentionCase) -> AttentionInputs:
    gen = torch.Generator().manual_seed(case.seed)
    num_items, total = len(case.seqlens), sum(case.seqlens)
    q = torch.randn(total, case.rank, generator=gen, dtype=torch.float64)  # (T, r)
    k = torch.randn(num_items, case.seqlen_k, case.rank, generator=gen, dtype=torch.float64)  # (B, Lv, r)
    v = torch.randn(num_items, case.seqlen_k, case.value_dim, generator=gen, dtype=torch.float64)  # (B, Lv, d)
    return AttentionInputs(q, offsets(case.seqlens), k, v).to(case.dtype)


@dataclass(frozen=True)
class RaggedCase:
    """Packed keys: ``images[b]`` are the token counts of item b's images (0 to 4 of them)."""

    seqlens: tuple[int, ...]
    images: tuple[tuple[int, ...], ...]
    rank: int
    value_dim: int
    dtype: torch.dtype
    scale: float | None = None

    @property
    def seqlens_k(self) -> tuple[int, ...]:
        return tuple(sum(tokens) for tokens in self.images)

    @property
    def case_id(self) -> str:
        lengths = "-".join(str(n) for n in self.seqlens)
        images = "-".join("+".join(str(n) for n in tokens) or "none" for tokens in self.images)
        dtype = str(self.dtype).removeprefix("torch.")
        return f"Lt{lengths}_img{images}_r{self.rank}_d{self.value_dim}_{dtype}_s{self.scale}"

    @property
    def seed(self) -> int:
        return zlib.crc32(self.case_id.encode())


@dataclass(frozen=True)
class RaggedInputs:
    q: torch.Tensor  # (T, r)
    cu_seqlens_q: torch.Tensor  # (B + 1,) int32
    k: torch.Tensor  # (Tk, r)
    v: torch.Tensor  # (Tk, d)
    cu_seqlens_k: torch.Tensor  # (B + 1,) int32

    def to(self, dtype: torch.dtype) -> RaggedInputs:
        return RaggedInputs(self.q.to(dtype), self.cu_seqlens_q, self.k.to(dtype), self.v.to(dtype), self.cu_seqlens_k)


def make_ragged_inputs(case: RaggedCase) -> RaggedInputs:
    if len(case.images) != len(case.seqlens):
        raise ValueError(f"{len(case.images)} image lists for {len(case.seqlens)} items")
    gen = torch.Generator().manual_seed(case.seed)
    total_q, total_k = sum(case.seqlens), sum(case.seqlens_k)
    q = torch.randn(total_q, case.rank, generator=gen, dtype=torch.float64)  # (T, r)
    k = torch.randn(total_k, case.rank, generator=gen, dtype=torch.float64)  # (Tk, r)
    v = torch.randn(total_k, case.value_dim, generator=gen, dtype=torch.float64)  # (Tk, d)
    return RaggedInputs(q, offsets(case.seqlens), k, v, offsets(case.seqlens_k)).to(case.dtype)


def max_abs_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return (actual.double() - expected.double()).abs().max().item()


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Max abs error over max abs value: elementwise ratios blow up near zero."""
    return max_abs_error(actual, expected) / expected.double().abs().max().item()
