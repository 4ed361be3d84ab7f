"""--jpeg-draft: large JPEGs decode reduced in the DCT, down to what the resize needs; nothing else changes."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from encoded_images import encode

from models.loading.config import PreprocessConfig
from models.preprocessing import resize_to_model_input
from server.ingest.decoding import decode_image, draft_scale
from server.ingest.inputs import image_decoder
from server.settings import Settings

MAX_PIXELS = 36_000_000
PREPROCESS = PreprocessConfig(input_size=224, resize_size=248)  # the presets' geometry: draft side 248


def photo_like(width: int, height: int, fmt: str = "JPEG") -> bytes:
    """Smooth gradients + texture + noise, as a photograph has; encoded at quality 90."""
    rng = np.random.default_rng(width * 7 + height)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([x / width * 200, y / height * 180, (x + y) / (width + height) * 160], -1)
    texture = 25 * np.sin(x / 7.0)[..., None] * np.cos(y / 11.0)[..., None]
    pixels = np.clip(base + texture + rng.normal(0, 6, (height, width, 3)), 0, 255).astype(np.uint8)
    return encode(Image.fromarray(pixels), fmt, **({"quality": 90} if fmt == "JPEG" else {}))


def decoder(is_draft: bool):
    return image_decoder(Settings(jpeg_draft=is_draft), PREPROCESS)


@pytest.mark.parametrize(("size", "side", "scale"), [
    ((1024, 768), 248, 2),    # 768 // 248 = 3: 1/2 leaves 512x384; 1/4 would leave 192 < 248
    ((2048, 1536), 248, 4),   # 1536 // 248 = 6
    ((4000, 3000), 248, 8),   # 3000 // 248 = 12: the largest reduction libjpeg has
    ((640, 480), 248, 1),     # 480 // 248 = 1: 1/2 would leave 240 < 248
    ((248, 248), 248, 1),
    ((100, 60), 248, 1),      # smaller than the model: never reduced
])
def test_the_largest_reduction_that_keeps_both_sides(size, side, scale):
    assert draft_scale(*size, side) == scale
    width, height = size
    assert min(-(-width // scale), -(-height // scale)) >= min(side, width, height)


def test_a_large_jpeg_decodes_reduced_to_the_same_model_input_geometry():
    data = photo_like(1024, 768)
    exact, draft = decoder(False)(data), decoder(True)(data)
    assert exact.size == (1024, 768)
    assert draft.size == (512, 384)  # the decoded size, before the resize: scale 1/2, both sides >= 248
    assert draft.mode == "RGB"
    exact_input = resize_to_model_input(exact, PREPROCESS)
    draft_input = resize_to_model_input(draft, PREPROCESS)
    assert exact_input.shape == draft_input.shape == (224, 224, 3)
    # Same picture, not the same pixels: a DCT-reduced decode differs by a few levels after the resize.
    difference = np.abs(exact_input.astype(np.int16) - draft_input.astype(np.int16))
    assert 0 < difference.mean() < 4.0


@pytest.mark.parametrize(("size", "reduced"), [((2048, 1536), (512, 384)), ((4000, 3000), (500, 375))])
def test_larger_jpegs_use_larger_reductions(size, reduced):
    assert decoder(True)(photo_like(*size)).size == reduced


def test_a_small_jpeg_and_a_png_are_untouched():
    small, png = photo_like(320, 240), photo_like(1024, 768, fmt="PNG")
    for data, size in ((small, (320, 240)), (png, (1024, 768))):
        exact, draft = decoder(False)(data), decoder(True)(data)
        assert draft.size == exact.size == size
        assert np.array_equal(np.asarray(draft), np.asarray(exact))


def test_without_the_flag_pixels_equal_pillows_exact_decode():
    data = photo_like(1024, 768)
    reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert np.array_equal(np.asarray(decoder(False)(data)), reference)
    assert np.array_equal(np.asarray(decode_image(data, MAX_PIXELS)), reference)


def test_the_pixel_limit_still_reads_the_full_size_from_the_header():
    from server.errors import ApiError

    with pytest.raises(ApiError) as caught:
        decode_image(photo_like(1024, 768), 1024 * 768 - 1, draft_side=248)
    assert caught.value.status == 413


def test_draft_side_covers_resize_and_input_sizes():
    squash = PreprocessConfig(input_size=256, resize_size=256, resize_mode="squash")
    # 1024x768 for a 256-pixel squash: 768 // 256 = 3, so 1/2 (512x384), never 1/4 (256x192 < 256)
    assert image_decoder(Settings(jpeg_draft=True), squash)(photo_like(1024, 768)).size == (512, 384)


def test_jpeg_draft_comes_from_the_flag_or_the_environment(monkeypatch):
    from server.cli import build_parser
    from server.settings import load_settings

    assert build_parser().parse_args(["serve", "--jpeg-draft"]).jpeg_draft is True
    assert build_parser().parse_args(["serve"]).jpeg_draft is None  # not given: the environment decides
    assert load_settings(None, jpeg_draft=None).jpeg_draft is False  # off by default: the exact decode
    monkeypatch.setenv("MMSERVE_JPEG_DRAFT", "true")
    assert load_settings(None, jpeg_draft=None).jpeg_draft is True
