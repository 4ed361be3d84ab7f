"""Ragged keys: each item attends over the tokens of its own 0 to 4 images, packed with ``cu_seqlens_k``.

The same bounds as the dense tests (fp32 to 1e-5 of the float64 reference,
fp16/bf16 within twice torch's own error plus roundoff, outputs poisoned with
NaN first), plus what packing must not change: each item equals the reference
run on that item alone, an item without keys outputs zeros, and dense keys are
packed keys of one length.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kernels import lowrank_cross_attention, lowrank_cross_attention_ref
from kernels.backend import launch_config
from kernels.lowrank_cross_attention import AttentionShape, _launch_meta, _table_key
from kernels_attention_inputs import (
    AttentionCase,
    RaggedCase,
    RaggedInputs,
    make_inputs,
    make_ragged_inputs,
    offsets,
    max_abs_error,
    relative_error,
)

FP32 = torch.float32
# Image token counts per item: none, one, several unequal; an item of exactly
# one key tile (64), tails of 1 and 65 past it; an item with keys but no text;
# a batch with no keys at all. Tk <= 256 in every case.
FP32_CASES = [
    RaggedCase((3, 1, 5, 2), ((40, 7), (), (13, 29, 5, 64), (70,)), rank=16, value_dim=48, dtype=FP32),
    RaggedCase((1, 9, 0), ((64,), (17, 17, 30), (5, 6)), rank=8, value_dim=64, dtype=FP32, scale=2.0),
    RaggedCase((20, 4), ((), ()), rank=32, value_dim=16, dtype=FP32),
    RaggedCase((2, 3, 1, 1, 4), ((1,), (), (100, 3), (2, 2, 2, 2), (65,)), rank=64, value_dim=200, dtype=FP32),
]
HALF_CASES = [
    RaggedCase((4, 2, 7), ((50, 9), (33,), (8, 16, 4, 1)), rank=16, value_dim=96, dtype=torch.float16),
    RaggedCase((1, 6, 3), ((), (70, 12, 3), (64, 64)), rank=32, value_dim=64, dtype=torch.bfloat16),
    RaggedCase((5, 5), ((30,), (7, 7, 7)), rank=16, value_dim=32, dtype=torch.bfloat16, scale=2.0),
]


def _run(inputs: RaggedInputs, backend: str, scale: float | None = None) -> torch.Tensor:
    out = torch.full((inputs.q.shape[0], inputs.v.shape[-1]), float("nan"), dtype=inputs.q.dtype)  # (T, d)
    result = lowrank_cross_attention(inputs.q, inputs.cu_seqlens_q, inputs.k, inputs.v,
                                     cu_seqlens_k=inputs.cu_seqlens_k, scale=scale, backend=backend, out=out)
    assert result.data_ptr() == out.data_ptr()
    assert torch.isfinite(result).all(), "some output elements were never written"
    return result


def _reference(inputs: RaggedInputs, scale: float | None = None) -> torch.Tensor:
    return lowrank_cross_attention_ref(inputs.q, inputs.cu_seqlens_q, inputs.k, inputs.v,
                                       cu_seqlens_k=inputs.cu_seqlens_k, scale=scale)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("case", FP32_CASES, ids=lambda c: c.case_id)
def test_fp32_matches_float64_reference(case: RaggedCase, backend: str) -> None:
    inputs = make_ragged_inputs(case)
    out = _run(inputs, backend, case.scale)
    expected = _reference(inputs.to(torch.float64), case.scale)
    assert out.shape == expected.shape == (sum(case.seqlens), case.value_dim)
    assert max_abs_error(out, expected) <= 1e-5 * max(expected.abs().max().item(), 1.0)


@pytest.mark.parametrize("case", HALF_CASES, ids=lambda c: c.case_id)
def test_half_error_is_bounded_by_torch_error(case: RaggedCase) -> None:
    inputs = make_ragged_inputs(case)
    out = _run(inputs, "triton", case.scale)
    expected = _reference(inputs.to(torch.float64), case.scale)
    torch_same_precision = _reference(inputs, case.scale)
    roundoff = torch.finfo(case.dtype).eps * expected.abs().max().item()
    assert max_abs_error(out, expected) <= 2 * max_abs_error(torch_same_precision, expected) + roundoff


@pytest.mark.parametrize("case", [FP32_CASES[0], FP32_CASES[3], HALF_CASES[1]], ids=lambda c: c.case_id)
def test_each_item_equals_the_reference_on_that_item_alone(case: RaggedCase) -> None:
    """Batched over ragged keys == the dense reference on one item and its own keys (its images concatenated)."""
    inputs = make_ragged_inputs(case)
    exact = inputs.to(torch.float64)
    batched = {backend: _run(inputs, backend) for backend in ("triton", "torch")}
    cu_q, cu_k = inputs.cu_seqlens_q.tolist(), inputs.cu_seqlens_k.tolist()
    for item, length in enumerate(case.seqlens):
        rows, keys = slice(cu_q[item], cu_q[item + 1]), slice(cu_k[item], cu_k[item + 1])
        alone = lowrank_cross_attention_ref(
            exact.q[rows], offsets((length,)), exact.k[keys][None], exact.v[keys][None]
        )  # (Lt, d), from dense keys (1, Lk, r)
        scale = max(alone.abs().max().item(), 1.0) if length else 1.0
        if case.dtype == FP32:
            bound = 1e-5 * scale
        else:
            same_dtype_alone = lowrank_cross_attention_ref(
                inputs.q[rows], offsets((length,)), inputs.k[keys][None], inputs.v[keys][None]
            )
            bound = 2 * max_abs_error(same_dtype_alone, alone) + torch.finfo(case.dtype).eps * scale
        for backend, out in batched.items():
            assert out[rows].shape == alone.shape
            if length:
                assert max_abs_error(out[rows], alone) <= bound, f"item {item} ({backend})"


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_items_without_keys_output_zeros_and_items_without_text_no_rows(backend: str) -> None:
    case = RaggedCase((2, 0, 3, 1), ((), (9, 4), (20, 1), ()), rank=16, value_dim=24, dtype=FP32)
    inputs = make_ragged_inputs(case)
    out = _run(inputs, backend)
    assert out.shape == (6, 24)
    assert (out[:2] == 0).all() and (out[5:] == 0).all()
    assert (out[2:5] != 0).any()
    assert relative_error(out, _reference(inputs.to(torch.float64))) <= 1e-5


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_dense_keys_are_packed_keys_of_one_length(backend: str) -> None:
    """Today's dense call and the packed call with offsets b * Lv compute the same bits."""
    dense = make_inputs(AttentionCase((3, 1, 17), seqlen_k=197, rank=16, value_dim=40, dtype=FP32))
    num_items, seqlen_k, rank = dense.k.shape
    packed_k = dense.k.reshape(num_items * seqlen_k, rank)  # (B * Lv, r)
    packed_v = dense.v.reshape(num_items * seqlen_k, -1)  # (B * Lv, d)
    cu_k = offsets((seqlen_k,) * num_items)
    from_dense = lowrank_cross_attention(dense.q, dense.cu_seqlens_q, dense.k, dense.v, backend=backend)
    from_packed = lowrank_cross_attention(dense.q, dense.cu_seqlens_q, packed_k, packed_v, cu_seqlens_k=cu_k,
                                          backend=backend)
    assert torch.equal(from_dense, from_packed)
    reference = lowrank_cross_attention_ref(dense.q, dense.cu_seqlens_q, packed_k, packed_v, cu_seqlens_k=cu_k)
    assert torch.equal(reference, lowrank_cross_attention_ref(dense.q, dense.cu_seqlens_q, dense.k, dense.v))


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_dense_keys_without_image_tokens_output_zeros(backend: str) -> None:
    dense = make_inputs(AttentionCase((2, 1), seqlen_k=17, rank=16, value_dim=8, dtype=FP32))
    empty = replace(dense, k=dense.k[:, :0], v=dense.v[:, :0])  # (B, 0, r), (B, 0, d)
    out = lowrank_cross_attention(empty.q, empty.cu_seqlens_q, empty.k, empty.v, backend=backend,
                                  out=torch.full((3, 8), float("nan")))
    assert torch.equal(out, torch.zeros(3, 8))


def test_kernel_reads_only_its_own_rows_of_strided_packed_views() -> None:
    """Packed keys and values as views into NaN-filled buffers: a read past r, d or Tk would poison the output."""
    case = RaggedCase((3, 1, 6), ((40, 7), (), (64, 2)), rank=8, value_dim=48, dtype=FP32)
    compact = make_ragged_inputs(case)
    total_k = compact.k.shape[0]
    k_buf = torch.full((total_k + 9, 8 + 8), float("nan"))  # (Tk + 9, r + 8)
    v_buf = torch.full((total_k + 9, 48 + 16), float("nan"))  # (Tk + 9, d + 16)
    k, v = k_buf[:total_k, :8], v_buf[:total_k, :48]
    k.copy_(compact.k)
    v.copy_(compact.v)
    strided = _run(replace(compact, k=k, v=v), "triton")
    assert torch.equal(strided, _run(compact, "triton"))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the NaN item, in numpy
def test_items_read_only_their_own_keys() -> None:
    """NaN keys of item 1 poison item 1's rows only, though item 0's last key tile runs into them."""
    case = RaggedCase((4, 2, 3), ((30,), (9, 11), (5,)), rank=16, value_dim=32, dtype=FP32)
    inputs = make_ragged_inputs(case)
    before = _run(inputs, "triton")
    k, v = inputs.k.clone(), inputs.v.clone()
    k[30:50] = float("nan")
    v[30:50] = float("nan")
    after = lowrank_cross_attention(inputs.q, inputs.cu_seqlens_q, k, v, cu_seqlens_k=inputs.cu_seqlens_k,
                                    backend="triton")
    assert torch.equal(after[:4], before[:4])
    assert torch.isnan(after[4:6]).all()
    assert torch.equal(after[6:], before[6:])


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_batches_without_items_return_empty_output(backend: str) -> None:
    out = lowrank_cross_attention(torch.randn(0, 16), offsets(()), torch.randn(0, 16), torch.randn(0, 8),
                                  cu_seqlens_k=offsets(()), backend=backend)
    assert out.shape == (0, 8)


def test_key_lengths_do_not_reach_the_kernel_variant() -> None:
    """The constexprs (the compile key) follow the longest text only: no key length makes a new variant."""
    config = launch_config(_table_key(torch.bfloat16), "sm90")
    variants = {
        tuple(_launch_meta(torch.bfloat16, AttentionShape(16, 1024, (77, 5), seqlens_k), False, config).items())
        for seqlens_k in [(197, 197), (0, 0), (1, 4 * 197), (3 * 197, 17), (0, 65)]
    }
    assert len(variants) == 1
