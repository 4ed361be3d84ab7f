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

The request intake (``router.intake``, ``--decode-device cuda``) calls
``decode_to_input``, which stops short of Pillow: it answers None for what it
does not decode, and the intake's own CPU decoder (the server's, with its
pixel limit and 4xx errors) takes those. Its result comes back to the host as
(S, S, 3) uint8 in one copy per batch, so the vision lane gets the same input
either way and uploads it through the pinned staging slots (``models.device``).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps

from models.loading.config import PreprocessConfig
from models.preprocessing import centre_offset, resize_to_model_input, shortest_edge_size

JPEG_MAGIC = b"\xff\xd8\xff"
_EXIF_ORIENTATION_TAG = 0x0112
_DEVICE_MODES = ("RGB", "L")  # CMYK, YCCK and the rest: Pillow converts them as the CPU path does
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
    """Batches of encoded images -> the model's (S, S, 3) uint8 input, JPEGs decoded on ``device``.

    Two ways in: ``decode`` (the benchmark's: every image, Pillow for what
    nvJPEG does not take, a (B, S, S, 3) tensor on the device) and
    ``decode_to_input`` (the request intake's: only what this decoder takes,
    ``None`` for the rest, which the caller's own CPU decoder then decodes
    with its own checks and errors). An image it takes is a JPEG whose header
    says RGB or greyscale, no EXIF rotation and at most ``max_pixels`` pixels
    (a decompression bomb is never handed to nvJPEG).

    Decodes are serialised by a lock: the device has one nvJPEG engine, and
    a batch is the unit it is fast at.
    """

    def __init__(self, device: torch.device, preprocess: PreprocessConfig, max_pixels: int | None = None) -> None:
        self.device = device
        self.preprocess = preprocess
        self.max_pixels = max_pixels
        self.num_device_decoded = 0
        self.num_cpu_decoded = 0
        self.num_left_to_caller = 0  # decode_to_input: images it did not take or nvJPEG refused
        self._lock = threading.Lock()

    @staticmethod
    def accepts(data: bytes) -> bool:
        """Worth handing to this decoder (a JPEG by its magic bytes); it may still leave it to the caller."""
        return is_jpeg(data)

    def _takes(self, data: bytes) -> bool:
        """A JPEG nvJPEG decodes as the CPU path would, under the pixel limit (header only, no pixel decoded)."""
        if not is_jpeg(data):
            return False
        try:
            with Image.open(io.BytesIO(data)) as image:
                return (image.mode in _DEVICE_MODES
                        and image.getexif().get(_EXIF_ORIENTATION_TAG, 1) == 1
                        and (self.max_pixels is None or image.width * image.height <= self.max_pixels))
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
            return False  # unreadable: the CPU path reports it

    def _decode_jpegs(self, images: Sequence[bytes]) -> list[torch.Tensor | None]:
        """Each JPEG as (3, H, W) uint8 on the device, in one batch call; None for each nvJPEG refuses."""
        from torchvision.io import ImageReadMode, decode_jpeg

        if not images:
            return []
        encoded = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in images]
        try:
            return list(decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device))
        except RuntimeError:  # one refused image fails the batch call: decode one by one
            return [self._decode_one(decode_jpeg, data) for data in encoded]

    def decode_to_input(self, images: Sequence[bytes]) -> list[np.ndarray | None]:
        """Each image it takes as the model's (S, S, 3) uint8 input on the host; None for each left to the caller.

        One nvJPEG batch call, the resize on the device, and one
        device-to-host copy of the (n, S, S, 3) result: the full-size pixels
        never leave the device.
        """
        taken = [i for i, data in enumerate(images) if self._takes(data)]
        out: list[np.ndarray | None] = [None] * len(images)
        with self._lock:
            decoded = self._decode_jpegs([images[i] for i in taken])
            kept = [(index, image) for index, image in zip(taken, decoded, strict=True) if image is not None]
            if kept:
                batch = torch.stack([resize_on_device(image, self.preprocess) for _, image in kept])  # (n, S, S, 3)
                host = batch.cpu().numpy()
                for row, (index, _) in enumerate(kept):
                    out[index] = host[row]  # (S, S, 3)
            self.num_device_decoded += len(kept)
            self.num_left_to_caller += len(images) - len(kept)
        return out

    def decode(self, images: Sequence[bytes]) -> torch.Tensor:
        """Every image as (B, S, S, 3) uint8 on the device: JPEGs by nvJPEG, the rest (and its refusals) by Pillow."""
        out = torch.empty((len(images), self.preprocess.input_size, self.preprocess.input_size, 3),
                          dtype=torch.uint8, device=self.device)  # (B, S, S, 3)
        on_device = [i for i, data in enumerate(images) if is_jpeg(data) and not _has_rotation(data)]
        with self._lock:
            decoded = self._decode_jpegs([images[i] for i in on_device])
        for index, image in zip(on_device, decoded, strict=True):
            if image is not None:
                out[index] = resize_on_device(image, self.preprocess)
                self.num_device_decoded += 1
        done = {index for index, image in zip(on_device, decoded, strict=True) if image is not None}
        for index in range(len(images)):
            if index in done:
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
