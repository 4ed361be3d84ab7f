"""Low-rank cross-modal attention over packed (variable-length) text queries.

    out[t] = softmax(q[t] . k[b]^T * scale) . v[b]      for every text row t of item b

What is fused, and why it saves memory traffic: the unfused torch path writes
the score matrix S = q k^T (T x Lv), reads it back for the softmax, writes the
probabilities P and reads them again for P v -- four passes over T x Lv values
on top of the inputs, plus a padded (B, Lt_max, r) copy of the packed queries.
The kernel does q k^T, an online (running max / running sum) softmax and P v in
one pass with fp32 accumulators: S and P live in registers one (BLOCK_M x
BLOCK_N) tile at a time, the packed queries are read in place through
``cu_seqlens_q``, and the only traffic is q, k, v once and the output once.
The value width d (up to 1024) is split over a third grid axis; each d-tile
recomputes its q k^T tiles, which adds r/BLOCK_D of the P v work (16/128 at
serving shapes) and buys parallelism when the batch is small.

Layout (T = total text tokens, B items, Lv image tokens, r rank, d value width):

    q            (T, r)     rows of item b are q[cu_seqlens_q[b] : cu_seqlens_q[b + 1]]
    cu_seqlens_q (B + 1,)   int32, 0 = cu[0] <= cu[1] <= ... <= cu[B] = T
    k            (B, Lv, r)
    v            (B, Lv, d)
    out          (T, d)     same dtype as q

Keys are never ragged (every image has Lv tokens), so only the queries are
packed; an item with no text rows simply produces no output rows.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from kernels.backend import (
    Backend,
    LaunchConfig,
    device_arch,
    is_interpreter_enabled,
    jit_kernel,
    launch_config,
    resolve_backend,
    row_max_combine,
    row_sum_combine,
    tl,
    triton,
)
from kernels.errors import KernelInputError

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
MAX_RANK = 64
MAX_VALUE_DIM = 4096
MAX_NUM_ITEMS = 65535  # the CUDA grid's second axis


@dataclass(frozen=True)
class _AttentionShape:
    """Sizes of one validated call; ``seqlens_q`` comes from one host read of ``cu_seqlens_q``."""

    num_items: int
    seqlen_k: int
    rank: int
    value_dim: int
    seqlens_q: tuple[int, ...]

    @property
    def max_seqlen_q(self) -> int:
        return max(self.seqlens_q, default=0)


def lowrank_cross_attention_ref(
    q: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Torch reference, and the CPU serving path: pad the queries, two ``bmm``s, unpack.

    Computes in the inputs' dtype (pass float64 tensors for a high-precision
    reference). Inputs are assumed valid; ``lowrank_cross_attention`` checks them.
    Padded query rows attend over complete key sets, so no mask is needed: their
    outputs are computed and dropped.
    """
    seqlens_q = _seqlens_from_offsets(cu_seqlens_q.tolist())
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    return _attention_padded(q, seqlens_q, k, v, scale)


def _attention_padded(
    q: torch.Tensor, seqlens_q: tuple[int, ...], k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    num_items, _, rank = k.shape
    total_q = sum(seqlens_q)
    max_seqlen_q = max(seqlens_q, default=0)
    if total_q == 0:
        return q.new_empty((0, v.shape[-1]))  # (0, d)
    lengths = torch.tensor(seqlens_q, dtype=torch.long, device=q.device)  # (B,)
    item_of_row = torch.repeat_interleave(torch.arange(num_items, device=q.device), lengths)  # (T,)
    starts = torch.cumsum(lengths, 0) - lengths  # (B,)
    pos_in_item = torch.arange(total_q, device=q.device) - starts[item_of_row]  # (T,)
    q_padded = q.new_zeros((num_items, max_seqlen_q, rank))  # (B, Lt_max, r)
    q_padded[item_of_row, pos_in_item] = q
    scores = torch.bmm(q_padded, k.transpose(1, 2)) * scale  # (B, Lt_max, Lv)
    probs = torch.softmax(scores, dim=-1)  # (B, Lt_max, Lv)
    out_padded = torch.bmm(probs, v)  # (B, Lt_max, d)
    return out_padded[item_of_row, pos_in_item]  # (T, d)


def _lowrank_cross_attention_kernel(
    Q,  # (T, r) packed queries
    K,  # (B, Lv, r)
    V,  # (B, Lv, d)
    Out,  # (T, d)
    CuSeqlensQ,  # (B + 1,) int32 row offsets of each item in Q and Out
    stride_q_row,
    stride_k_item,
    stride_k_row,
    stride_v_item,
    stride_v_row,
    stride_out_row,
    seqlen_k,
    rank,
    value_dim,
    scale_log2,  # scale * log2(e): the softmax runs on exp2
    DOT_DTYPE: tl.constexpr,  # operand dtype of both dots (see _dot_dtype)
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One program: BLOCK_M query rows of one item x BLOCK_D value columns.
    pid_m = tl.program_id(0)
    item = tl.program_id(1)
    pid_d = tl.program_id(2)
    row_start = tl.load(CuSeqlensQ + item)
    seqlen_q = tl.load(CuSeqlensQ + item + 1) - row_start
    if pid_m * BLOCK_M >= seqlen_q:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_R)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_m = offs_m < seqlen_q  # rows past the item belong to the next item: never stored
    mask_r = offs_r < rank  # rank padded up to a dot-friendly width with zeros
    mask_d = offs_d < value_dim
    rows = (row_start + offs_m).to(tl.int64)
    q = tl.load(
        Q + rows[:, None] * stride_q_row + offs_r[None, :],
        mask=mask_m[:, None] & mask_r[None, :],
        other=0.0,
    ).to(DOT_DTYPE)  # (BLOCK_M, BLOCK_R)
    k_item = K + item.to(tl.int64) * stride_k_item
    v_item = V + item.to(tl.int64) * stride_v_item

    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.full([BLOCK_M], 0.0, dtype=tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, dtype=tl.float32)
    for start_n in range(0, seqlen_k, BLOCK_N):
        cols = start_n + offs_n
        mask_n = cols < seqlen_k  # keys past Lv are never attended
        k_t = tl.load(
            k_item + cols[None, :] * stride_k_row + offs_r[:, None],
            mask=mask_r[:, None] & mask_n[None, :],
            other=0.0,
        ).to(DOT_DTYPE)  # (BLOCK_R, BLOCK_N)
        scores = tl.dot(q, k_t, input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N) fp32
        scores = tl.where(mask_n[None, :], scores * scale_log2, float("-inf"))
        new_max = tl.maximum(row_max, tl.reduce(scores, 1, row_max_combine))
        correction = tl.exp2(row_max - new_max)  # 0 on the first tile (row_max = -inf)
        probs = tl.exp2(scores - new_max[:, None])
        row_sum = row_sum * correction + tl.reduce(probs, 1, row_sum_combine)
        v = tl.load(
            v_item + cols[:, None] * stride_v_row + offs_d[None, :],
            mask=mask_n[:, None] & mask_d[None, :],
            other=0.0,
        ).to(DOT_DTYPE)  # (BLOCK_N, BLOCK_D)
        # P is rounded to the value dtype, as a half-precision P.V dot on the GPU does.
        probs = probs.to(V.dtype.element_ty).to(DOT_DTYPE)
        acc = acc * correction[:, None]
        acc = tl.dot(probs, v, acc, input_precision=DOT_PRECISION)
        row_max = new_max
    acc = acc / row_sum[:, None]
    tl.store(
        Out + rows[:, None] * stride_out_row + offs_d[None, :],
        acc.to(Out.dtype.element_ty),
        mask=mask_m[:, None] & mask_d[None, :],
    )


def lowrank_cross_attention(
    q: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    backend: Backend | str = "auto",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per item softmax(q k^T * scale) v over packed queries; returns (T, d) in q's dtype.

    ``scale`` defaults to 1/sqrt(r). ``backend="auto"`` runs the Triton kernel on
    CUDA and the torch reference elsewhere; ``"triton"`` / ``"torch"`` force one.
    ``out`` (T, d), if given, receives the result (preallocated serving buffers).
    ``cu_seqlens_q`` may live on the CPU or on q's device; it is read on the host
    once to validate it and size the launch grid.
    """
    shape = _check_inputs(q, cu_seqlens_q, k, v, scale, out)
    scale_value = shape.rank**-0.5 if scale is None else float(scale)
    chosen = resolve_backend(backend, q.device)
    if chosen is Backend.TORCH:
        result = _attention_padded(q, shape.seqlens_q, k, v, scale_value)
        if out is None:
            return result
        return out.copy_(result)
    if out is None:
        out = q.new_empty((q.shape[0], shape.value_dim))  # (T, d)
    _launch(q, cu_seqlens_q, k, v, out, shape, scale_value)
    return out


def _launch(
    q: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    shape: _AttentionShape,
    scale: float,
) -> None:
    if shape.max_seqlen_q == 0:
        return
    offsets = cu_seqlens_q.to(q.device, non_blocking=True)
    config = launch_config(_table_key(q.dtype), device_arch(q.device))
    meta = _launch_meta(q.dtype, shape, is_interpreter_enabled(), config)
    grid = (
        triton.cdiv(shape.max_seqlen_q, meta["BLOCK_M"]),
        shape.num_items,
        triton.cdiv(shape.value_dim, meta["BLOCK_D"]),
    )
    kernel = jit_kernel(_lowrank_cross_attention_kernel)
    with torch.cuda.device(q.device) if q.device.type == "cuda" else contextlib.nullcontext():
        kernel[grid](
            q,
            k,
            v,
            out,
            offsets,
            q.stride(0),
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            out.stride(0),
            shape.seqlen_k,
            shape.rank,
            shape.value_dim,
            scale * math.log2(math.e),
            num_warps=config.num_warps,
            **meta,
        )


def _table_key(dtype: torch.dtype) -> str:
    """The launch table's entry for ``dtype`` (``kernels.backend.LAUNCH_TABLE``)."""
    return "lowrank_cross_attention/" + ("fp32" if dtype == torch.float32 else "half")


def _launch_meta(dtype: torch.dtype, shape: _AttentionShape, is_interpret: bool,
                 config: LaunchConfig) -> dict[str, object]:
    """The kernel's constexpr arguments for one call: the table's tiles, capped by the shape, and dot operands."""
    tiles = config.tiles
    return {
        "DOT_DTYPE": _dot_dtype(dtype, is_interpret),
        "DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32",
        "BLOCK_M": min(tiles["BLOCK_M"], max(16, triton.next_power_of_2(shape.max_seqlen_q))),
        "BLOCK_N": tiles["BLOCK_N"],
        "BLOCK_R": max(16, triton.next_power_of_2(shape.rank)),
        "BLOCK_D": min(tiles["BLOCK_D"], max(16, triton.next_power_of_2(shape.value_dim))),
    }


def _dot_dtype(dtype: torch.dtype, is_interpret: bool) -> object:
    """fp32 dots for fp32 inputs ("ieee": no TF32 rounding); native half dots on the GPU.

    The interpreter keeps bfloat16 as raw uint16 and cannot hand it to numpy's
    matmul, so there bf16 operands are widened to fp32 first. That is exact
    (every bf16 value and product of two is exact in fp32, and the GPU's bf16
    dot accumulates in fp32 too), so the interpreted kernel computes what the
    GPU kernel computes.
    """
    if dtype == torch.float32 or (dtype == torch.bfloat16 and is_interpret):
        return tl.float32
    return tl.float16 if dtype == torch.float16 else tl.bfloat16


def _seqlens_from_offsets(offsets: list[int]) -> tuple[int, ...]:
    return tuple(end - start for start, end in zip(offsets[:-1], offsets[1:], strict=True))


def _check_inputs(
    q: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None,
    out: torch.Tensor | None,
) -> _AttentionShape:
    """Every shape, dtype, stride, device and offset rule, each with its own message."""
    for name, tensor in (("q", q), ("cu_seqlens_q", cu_seqlens_q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor):
            raise KernelInputError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if q.dim() != 2:
        raise KernelInputError(f"q must be 2-D (total_tokens, r), got shape {tuple(q.shape)}")
    if k.dim() != 3:
        raise KernelInputError(f"k must be 3-D (B, Lv, r), got shape {tuple(k.shape)}")
    if v.dim() != 3:
        raise KernelInputError(f"v must be 3-D (B, Lv, d), got shape {tuple(v.shape)}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise KernelInputError(f"q dtype must be one of {SUPPORTED_DTYPES}, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise KernelInputError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise KernelInputError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    num_items, seqlen_k, rank = k.shape
    if q.shape[1] != rank:
        raise KernelInputError(f"q has rank {q.shape[1]} but k has rank {rank}")
    if not 1 <= rank <= MAX_RANK:
        raise KernelInputError(f"rank r must be in [1, {MAX_RANK}], got {rank}")
    if v.shape[:2] != k.shape[:2]:
        raise KernelInputError(f"v (B, Lv) = {tuple(v.shape[:2])} must match k's {tuple(k.shape[:2])}")
    value_dim = v.shape[2]
    if not 1 <= value_dim <= MAX_VALUE_DIM:
        raise KernelInputError(f"value width d must be in [1, {MAX_VALUE_DIM}], got {value_dim}")
    if seqlen_k == 0:
        raise KernelInputError("k and v need at least one image token (Lv >= 1): softmax over nothing")
    if num_items > MAX_NUM_ITEMS:
        raise KernelInputError(f"at most {MAX_NUM_ITEMS} items per call, got {num_items}")
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.stride(-1) != 1:
            raise KernelInputError(
                f"{name} must be contiguous in its last dimension, got strides {tuple(tensor.stride())}"
            )
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise KernelInputError(f"scale must be a finite number, got {scale!r}")
    seqlens_q = _check_offsets(cu_seqlens_q, num_items, q)
    if out is not None:
        _check_out(out, q, value_dim)
    return _AttentionShape(num_items, seqlen_k, rank, value_dim, seqlens_q)


def _check_offsets(cu_seqlens_q: torch.Tensor, num_items: int, q: torch.Tensor) -> tuple[int, ...]:
    if cu_seqlens_q.dtype != torch.int32:
        raise KernelInputError(f"cu_seqlens_q must be int32, got {cu_seqlens_q.dtype}")
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] != num_items + 1:
        raise KernelInputError(
            f"cu_seqlens_q must have shape (B + 1,) = ({num_items + 1},), got {tuple(cu_seqlens_q.shape)}"
        )
    if cu_seqlens_q.device.type != "cpu" and cu_seqlens_q.device != q.device:
        raise KernelInputError(
            f"cu_seqlens_q must be on the CPU or on q's device {q.device}, got {cu_seqlens_q.device}"
        )
    offsets = cu_seqlens_q.tolist()
    if offsets[0] != 0:
        raise KernelInputError(f"cu_seqlens_q must start at 0, got {offsets[0]}")
    seqlens_q = _seqlens_from_offsets(offsets)
    if any(length < 0 for length in seqlens_q):
        raise KernelInputError(f"cu_seqlens_q must be non-decreasing, got {offsets}")
    if offsets[-1] != q.shape[0]:
        raise KernelInputError(f"cu_seqlens_q must end at q's row count {q.shape[0]}, got {offsets[-1]}")
    return seqlens_q


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
