"""The uint8 ingest kernel against its torch reference computed in float64."""

from __future__ import annotations

import zlib

import pytest
import torch

from kernels import preprocess_uint8, preprocess_uint8_ref

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
HALF_MEAN_STD = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))  # timm's "inception" normalisation


def _images(num_images: int, height: int, width: int) -> torch.Tensor:
    seed = zlib.crc32(f"{num_images}x{height}x{width}".encode())
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (num_images, height, width, 3), generator=gen, dtype=torch.uint8)


def _run_triton_poisoned(
    images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...], out_dtype: torch.dtype
) -> torch.Tensor:
    num_images, height, width, _ = images.shape
    out = torch.full((num_images, 3, height, width), float("nan"), dtype=out_dtype)
    result = preprocess_uint8(images, mean, std, out_dtype, backend="triton", out=out)
    assert result.data_ptr() == out.data_ptr()
    assert torch.isfinite(result).all(), "some output elements were never written"
    return result


# 48 x 32 = 1536 pixels: one full pixel block and a partial one.
SHAPES = [(2, 5, 7), (1, 48, 32)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mean_std", [(IMAGENET_MEAN, IMAGENET_STD), HALF_MEAN_STD], ids=["imagenet", "half"])
def test_fp32_kernel_matches_float64_reference(
    shape: tuple[int, int, int], mean_std: tuple[tuple[float, ...], tuple[float, ...]]
) -> None:
    images = _images(*shape)
    mean, std = mean_std
    out = _run_triton_poisoned(images, mean, std, torch.float32)
    expected = preprocess_uint8_ref(images, mean, std, torch.float64)
    assert out.shape == (shape[0], 3, shape[1], shape[2])
    assert out.is_contiguous()
    assert out.dtype == torch.float32
    error = (out.double() - expected).abs().max().item()
    assert error <= 1e-5 * expected.abs().max().item()


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
def test_half_kernel_error_is_bounded_by_torch_error(out_dtype: torch.dtype) -> None:
    """Within twice torch's own rounding error plus half an ulp at the output's scale.

    The half ulp is for the interpreter, which narrows fp32 to bf16 by
    truncation where the GPU rounds to nearest.
    """
    images = _images(1, 48, 32)
    out = _run_triton_poisoned(images, IMAGENET_MEAN, IMAGENET_STD, out_dtype)
    expected = preprocess_uint8_ref(images, IMAGENET_MEAN, IMAGENET_STD, torch.float64)
    torch_same_precision = preprocess_uint8_ref(images, IMAGENET_MEAN, IMAGENET_STD, out_dtype)
    assert out.dtype == out_dtype
    torch_error = (torch_same_precision.double() - expected).abs().max().item()
    half_ulp = 0.5 * torch.finfo(out_dtype).eps * expected.abs().max().item()
    assert (out.double() - expected).abs().max().item() <= 2 * torch_error + half_ulp


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_channels_land_in_their_own_planes(backend: str) -> None:
    images = torch.empty(2, 3, 4, 3, dtype=torch.uint8)
    images[..., 0], images[..., 1], images[..., 2] = 0, 51, 255
    out = preprocess_uint8(images, (0.1, 0.2, 0.3), (0.5, 0.25, 2.0), torch.float32, backend=backend)
    expected = [(0 / 255 - 0.1) / 0.5, (51 / 255 - 0.2) / 0.25, (255 / 255 - 0.3) / 2.0]
    for channel, value in enumerate(expected):
        assert torch.allclose(out[:, channel], torch.full((2, 3, 4), value), rtol=0, atol=1e-6)


def test_kernel_writes_nothing_past_its_output() -> None:
    images = _images(2, 5, 7)
    buffer = torch.full((3, 3, 5, 7), -7.0)  # one spare image after the output
    preprocess_uint8(images, IMAGENET_MEAN, IMAGENET_STD, torch.float32, backend="triton", out=buffer[:2])
    assert (buffer[2] == -7.0).all()
    assert (buffer[:2] != -7.0).all()


def test_auto_on_cpu_is_the_reference() -> None:
    images = _images(2, 5, 7)
    auto = preprocess_uint8(images, IMAGENET_MEAN, IMAGENET_STD, torch.bfloat16)
    assert torch.equal(auto, preprocess_uint8_ref(images, IMAGENET_MEAN, IMAGENET_STD, torch.bfloat16))


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_empty_batch_gives_empty_output(backend: str) -> None:
    images = torch.empty(0, 4, 6, 3, dtype=torch.uint8)
    out = preprocess_uint8(images, IMAGENET_MEAN, IMAGENET_STD, torch.float16, backend=backend)
    assert out.shape == (0, 3, 4, 6)
    assert out.dtype == torch.float16
