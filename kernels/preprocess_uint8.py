"""Image ingest: uint8 (B, H, W, 3) pixels -> normalised planar (B, 3, H, W).

    out[b, c, h, w] = (images[b, h, w, c] / 255 - mean[c]) / std[c]

What is fused, and why it saves memory traffic: images travel from the client,
through batching and over the host-to-device link as uint8, a quarter of the
bytes of a float32 batch. The torch path on the device would convert to float
(write 4 bytes per value), permute to planar (read 4, write 4), then subtract
and divide (read 4, write 4 each) -- five passes over a float tensor. The
kernel reads each uint8 value once, applies one fused multiply-add per channel
with constants folded on the host (x * 1/(255 std) - mean/std) in fp32, and
writes the planar output once in ``out_dtype``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels.backend import Backend, device_arch, jit_kernel, launch_config, resolve_backend, tl, triton
from kernels.errors import KernelInputError

SUPPORTED_OUT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
NUM_CHANNELS = 3
MAX_NUM_IMAGES = 65535  # the CUDA grid's second axis


@dataclass(frozen=True)
class _ChannelAffine:
    """Per-channel ``x * scale + shift`` equal to ``(x / 255 - mean) / std``."""

    scale: tuple[float, float, float]
    shift: tuple[float, float, float]

    @classmethod
    def from_mean_std(cls, mean: Sequence[float], std: Sequence[float]) -> _ChannelAffine:
        scale = tuple(1.0 / (255.0 * s) for s in std)
        shift = tuple(-m / s for m, s in zip(mean, std, strict=True))
        return cls(scale=scale, shift=shift)  # type: ignore[arg-type]


def preprocess_uint8_ref(
    images: torch.Tensor,
    mean: Sequence[float],
    std: Sequence[float],
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """Torch reference, and the CPU serving path: the formula as written, in fp32.

    Computes in float64 when ``out_dtype`` is float64 (the tests' high-precision
    reference). Inputs are assumed valid; ``preprocess_uint8`` checks them.
    """
    compute_dtype = torch.float64 if out_dtype == torch.float64 else torch.float32
    mean_t = torch.tensor(mean, dtype=compute_dtype, device=images.device).view(1, NUM_CHANNELS, 1, 1)
    std_t = torch.tensor(std, dtype=compute_dtype, device=images.device).view(1, NUM_CHANNELS, 1, 1)
    planar = images.permute(0, 3, 1, 2)  # (B, 3, H, W), a strided view
    x = planar.to(compute_dtype, memory_format=torch.contiguous_format)  # (B, 3, H, W)
    x.div_(255.0).sub_(mean_t).div_(std_t)
    return x.to(out_dtype)


def _preprocess_uint8_kernel(
    Images,  # (B, H, W, 3) uint8, contiguous
    Out,  # (B, 3, H, W), contiguous
    num_pixels,  # H * W
    scale_0,
    scale_1,
    scale_2,
    shift_0,
    shift_1,
    shift_2,
    BLOCK: tl.constexpr,
):
    # One program: BLOCK pixels of one image, all three channels.
    pid = tl.program_id(0)
    image = tl.program_id(1).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_pixels
    src = Images + image * num_pixels * 3 + offs * 3  # interleaved RGB
    dst = Out + image * num_pixels * 3 + offs  # channel planes num_pixels apart
    red = tl.load(src, mask=mask, other=0).to(tl.float32)
    green = tl.load(src + 1, mask=mask, other=0).to(tl.float32)
    blue = tl.load(src + 2, mask=mask, other=0).to(tl.float32)
    out_ty = Out.dtype.element_ty
    tl.store(dst, (red * scale_0 + shift_0).to(out_ty), mask=mask)
    tl.store(dst + num_pixels, (green * scale_1 + shift_1).to(out_ty), mask=mask)
    tl.store(dst + 2 * num_pixels, (blue * scale_2 + shift_2).to(out_ty), mask=mask)


def preprocess_uint8(
    images: torch.Tensor,
    mean: Sequence[float],
    std: Sequence[float],
    out_dtype: torch.dtype,
    *,
    backend: Backend | str = "auto",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B, H, W, 3) uint8 -> (B, 3, H, W) ``(x/255 - mean)/std`` in ``out_dtype``.

    ``mean`` / ``std`` are three floats each, per channel (timm's data config).
    ``backend="auto"`` runs the Triton kernel on CUDA and the torch reference
    elsewhere; ``"triton"`` / ``"torch"`` force one. ``out``, if given, receives
    the result and must be a contiguous (B, 3, H, W) tensor of ``out_dtype``.
    """
    mean_values, std_values = _check_inputs(images, mean, std, out_dtype, out)
    chosen = resolve_backend(backend, images.device)
    if chosen is Backend.TORCH:
        result = preprocess_uint8_ref(images, mean_values, std_values, out_dtype)
        if out is None:
            return result
        return out.copy_(result)
    num_images, height, width, _ = images.shape
    if out is None:
        out = torch.empty((num_images, NUM_CHANNELS, height, width), dtype=out_dtype, device=images.device)
    _launch(images, out, _ChannelAffine.from_mean_std(mean_values, std_values))
    return out


def _launch(images: torch.Tensor, out: torch.Tensor, affine: _ChannelAffine) -> None:
    num_images, height, width, _ = images.shape
    num_pixels = height * width
    if num_images == 0 or num_pixels == 0:
        return
    config = launch_config("preprocess_uint8", device_arch(images.device))
    grid = (triton.cdiv(num_pixels, config.tiles["BLOCK"]), num_images)
    kernel = jit_kernel(_preprocess_uint8_kernel)
    with torch.cuda.device(images.device) if images.device.type == "cuda" else contextlib.nullcontext():
        kernel[grid](
            images,
            out,
            num_pixels,
            *affine.scale,
            *affine.shift,
            num_warps=config.num_warps,
            **config.tiles,
        )


def _check_inputs(
    images: torch.Tensor,
    mean: Sequence[float],
    std: Sequence[float],
    out_dtype: torch.dtype,
    out: torch.Tensor | None,
) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """Every shape, dtype, stride and value rule; returns mean and std as float triples."""
    if not isinstance(images, torch.Tensor):
        raise KernelInputError(f"images must be a torch.Tensor, got {type(images).__name__}")
    if images.dtype != torch.uint8:
        raise KernelInputError(f"images must be uint8, got {images.dtype}")
    if images.dim() != 4 or images.shape[-1] != NUM_CHANNELS:
        raise KernelInputError(f"images must have shape (B, H, W, 3), got {tuple(images.shape)}")
    if not images.is_contiguous():
        raise KernelInputError(f"images must be contiguous (B, H, W, 3), got strides {tuple(images.stride())}")
    if images.shape[0] > MAX_NUM_IMAGES:
        raise KernelInputError(f"at most {MAX_NUM_IMAGES} images per call, got {images.shape[0]}")
    if out_dtype not in SUPPORTED_OUT_DTYPES:
        raise KernelInputError(f"out_dtype must be one of {SUPPORTED_OUT_DTYPES}, got {out_dtype}")
    mean_values = _channel_triple("mean", mean)
    std_values = _channel_triple("std", std)
    if any(s <= 0.0 for s in std_values):
        raise KernelInputError(f"std must be positive in every channel, got {std_values}")
    if out is not None:
        num_images, height, width, _ = images.shape
        expected = (num_images, NUM_CHANNELS, height, width)
        if tuple(out.shape) != expected:
            raise KernelInputError(f"out must have shape {expected}, got {tuple(out.shape)}")
        if out.dtype != out_dtype:
            raise KernelInputError(f"out dtype must be out_dtype {out_dtype}, got {out.dtype}")
        if out.device != images.device:
            raise KernelInputError(f"out must be on the images' device {images.device}, got {out.device}")
        if not out.is_contiguous():
            raise KernelInputError(f"out must be contiguous, got strides {tuple(out.stride())}")
    return mean_values, std_values


def _channel_triple(name: str, values: Sequence[float]) -> tuple[float, float, float]:
    try:
        triple = tuple(float(value) for value in values)
    except (TypeError, ValueError) as e:
        raise KernelInputError(f"{name} must be {NUM_CHANNELS} numbers, got {values!r}") from e
    if len(triple) != NUM_CHANNELS or not all(math.isfinite(value) for value in triple):
        raise KernelInputError(f"{name} must be {NUM_CHANNELS} finite numbers, got {values!r}")
    return triple  # type: ignore[return-value]
