"""JPEG batches decoded on the GPU (nvJPEG through ``torchvision.io.decode_jpeg(..., device="cuda")``).

    encoded bytes ─┬─ JPEG (FF D8 FF) ──> decode_jpeg(batch, device=cuda) ──> (3, H, W) uint8 on device ─┐
                   │                       refused by nvJPEG (progressive,                                ├─> resize + crop
                   │                       CMYK, corrupt, EXIF-rotated) ─┐                                │   to S x S on device
                   └─ PNG, WebP, ... ────────────────────────────────────┴─> Pillow on the CPU ──> upload ┘   -> (B, S, S, 3) uint8

Decoding is the largest CPU cost per image of a vision request (a 1080p
JPEG takes several milliseconds of libjpeg); nvJPEG decodes a batch in the
GPU's hardware/CUDA decoder and the pixels never cross the bus at full size.
The resize follows the model's ``PreprocessConfig`` geometry (shortest edge
then centre crop, or squash) with torch's antialiased interpolation, which is
close to Pillow's but not byte-equal: answers differ from CPU-decoded ones by
the decoders' IDCT rounding and the resampling, which the GPU script bounds
(cosine >= 0.9999 of the final embedding).

Images carrying an EXIF orientation other than "normal" go to Pillow, which
applies it (``ImageOps.exif_transpose``) as the CPU path does.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps

from models.loading.config import PreprocessConfig
from models.preprocessing import centre_offset, resize_to_model_input, shortest_edge_size

JPEG_MAGIC = b"\xff\xd8\xff"
_EXIF_ORIENTATION_TAG = 0x0112
_TORCH_MODES = {"bicubic": "bicubic", "bilinear": "bilinear", "nearest": "nearest"}


def is_jpeg(data: bytes) -> bool:
    return data[:3] == JPEG_MAGIC


def _has_rotation(data: bytes) -> bool:
    """Whether a JPEG's EXIF orientation asks for a rotation or flip (read from its header only)."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.getexif().get(_EXIF_ORIENTATION_TAG, 1) != 1
    except (OSError, SyntaxError, ValueError):
        return True  # unreadable: let the CPU path report it


def cpu_decode_to_input(data: bytes, preprocess: PreprocessConfig) -> np.ndarray:
    """The CPU path: Pillow decode, EXIF orientation, RGB, the model's resize -> (S, S, 3) uint8."""
    with Image.open(io.BytesIO(data)) as opened:
        image = ImageOps.exif_transpose(opened).convert("RGB")
    return resize_to_model_input(image, preprocess)


def resize_on_device(image: torch.Tensor, preprocess: PreprocessConfig) -> torch.Tensor:
    """(3, H, W) uint8 on any device -> (S, S, 3) uint8, the geometry of ``models.preprocessing``."""
    _, height, width = image.shape
    size = preprocess.input_size
    mode = _TORCH_MODES[preprocess.interpolation]
    if preprocess.resize_mode == "squash":
        target = (size, size)
    else:
        resized_w, resized_h = shortest_edge_size(width, height, preprocess.resize_size)
        target = (resized_h, resized_w)
    x = image.unsqueeze(0).float()  # (1, 3, H, W)
    x = F.interpolate(x, size=target, mode=mode, antialias=mode != "nearest",
                      align_corners=False if mode != "nearest" else None)  # (1, 3, h, w)
    if preprocess.resize_mode != "squash":
        top = centre_offset(target[0], size, preprocess.crop_rounding)
        left = centre_offset(target[1], size, preprocess.crop_rounding)
        x = x[:, :, top: top + size, left: left + size]  # (1, 3, S, S)
    return x.round().clamp(0, 255).to(torch.uint8)[0].permute(1, 2, 0).contiguous()  # (S, S, 3)


class DeviceJpegDecoder:
    """Batches of encoded images -> (B, S, S, 3) uint8 on ``device``: JPEGs by nvJPEG, the rest by Pillow."""

    def __init__(self, device: torch.device, preprocess: PreprocessConfig) -> None:
        self.device = device
        self.preprocess = preprocess
        self.num_device_decoded = 0
        self.num_cpu_decoded = 0

    def decode(self, images: Sequence[bytes]) -> torch.Tensor:
        from torchvision.io import ImageReadMode, decode_jpeg

        out = torch.empty((len(images), self.preprocess.input_size, self.preprocess.input_size, 3),
                          dtype=torch.uint8, device=self.device)  # (B, S, S, 3)
        on_device = [i for i, data in enumerate(images) if is_jpeg(data) and not _has_rotation(data)]
        decoded: list[torch.Tensor | None] = [None] * len(on_device)
        if on_device:
            encoded = [torch.frombuffer(bytearray(images[i]), dtype=torch.uint8) for i in on_device]
            try:
                decoded = list(decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device))
            except RuntimeError:  # one refused image fails the batch call: decode one by one
                decoded = [self._decode_one(decode_jpeg, data) for data in encoded]
        for index, image in zip(on_device, decoded, strict=True):
            if image is not None:
                out[index] = resize_on_device(image, self.preprocess)
                self.num_device_decoded += 1
        for index in range(len(images)):
            if index in on_device and decoded[on_device.index(index)] is not None:
                continue
            pixels = cpu_decode_to_input(images[index], self.preprocess)
            out[index] = torch.from_numpy(pixels).to(self.device)
            self.num_cpu_decoded += 1
        return out

    def _decode_one(self, decode_jpeg, data: torch.Tensor) -> torch.Tensor | None:
        from torchvision.io import ImageReadMode

        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:
            return None  # nvJPEG refuses it: Pillow decodes it
