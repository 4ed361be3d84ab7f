"""Which images the device JPEG decoder takes and which go to Pillow, and how close its pixels are.

torchvision's ``decode_jpeg`` runs on the CPU too (libjpeg), so the routing
(JPEG to the batch decoder, PNG, EXIF-rotated and corrupt JPEGs to Pillow) and
the on-device resize run here with ``device="cpu"``; the GPU script compares
nvJPEG's answers with the CPU-decoded ones on a real device.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch
from PIL import Image

from encoded_images import encode, gradient_image

from models.jpeg_decode import DeviceJpegDecoder, cpu_decode_to_input, is_jpeg
from models.loading.config import PreprocessConfig

SIGLIP_LIKE = PreprocessConfig(input_size=32, resize_size=32, interpolation="bicubic", resize_mode="squash")
CLIP_LIKE = PreprocessConfig(input_size=32, resize_size=32, interpolation="bicubic", resize_mode="shortest_edge",
                             crop_rounding="floor")


def _smooth_image(width: int, height: int) -> Image.Image:
    return gradient_image((width, height))


_encoded = encode


def test_jpegs_are_decoded_by_the_batch_decoder_and_others_by_pillow():
    decoder = DeviceJpegDecoder(torch.device("cpu"), SIGLIP_LIKE)
    jpeg = _encoded(_smooth_image(64, 48), "JPEG", quality=95)
    png = _encoded(_smooth_image(40, 40), "PNG")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees
    rotated = _encoded(_smooth_image(64, 48), "JPEG", quality=95, exif=exif.tobytes())
    corrupt = jpeg[:3] + b"\x00" * 64
    assert is_jpeg(jpeg) and not is_jpeg(png)
    batch = decoder.decode([jpeg, png, rotated])
    assert batch.shape == (3, 32, 32, 3) and batch.dtype == torch.uint8
    assert (decoder.num_device_decoded, decoder.num_cpu_decoded) == (1, 2)
    np.testing.assert_array_equal(batch[1].numpy(), cpu_decode_to_input(png, SIGLIP_LIKE))
    np.testing.assert_array_equal(batch[2].numpy(), cpu_decode_to_input(rotated, SIGLIP_LIKE))  # rotated by Pillow
    with pytest.raises(OSError):  # refused by nvJPEG's stand-in, then by Pillow: the caller's 400
        decoder.decode([corrupt])
    assert decoder.num_device_decoded == 1


def test_device_pixels_are_close_to_pillows_for_both_geometries():
    for preprocess in (SIGLIP_LIKE, CLIP_LIKE):
        decoder = DeviceJpegDecoder(torch.device("cpu"), preprocess)
        jpeg = _encoded(_smooth_image(120, 80), "JPEG", quality=95)
        ours = decoder.decode([jpeg])[0].numpy().astype(np.int16)
        pillow = cpu_decode_to_input(jpeg, preprocess).astype(np.int16)
        assert np.abs(ours - pillow).mean() < 2.0  # IDCT rounding and resampling, not a different picture
        assert np.abs(ours - pillow).max() <= 24


def test_decode_to_input_takes_only_what_decodes_as_the_cpu_path_does():
    """RGB and grey JPEGs under the pixel limit come back; the rest is None, for the caller's CPU decoder."""
    decoder = DeviceJpegDecoder(torch.device("cpu"), CLIP_LIKE, max_pixels=100 * 100)
    rgb = _encoded(_smooth_image(64, 48), "JPEG", quality=95)
    grey = _encoded(_smooth_image(64, 48).convert("L"), "JPEG", quality=95)
    cmyk = _encoded(_smooth_image(64, 48).convert("CMYK"), "JPEG", quality=95)
    too_large = _encoded(_smooth_image(120, 100), "JPEG", quality=95)  # 12,000 pixels > 10,000
    exif = Image.Exif()
    exif[0x0112] = 3  # rotate 180 degrees
    rotated = _encoded(_smooth_image(64, 48), "JPEG", quality=95, exif=exif.tobytes())
    png = _encoded(_smooth_image(40, 40), "PNG")
    truncated = rgb[: len(rgb) // 2]
    out = decoder.decode_to_input([rgb, grey, cmyk, too_large, rotated, png, truncated])
    assert [a is not None for a in out] == [True, True, False, False, False, False, False]
    assert (decoder.num_device_decoded, decoder.num_left_to_caller) == (2, 5)
    for array, data in ((out[0], rgb), (out[1], grey)):
        assert array.shape == (32, 32, 3) and array.dtype == np.uint8
        assert np.abs(array.astype(np.int16) - cpu_decode_to_input(data, CLIP_LIKE)).mean() < 2.0
    assert decoder.decode_to_input([]) == []
