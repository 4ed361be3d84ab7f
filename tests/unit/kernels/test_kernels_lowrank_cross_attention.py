"""The low-rank cross-attention kernel against its torch reference computed in float64.

Each case draws fresh inputs from its own seed. fp32 must match the float64
reference to 1e-5 (relative to the largest output); fp16/bf16 may be off by at
most twice what torch's own same-precision computation is off, plus one unit
of roundoff at the output's scale (the FlashAttention test idiom). Outputs are
poisoned with NaN first, so an element the kernel forgot to write fails.
"""

from __future__ import annotations

import pytest
import torch

from kernels import lowrank_cross_attention, lowrank_cross_attention_ref
from kernels_attention_inputs import (
    AttentionCase,
    AttentionInputs,
    make_inputs,
    max_abs_error,
    offsets,
    relative_error,
)

FP32 = torch.float32
# Every rank and every Lv once; ragged lengths with 1 and 0; several row
# blocks (77 rows); value widths that leave a partial d-tile; large logits
# (scale=2) that make the running max move.
FP32_CASES = [
    AttentionCase((1, 7, 33), seqlen_k=197, rank=8, value_dim=64, dtype=FP32),
    AttentionCase((5, 1), seqlen_k=17, rank=16, value_dim=40, dtype=FP32),
    AttentionCase((77, 1, 12), seqlen_k=50, rank=32, value_dim=16, dtype=FP32),
    AttentionCase((3, 0, 1, 20), seqlen_k=196, rank=64, value_dim=200, dtype=FP32),
    AttentionCase((9, 2), seqlen_k=197, rank=16, value_dim=256, dtype=FP32, scale=2.0),
]
HALF_CASES = [
    AttentionCase((1, 13, 4), seqlen_k=197, rank=16, value_dim=96, dtype=torch.float16),
    AttentionCase((2, 1), seqlen_k=50, rank=64, value_dim=32, dtype=torch.float16),
    AttentionCase((1, 30, 6), seqlen_k=196, rank=8, value_dim=128, dtype=torch.bfloat16),
    AttentionCase((7, 1), seqlen_k=17, rank=32, value_dim=64, dtype=torch.bfloat16, scale=2.0),
]


def _run_triton_poisoned(inputs: AttentionInputs, scale: float | None) -> torch.Tensor:
    out = torch.full((inputs.q.shape[0], inputs.v.shape[-1]), float("nan"), dtype=inputs.q.dtype)  # (T, d)
    result = lowrank_cross_attention(
        inputs.q, inputs.cu_seqlens_q, inputs.k, inputs.v, scale=scale, backend="triton", out=out
    )
    assert result.data_ptr() == out.data_ptr()
    assert result.dtype == inputs.q.dtype
    assert torch.isfinite(result).all(), "some output elements were never written"
    return result


def _reference(inputs: AttentionInputs, scale: float | None) -> torch.Tensor:
    return lowrank_cross_attention_ref(inputs.q, inputs.cu_seqlens_q, inputs.k, inputs.v, scale=scale)


@pytest.mark.parametrize("case", FP32_CASES, ids=lambda c: c.case_id)
def test_fp32_kernel_matches_float64_reference(case: AttentionCase) -> None:
    inputs = make_inputs(case)
    out = _run_triton_poisoned(inputs, case.scale)
    expected = _reference(inputs.to(torch.float64), case.scale)
    assert out.shape == expected.shape == (sum(case.seqlens), case.value_dim)
    assert relative_error(out, expected) <= 1e-5


@pytest.mark.parametrize("case", HALF_CASES, ids=lambda c: c.case_id)
def test_half_kernel_error_is_bounded_by_torch_error(case: AttentionCase) -> None:
    inputs = make_inputs(case)
    out = _run_triton_poisoned(inputs, case.scale)
    expected = _reference(inputs.to(torch.float64), case.scale)
    torch_same_precision = _reference(inputs, case.scale)
    roundoff = torch.finfo(case.dtype).eps * expected.abs().max().item()
    assert max_abs_error(out, expected) <= 2 * max_abs_error(torch_same_precision, expected) + roundoff


def test_kernel_reads_only_its_own_rows_and_columns_of_strided_views() -> None:
    """Views into NaN-filled buffers: any read past T, Lv, r or d would poison the output."""
    case = AttentionCase((3, 1, 17), seqlen_k=197, rank=8, value_dim=48, dtype=FP32)
    compact = make_inputs(case)
    total, rank = compact.q.shape
    num_items, seqlen_k, value_dim = compact.v.shape
    nan = float("nan")
    q_buf = torch.full((total + 5, rank + 8), nan)  # (T + 5, r + 8)
    k_buf = torch.full((num_items, seqlen_k + 11, rank + 8), nan)  # (B, Lv + 11, r + 8)
    v_buf = torch.full((num_items, seqlen_k + 11, value_dim + 16), nan)  # (B, Lv + 11, d + 16)
    out_buf = torch.full((total, value_dim + 16), -7.0)  # (T, d + 16)
    q, k, v = q_buf[:total, :rank], k_buf[:, :seqlen_k, :rank], v_buf[:, :seqlen_k, :value_dim]
    q.copy_(compact.q)
    k.copy_(compact.k)
    v.copy_(compact.v)

    strided = lowrank_cross_attention(q, compact.cu_seqlens_q, k, v, backend="triton", out=out_buf[:, :value_dim])
    reference = lowrank_cross_attention(compact.q, compact.cu_seqlens_q, compact.k, compact.v, backend="triton")

    assert torch.equal(strided, reference)
    assert (out_buf[:, value_dim:] == -7.0).all(), "wrote past the output's last column"
    torch_strided = lowrank_cross_attention(q, compact.cu_seqlens_q, k, v, backend="torch")
    assert relative_error(torch_strided, reference) <= 1e-5


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the NaN item, in numpy
def test_items_are_independent() -> None:
    """NaN in one item's keys and values shows up in that item's rows and nowhere else."""
    case = AttentionCase((4, 1, 9), seqlen_k=50, rank=16, value_dim=32, dtype=FP32)
    inputs = make_inputs(case)
    before = lowrank_cross_attention(inputs.q, inputs.cu_seqlens_q, inputs.k, inputs.v, backend="triton")
    k, v = inputs.k.clone(), inputs.v.clone()
    k[1] = float("nan")
    v[1] = float("nan")
    after = lowrank_cross_attention(inputs.q, inputs.cu_seqlens_q, k, v, backend="triton")
    assert torch.equal(after[:4], before[:4])
    assert torch.isnan(after[4]).all()
    assert torch.equal(after[5:], before[5:])


def test_zero_length_items_produce_no_rows() -> None:
    case = AttentionCase((0, 3, 0), seqlen_k=17, rank=16, value_dim=24, dtype=FP32)
    inputs = make_inputs(case)
    out = _run_triton_poisoned(inputs, None)
    expected = _reference(inputs.to(torch.float64), None)
    assert out.shape == (3, 24)
    assert relative_error(out, expected) <= 1e-5


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("seqlens", [(0, 0), ()], ids=["all-empty", "no-items"])
def test_batches_without_text_rows_return_empty_output(backend: str, seqlens: tuple[int, ...]) -> None:
    num_items = len(seqlens)
    q = torch.randn(0, 16)  # (0, r)
    k = torch.randn(num_items, 17, 16)  # (B, Lv, r)
    v = torch.randn(num_items, 17, 8)  # (B, Lv, d)
    out = lowrank_cross_attention(q, offsets(seqlens), k, v, backend=backend)
    assert out.shape == (0, 8)
    assert out.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_auto_on_cpu_is_the_reference(dtype: torch.dtype) -> None:
    """The CPU serving path (backend="auto") is exactly the torch reference, even with the interpreter on."""
    inputs = make_inputs(AttentionCase((2, 1, 6), seqlen_k=197, rank=16, value_dim=64, dtype=dtype))
    auto = lowrank_cross_attention(inputs.q, inputs.cu_seqlens_q, inputs.k, inputs.v)
    assert torch.equal(auto, _reference(inputs, None))
    out = torch.full_like(auto, float("nan"))
    forced = lowrank_cross_attention(inputs.q, inputs.cu_seqlens_q, inputs.k, inputs.v, backend="torch", out=out)
    assert forced.data_ptr() == out.data_ptr()
    assert torch.equal(forced, auto)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_explicit_scale_is_used(backend: str) -> None:
    inputs = make_inputs(AttentionCase((3, 2), seqlen_k=50, rank=16, value_dim=32, dtype=FP32))
    scaled = lowrank_cross_attention(inputs.q, inputs.cu_seqlens_q, inputs.k, inputs.v, scale=0.9, backend=backend)
    default = lowrank_cross_attention(inputs.q, inputs.cu_seqlens_q, inputs.k, inputs.v, backend=backend)
    assert relative_error(scaled, _reference(inputs.to(torch.float64), 0.9)) <= 1e-5
    assert relative_error(default, _reference(inputs.to(torch.float64), 0.25)) <= 1e-5
    assert max_abs_error(scaled, default) > 1e-2
