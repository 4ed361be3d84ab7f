"""Low-rank cross-modal attention over packed (variable-length) text queries and image keys.

    out[t] = softmax(q[t] . K_b^T * scale) . V_b      for every text row t of item b

where K_b, V_b are item b's own keys and values: the image tokens of all its
images, concatenated (a request with several images attends over all of them
at once).

What is fused, and why it saves memory traffic: the unfused torch path writes
the score matrix S = q k^T (T x Lk), reads it back for the softmax, writes the
probabilities P and reads them again for P v -- four passes over T x Lk values
on top of the inputs, plus padded (B, Lt_max, r) and (B, Lk_max, r | d) copies
of the packed queries, keys and values. The kernel does q k^T, an online
(running max / running sum) softmax and P v in one pass with fp32
accumulators: S and P live in registers one (BLOCK_M x BLOCK_N) tile at a
time, queries, keys and values are read in place through ``cu_seqlens_q`` and
``cu_seqlens_k``, and the only traffic is q, k, v once and the output once.
The value width d (up to 1024) is split over a third grid axis; each d-tile
recomputes its q k^T tiles, which adds r/BLOCK_D of the P v work (16/128 at
serving shapes) and buys parallelism when the batch is small.

Layout (T text tokens, Tk image tokens in all, B items, r rank, d value width):

    q            (T, r)     rows of item b are q[cu_seqlens_q[b] : cu_seqlens_q[b + 1]]
    cu_seqlens_q (B + 1,)   int32, 0 = cu[0] <= cu[1] <= ... <= cu[B] = T
    k            (Tk, r)    keys of item b are k[cu_seqlens_k[b] : cu_seqlens_k[b + 1]]
    v            (Tk, d)    values, the same rows as k
    cu_seqlens_k (B + 1,)   int32, 0 = cu[0] <= ... <= cu[B] = Tk
    out          (T, d)     same dtype as q

Without ``cu_seqlens_k`` the keys are dense, k (B, Lv, r) and v (B, Lv, d):
every item has Lv keys, which is the packed layout with offsets b * Lv (the
launcher passes it to the kernel so).

Empty items: an item with no text rows produces no output rows; an item with
no keys (a text with no image) attends over the empty set, which outputs zeros
(the empty sum of values; the softmax's normaliser is empty too, and the
kernel divides by 1 instead of 0).

Each item's key count is read inside the kernel from ``cu_seqlens_k``, and its
last key tile is masked; no key length is a kernel argument or a tile size, so
however ragged the keys, they compile no new variant. Only the query tile
BLOCK_M follows the call's longest text, in powers of two up to the table's.
"""

from __future__ import annotations

import contextlib
import math

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
from kernels.lowrank_cross_attention_inputs import AttentionShape, check_inputs, seqlens_from_offsets

def lowrank_cross_attention_ref(
    q: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    cu_seqlens_k: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Torch reference, and the CPU serving path: pad, two ``bmm``s, unpack.

    Computes in the inputs' dtype (pass float64 tensors for a high-precision
    reference). Inputs are assumed valid; ``lowrank_cross_attention`` checks them.
    Padded query rows are computed and dropped. Dense keys, and packed keys of
    one length, need no mask; ragged keys are padded to the longest and the
    padding is masked out of the softmax.
    """
    seqlens_q = seqlens_from_offsets(cu_seqlens_q.tolist())
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    if cu_seqlens_k is None:
        return _attention_dense(q, seqlens_q, k, v, scale)
    return _attention_packed(q, seqlens_q, k, v, seqlens_from_offsets(cu_seqlens_k.tolist()), scale)


def _pack_index(seqlens: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """For each packed row: its item and its position in the item, both (total,)."""
    lengths = torch.tensor(seqlens, dtype=torch.long, device=device)  # (B,)
    item_of_row = torch.repeat_interleave(torch.arange(len(seqlens), device=device), lengths)  # (total,)
    starts = torch.cumsum(lengths, 0) - lengths  # (B,)
    pos_in_item = torch.arange(int(sum(seqlens)), device=device) - starts[item_of_row]  # (total,)
    return item_of_row, pos_in_item


def _padded(rows: torch.Tensor, seqlens: tuple[int, ...], index: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Packed rows (total, w) -> zero-padded (B, L_max, w)."""
    padded = rows.new_zeros((len(seqlens), max(seqlens, default=0), rows.shape[-1]))  # (B, L_max, w)
    padded[index] = rows
    return padded


def _attention_dense(
    q: torch.Tensor, seqlens_q: tuple[int, ...], k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """k (B, Lv, r), v (B, Lv, d); Lv = 0 gives zeros (softmax over nothing, then an empty sum)."""
    if sum(seqlens_q) == 0:
        return q.new_empty((0, v.shape[-1]))  # (0, d)
    index_q = _pack_index(seqlens_q, q.device)
    q_padded = _padded(q, seqlens_q, index_q)  # (B, Lt_max, r)
    scores = torch.bmm(q_padded, k.transpose(1, 2)) * scale  # (B, Lt_max, Lv)
    probs = torch.softmax(scores, dim=-1)  # (B, Lt_max, Lv)
    out_padded = torch.bmm(probs, v)  # (B, Lt_max, d)
    return out_padded[index_q]  # (T, d)


def _attention_packed(
    q: torch.Tensor,
    seqlens_q: tuple[int, ...],
    k: torch.Tensor,
    v: torch.Tensor,
    seqlens_k: tuple[int, ...],
    scale: float,
) -> torch.Tensor:
    """k (Tk, r), v (Tk, d) packed by ``seqlens_k``."""
    num_items, rank, value_dim = len(seqlens_q), k.shape[-1], v.shape[-1]
    if len(set(seqlens_k)) <= 1:  # one key length: a dense view, the unmasked path
        seqlen_k = seqlens_k[0] if seqlens_k else 0
        k_dense = k.view(num_items, seqlen_k, rank)  # (B, Lk, r)
        return _attention_dense(q, seqlens_q, k_dense, v.view(num_items, seqlen_k, value_dim), scale)
    if sum(seqlens_q) == 0:
        return q.new_empty((0, value_dim))  # (0, d)
    index_q, index_k = _pack_index(seqlens_q, q.device), _pack_index(seqlens_k, q.device)
    q_padded = _padded(q, seqlens_q, index_q)  # (B, Lt_max, r)
    k_padded = _padded(k, seqlens_k, index_k)  # (B, Lk_max, r)
    v_padded = _padded(v, seqlens_k, index_k)  # (B, Lk_max, d)
    lengths_k = torch.tensor(seqlens_k, device=q.device)  # (B,)
    is_pad = torch.arange(k_padded.shape[1], device=q.device) >= lengths_k[:, None]  # (B, Lk_max)
    is_pad = is_pad[:, None, :]  # (B, 1, Lk_max)
    scores = (torch.bmm(q_padded, k_padded.transpose(1, 2)) * scale).masked_fill(is_pad, float("-inf"))
    # An item without keys has only -inf scores, hence NaN probabilities: zeroing
    # the padding zeroes them, so it attends to nothing and outputs zeros. Where
    # there are keys the padding's probabilities are 0 already.
    probs = torch.softmax(scores, dim=-1).masked_fill(is_pad, 0.0)  # (B, Lt_max, Lk_max)
    out_padded = torch.bmm(probs, v_padded)  # (B, Lt_max, d)
    return out_padded[index_q]  # (T, d)


def _lowrank_cross_attention_kernel(
    Q,  # (T, r) packed queries
    K,  # (Tk, r) packed keys
    V,  # (Tk, d) packed values
    Out,  # (T, d)
    CuSeqlensQ,  # (B + 1,) int32 row offsets of each item in Q and Out
    CuSeqlensK,  # (B + 1,) int32 row offsets of each item in K and V
    stride_q_row,
    stride_k_row,
    stride_v_row,
    stride_out_row,
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
    key_start = tl.load(CuSeqlensK + item)
    seqlen_k = tl.load(CuSeqlensK + item + 1) - key_start  # this item's own key count, maybe 0
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

    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.full([BLOCK_M], 0.0, dtype=tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, dtype=tl.float32)
    for start_n in range(0, seqlen_k, BLOCK_N):
        cols = start_n + offs_n
        mask_n = cols < seqlen_k  # keys past the item's last belong to the next item: never attended
        key_rows = (key_start + cols).to(tl.int64)
        k_t = tl.load(
            K + key_rows[None, :] * stride_k_row + offs_r[:, None],
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
            V + key_rows[:, None] * stride_v_row + offs_d[None, :],
            mask=mask_n[:, None] & mask_d[None, :],
            other=0.0,
        ).to(DOT_DTYPE)  # (BLOCK_N, BLOCK_D)
        # P is rounded to the value dtype, as a half-precision P.V dot on the GPU does.
        probs = probs.to(V.dtype.element_ty).to(DOT_DTYPE)
        acc = acc * correction[:, None]
        acc = tl.dot(probs, v, acc, input_precision=DOT_PRECISION)
        row_max = new_max
    # row_sum >= 1 once any key was seen (the max's own term); 0 only for an item
    # without keys, whose acc is 0: divide by 1 there, and it outputs zeros.
    acc = acc / tl.where(row_sum > 0.0, row_sum, 1.0)[:, None]
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
    cu_seqlens_k: torch.Tensor | None = None,
    scale: float | None = None,
    backend: Backend | str = "auto",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per item softmax(q k^T * scale) v over packed queries; returns (T, d) in q's dtype.

    Keys and values are packed, k (Tk, r) and v (Tk, d) with ``cu_seqlens_k``
    (B+1,), or dense, k (B, Lv, r) and v (B, Lv, d) without it. An item with
    no keys outputs zeros. ``scale`` defaults to 1/sqrt(r). ``backend="auto"``
    runs the Triton kernel on CUDA and the torch reference elsewhere;
    ``"triton"`` / ``"torch"`` force one. ``out`` (T, d), if given, receives
    the result (preallocated serving buffers). The offsets may live on the CPU
    or on q's device; each is read on the host once to validate it and size
    the launch grid.
    """
    shape = check_inputs(q, cu_seqlens_q, k, v, cu_seqlens_k, scale, out)
    scale_value = shape.rank**-0.5 if scale is None else float(scale)
    chosen = resolve_backend(backend, q.device)
    if chosen is Backend.TORCH:
        if cu_seqlens_k is None:
            result = _attention_dense(q, shape.seqlens_q, k, v, scale_value)
        else:
            result = _attention_packed(q, shape.seqlens_q, k, v, shape.seqlens_k, scale_value)
        if out is None:
            return result
        return out.copy_(result)
    if out is None:
        out = q.new_empty((q.shape[0], shape.value_dim))  # (T, d)
    if cu_seqlens_k is None:  # dense as packed: item b's keys are rows b * Lv ...
        num_items, seqlen_k = k.shape[:2]
        k = k.reshape(num_items * seqlen_k, shape.rank)  # (B * Lv, r), a view unless k is strided per item
        v = v.reshape(num_items * seqlen_k, shape.value_dim)  # (B * Lv, d)
        cu_seqlens_k = torch.arange(0, num_items + 1, dtype=torch.int32) * seqlen_k  # (B + 1,)
    _launch(q, cu_seqlens_q, k, v, cu_seqlens_k, out, shape, scale_value)
    return out


def _launch(
    q: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    out: torch.Tensor,
    shape: AttentionShape,
    scale: float,
) -> None:
    if shape.max_seqlen_q == 0:
        return
    offsets_q = cu_seqlens_q.to(q.device, non_blocking=True)
    offsets_k = cu_seqlens_k.to(q.device, non_blocking=True)
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
            offsets_q,
            offsets_k,
            q.stride(0),
            k.stride(0),
            v.stride(0),
            out.stride(0),
            shape.rank,
            shape.value_dim,
            scale * math.log2(math.e),
            num_warps=config.num_warps,
            **meta,
        )


def _table_key(dtype: torch.dtype) -> str:
    """The launch table's entry for ``dtype`` (``kernels.backend.LAUNCH_TABLE``)."""
    return "lowrank_cross_attention/" + ("fp32" if dtype == torch.float32 else "half")


def _launch_meta(dtype: torch.dtype, shape: AttentionShape, is_interpret: bool,
                 config: LaunchConfig) -> dict[str, object]:
    """The kernel's constexpr arguments for one call: the table's tiles, BLOCK_M capped by the longest text.

    BLOCK_N is the table's whatever the key lengths, so ragged keys never add a variant.
    """
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
