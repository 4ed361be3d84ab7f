"""The checks of ``kernels.lowrank_cross_attention``'s launcher: every shape, dtype, stride, device and offset rule.

Beside the op rather than in it so the kernel's file stays the kernel, its
reference and its launcher. Each rule fails with its own
``KernelInputError`` message naming the argument, so a caller's mistake is
never a Triton compile error or a silent wrong answer. The offsets are read
to the host once here, and the sizes of the validated call come back as an
``AttentionShape``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels.errors import KernelInputError

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
MAX_RANK = 64
MAX_VALUE_DIM = 4096
MAX_NUM_ITEMS = 65535  # the CUDA grid's second axis


@dataclass(frozen=True)
class AttentionShape:
    """Sizes of one validated call; the lengths come from one host read of each offsets tensor."""

    rank: int
    value_dim: int
    seqlens_q: tuple[int, ...]
    seqlens_k: tuple[int, ...]

    @property
    def num_items(self) -> int:
        return len(self.seqlens_q)

    @property
    def max_seqlen_q(self) -> int:
        return max(self.seqlens_q, default=0)


def seqlens_from_offsets(offsets: list[int]) -> tuple[int, ...]:
    return tuple(end - start for start, end in zip(offsets[:-1], offsets[1:], strict=True))


def check_inputs(
    q: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_k: torch.Tensor | None,
    scale: float | None,
    out: torch.Tensor | None,
) -> AttentionShape:
    """Every shape, dtype, stride, device and offset rule, each with its own message."""
    tensors = [("q", q), ("cu_seqlens_q", cu_seqlens_q), ("k", k), ("v", v)]
    for name, tensor in tensors + ([] if cu_seqlens_k is None else [("cu_seqlens_k", cu_seqlens_k)]):
        if not isinstance(tensor, torch.Tensor):
            raise KernelInputError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if q.dim() != 2:
        raise KernelInputError(f"q must be 2-D (total_tokens, r), got shape {tuple(q.shape)}")
    is_packed = cu_seqlens_k is not None
    _check_key_dims(k, v, is_packed)
    if q.dtype not in SUPPORTED_DTYPES:
        raise KernelInputError(f"q dtype must be one of {SUPPORTED_DTYPES}, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise KernelInputError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise KernelInputError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    rank, value_dim = k.shape[-1], v.shape[-1]
    if q.shape[1] != rank:
        raise KernelInputError(f"q has rank {q.shape[1]} but k has rank {rank}")
    if not 1 <= rank <= MAX_RANK:
        raise KernelInputError(f"rank r must be in [1, {MAX_RANK}], got {rank}")
    if not 1 <= value_dim <= MAX_VALUE_DIM:
        raise KernelInputError(f"value width d must be in [1, {MAX_VALUE_DIM}], got {value_dim}")
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.stride(-1) != 1:
            raise KernelInputError(
                f"{name} must be contiguous in its last dimension, got strides {tuple(tensor.stride())}"
            )
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise KernelInputError(f"scale must be a finite number, got {scale!r}")
    if is_packed:
        if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] < 1:
            raise KernelInputError(f"cu_seqlens_q must have shape (B + 1,), got {tuple(cu_seqlens_q.shape)}")
        num_items = cu_seqlens_q.shape[0] - 1
    else:
        num_items = k.shape[0]
    if num_items > MAX_NUM_ITEMS:
        raise KernelInputError(f"at most {MAX_NUM_ITEMS} items per call, got {num_items}")
    seqlens_q = _check_offsets("cu_seqlens_q", cu_seqlens_q, num_items, "q", q)
    if is_packed:
        seqlens_k = _check_offsets("cu_seqlens_k", cu_seqlens_k, num_items, "k", k)
    else:
        seqlens_k = (k.shape[1],) * num_items
    if out is not None:
        _check_out(out, q, value_dim)
    return AttentionShape(rank, value_dim, seqlens_q, seqlens_k)


def _check_key_dims(k: torch.Tensor, v: torch.Tensor, is_packed: bool) -> None:
    if is_packed:
        if k.dim() != 2:
            raise KernelInputError(f"k must be 2-D (Tk, r) with cu_seqlens_k, got shape {tuple(k.shape)}")
        if v.dim() != 2:
            raise KernelInputError(f"v must be 2-D (Tk, d) with cu_seqlens_k, got shape {tuple(v.shape)}")
        if v.shape[0] != k.shape[0]:
            raise KernelInputError(f"v has {v.shape[0]} rows (Tk) but k has {k.shape[0]}")
        return
    if k.dim() != 3:
        raise KernelInputError(
            f"k must be 3-D (B, Lv, r), or 2-D (Tk, r) with cu_seqlens_k, got shape {tuple(k.shape)}"
        )
    if v.dim() != 3:
        raise KernelInputError(f"v must be 3-D (B, Lv, d) like k, got shape {tuple(v.shape)}")
    if v.shape[:2] != k.shape[:2]:
        raise KernelInputError(f"v (B, Lv) = {tuple(v.shape[:2])} must match k's {tuple(k.shape[:2])}")


def _check_offsets(
    name: str, offsets_tensor: torch.Tensor, num_items: int, rows_name: str, rows: torch.Tensor
) -> tuple[int, ...]:
    """``offsets_tensor`` splits the rows of ``rows`` into ``num_items`` items; returns their lengths."""
    if offsets_tensor.dtype != torch.int32:
        raise KernelInputError(f"{name} must be int32, got {offsets_tensor.dtype}")
    if offsets_tensor.dim() != 1 or offsets_tensor.shape[0] != num_items + 1:
        raise KernelInputError(
            f"{name} must have shape (B + 1,) = ({num_items + 1},), got {tuple(offsets_tensor.shape)}"
        )
    if offsets_tensor.device.type != "cpu" and offsets_tensor.device != rows.device:
        raise KernelInputError(
            f"{name} must be on the CPU or on {rows_name}'s device {rows.device}, got {offsets_tensor.device}"
        )
    offsets = offsets_tensor.tolist()
    if offsets[0] != 0:
        raise KernelInputError(f"{name} must start at 0, got {offsets[0]}")
    seqlens = seqlens_from_offsets(offsets)
    if any(length < 0 for length in seqlens):
        raise KernelInputError(f"{name} must be non-decreasing, got {offsets}")
    if offsets[-1] != rows.shape[0]:
        raise KernelInputError(
            f"{name} must end at {rows_name}'s row count {rows.shape[0]}, got {offsets[-1]}"
        )
    return seqlens


def _check_out(out: torch.Tensor, q: torch.Tensor, value_dim: int) -> None:
    expected = (q.shape[0], value_dim)
    if tuple(out.shape) != expected:
        raise KernelInputError(f"out must have shape {expected}, got {tuple(out.shape)}")
    if out.dtype != q.dtype:
        raise KernelInputError(f"out dtype must be q's dtype {q.dtype}, got {out.dtype}")
    if out.device != q.device:
        raise KernelInputError(f"out must be on q's device {q.device}, got {out.device}")
    if out.stride(-1) != 1:
        raise KernelInputError(f"out must be contiguous in its last dimension, got strides {tuple(out.stride())}")
