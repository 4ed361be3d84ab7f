"""Every input rule of the two launchers fails with a clear, typed error (on any backend)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

from kernels import KernelInputError, lowrank_cross_attention, preprocess_uint8
from kernels_attention_inputs import (
    AttentionCase,
    AttentionInputs,
    RaggedCase,
    RaggedInputs,
    make_inputs,
    make_ragged_inputs,
)

_VALID = AttentionCase((2, 1), seqlen_k=17, rank=16, value_dim=8, dtype=torch.float32)
_VALID_RAGGED = RaggedCase((2, 1), ((9, 4), ()), rank=16, value_dim=8, dtype=torch.float32)  # Tk = 13


def _cu(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


# (id, how to break valid inputs, a fragment the message must contain)
ATTENTION_BREAKAGES: list[tuple[str, Callable[[AttentionInputs], AttentionInputs], str]] = [
    ("q-float64", lambda x: replace(x, q=x.q.double()), "q dtype"),
    ("k-other-dtype", lambda x: replace(x, k=x.k.half()), "share one dtype"),
    ("q-3d", lambda x: replace(x, q=x.q[None]), "q must be 2-D"),
    ("k-2d", lambda x: replace(x, k=x.k[0]), "k must be 3-D"),
    ("rank-mismatch", lambda x: replace(x, q=x.q[:, :8].contiguous()), "rank"),
    ("rank-above-64", lambda x: replace(x, q=torch.randn(3, 80), k=torch.randn(2, 17, 80)), "rank r must be in"),
    ("v-other-Lv", lambda x: replace(x, v=x.v[:, :5]), "must match k's"),
    ("q-strided-last-dim", lambda x: replace(x, q=x.q.t().contiguous().t()), "q must be contiguous"),
    ("v-strided-last-dim", lambda x: replace(x, v=x.v.transpose(1, 2).contiguous().transpose(1, 2)), "v must be"),
    ("cu-int64", lambda x: replace(x, cu_seqlens_q=x.cu_seqlens_q.long()), "int32"),
    ("cu-too-short", lambda x: replace(x, cu_seqlens_q=_cu(0, 3)), "(B + 1,)"),
    ("cu-2d", lambda x: replace(x, cu_seqlens_q=x.cu_seqlens_q[None]), "(B + 1,)"),
    ("cu-not-from-0", lambda x: replace(x, cu_seqlens_q=_cu(1, 2, 3)), "start at 0"),
    ("cu-decreasing", lambda x: replace(x, cu_seqlens_q=_cu(0, 4, 3)), "non-decreasing"),
    ("cu-wrong-total", lambda x: replace(x, cu_seqlens_q=_cu(0, 1, 2)), "end at q's row count"),
    ("device-mismatch", lambda x: replace(x, k=x.k.to("meta")), "one device"),
]


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize(
    ("breakage", "fragment"), [(b, f) for _, b, f in ATTENTION_BREAKAGES], ids=[i for i, _, _ in ATTENTION_BREAKAGES]
)
def test_attention_rejects_bad_inputs(
    breakage: Callable[[AttentionInputs], AttentionInputs], fragment: str, backend: str
) -> None:
    bad = breakage(make_inputs(_VALID))
    with pytest.raises(KernelInputError, match=fragment.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        lowrank_cross_attention(bad.q, bad.cu_seqlens_q, bad.k, bad.v, backend=backend)


# Packed keys: the same rules for cu_seqlens_k, checked against k's rows and cu_seqlens_q's items.
RAGGED_BREAKAGES: list[tuple[str, Callable[[RaggedInputs], RaggedInputs], str]] = [
    ("k-3d", lambda x: replace(x, k=x.k[None]), "k must be 2-D (Tk, r) with cu_seqlens_k"),
    ("v-3d", lambda x: replace(x, v=x.v[None]), "v must be 2-D (Tk, d) with cu_seqlens_k"),
    ("v-other-Tk", lambda x: replace(x, v=x.v[:12]), "v has 12 rows (Tk) but k has 13"),
    ("k-strided-last-dim", lambda x: replace(x, k=x.k.t().contiguous().t()), "k must be contiguous"),
    ("cu-k-int64", lambda x: replace(x, cu_seqlens_k=x.cu_seqlens_k.long()), "cu_seqlens_k must be int32"),
    ("cu-k-too-long", lambda x: replace(x, cu_seqlens_k=_cu(0, 9, 13, 13)),
     "cu_seqlens_k must have shape (B + 1,) = (3,)"),
    ("cu-k-2d", lambda x: replace(x, cu_seqlens_k=x.cu_seqlens_k[None]), "cu_seqlens_k must have shape (B + 1,)"),
    ("cu-k-not-from-0", lambda x: replace(x, cu_seqlens_k=_cu(1, 9, 13)), "cu_seqlens_k must start at 0"),
    ("cu-k-decreasing", lambda x: replace(x, cu_seqlens_k=_cu(0, 14, 13)), "cu_seqlens_k must be non-decreasing"),
    ("cu-k-wrong-total", lambda x: replace(x, cu_seqlens_k=_cu(0, 9, 12)), "cu_seqlens_k must end at k's row count 13"),
    ("cu-k-device", lambda x: replace(x, cu_seqlens_k=x.cu_seqlens_k.to("meta")), "cu_seqlens_k must be on the CPU"),
    ("cu-q-0d", lambda x: replace(x, cu_seqlens_q=_cu(0)[0]), "cu_seqlens_q must have shape (B + 1,)"),
    ("cu-q-wrong-total", lambda x: replace(x, cu_seqlens_q=_cu(0, 2, 2)), "cu_seqlens_q must end at q's row count"),
]


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize(
    ("breakage", "fragment"), [(b, f) for _, b, f in RAGGED_BREAKAGES], ids=[i for i, _, _ in RAGGED_BREAKAGES]
)
def test_attention_rejects_bad_packed_keys(
    breakage: Callable[[RaggedInputs], RaggedInputs], fragment: str, backend: str
) -> None:
    bad = breakage(make_ragged_inputs(_VALID_RAGGED))
    with pytest.raises(KernelInputError, match=re.escape(fragment)):
        lowrank_cross_attention(bad.q, bad.cu_seqlens_q, bad.k, bad.v, cu_seqlens_k=bad.cu_seqlens_k, backend=backend)


def test_cu_seqlens_k_must_be_a_tensor() -> None:
    x = make_ragged_inputs(_VALID_RAGGED)
    with pytest.raises(KernelInputError, match="cu_seqlens_k must be a torch.Tensor, got list"):
        lowrank_cross_attention(x.q, x.cu_seqlens_q, x.k, x.v, cu_seqlens_k=[0, 13, 13])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"scale": float("nan")}, "scale must be a finite number"),
        ({"scale": "0.5"}, "scale must be a finite number"),
        ({"backend": "cuda"}, "backend must be one of"),
        ({"out": torch.empty(3, 9)}, "out must have shape"),
        ({"out": torch.empty(3, 8, dtype=torch.float16)}, "out dtype"),
        ({"out": torch.empty(8, 3).t()}, "out must be contiguous"),
    ],
    ids=["nan-scale", "str-scale", "unknown-backend", "out-shape", "out-dtype", "out-strided"],
)
def test_attention_rejects_bad_options(kwargs: dict[str, object], fragment: str) -> None:
    x = make_inputs(_VALID)
    with pytest.raises(KernelInputError, match=fragment):
        lowrank_cross_attention(x.q, x.cu_seqlens_q, x.k, x.v, **kwargs)  # type: ignore[arg-type]


def test_input_errors_are_value_errors() -> None:
    """Callers that only know the builtins still catch them."""
    x = make_inputs(_VALID)
    with pytest.raises(ValueError):
        lowrank_cross_attention(x.q.double(), x.cu_seqlens_q, x.k, x.v)


MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
IMAGES = torch.zeros(2, 4, 6, 3, dtype=torch.uint8)
PREPROCESS_BREAKAGES: list[tuple[str, dict[str, object], str]] = [
    ("float-images", {"images": IMAGES.float()}, "must be uint8"),
    ("four-channels", {"images": torch.zeros(2, 4, 6, 4, dtype=torch.uint8)}, r"\(B, H, W, 3\)"),
    ("unbatched", {"images": IMAGES[0]}, r"\(B, H, W, 3\)"),
    ("non-contiguous", {"images": IMAGES.transpose(1, 2)}, "must be contiguous"),
    ("two-means", {"mean": (0.5, 0.5)}, "mean must be 3"),
    ("text-mean", {"mean": "abc"}, "mean must be 3"),
    ("zero-std", {"std": (0.2, 0.0, 0.2)}, "std must be positive"),
    ("int-out-dtype", {"out_dtype": torch.int32}, "out_dtype must be one of"),
    ("out-shape", {"out": torch.empty(2, 4, 6, 3)}, "out must have shape"),
    ("out-dtype", {"out": torch.empty(2, 3, 4, 6, dtype=torch.float16)}, "out dtype"),
    ("out-strided", {"out": torch.empty(2, 3, 6, 4).transpose(2, 3)}, "out must be contiguous"),
    ("unknown-backend", {"backend": "numpy"}, "backend must be one of"),
]


@pytest.mark.parametrize(("overrides", "fragment"), [(o, f) for _, o, f in PREPROCESS_BREAKAGES],
                         ids=[i for i, _, _ in PREPROCESS_BREAKAGES])
def test_preprocess_rejects_bad_inputs(overrides: dict[str, object], fragment: str) -> None:
    kwargs: dict[str, object] = {"images": IMAGES, "mean": MEAN, "std": STD, "out_dtype": torch.float32}
    kwargs.update(overrides)
    with pytest.raises(KernelInputError, match=fragment):
        preprocess_uint8(**kwargs)  # type: ignore[arg-type]
