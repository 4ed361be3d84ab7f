"""Host-side geometry follows timm's eval transform for the model's config."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import create_transform

from models.preprocessing import crop_box, pixels_to_model_input, resize_to_model_input
from models.families.presets import preset_config


@pytest.mark.parametrize(("width", "height"), [(640, 480), (480, 640), (300, 300), (1000, 200)])
def test_matches_timms_resize_and_centre_crop(width: int, height: int):
    config = preset_config("vit-b16").preprocess
    rng = np.random.default_rng(width * height)
    # A smooth image: resampling differences between "resize then crop" and
    # "resize the crop box" stay at rounding level, geometry errors would not.
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([(x * 255 // width), (y * 255 // height), ((x + y) * 127 // (width + height))], -1)
    pixels = np.clip(pixels + rng.integers(-2, 3, pixels.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels)

    ours = resize_to_model_input(image, config).astype(np.float64)  # (S, S, 3)
    transform = create_transform(input_size=(3, config.input_size, config.input_size),
                                 interpolation=config.interpolation, crop_pct=config.input_size / config.resize_size,
                                 mean=(0, 0, 0), std=(1, 1, 1))
    reference = (transform(image) * 255.0).permute(1, 2, 0).numpy()  # (S, S, 3)
    assert ours.shape == reference.shape == (config.input_size, config.input_size, 3)
    assert np.abs(ours - reference).mean() < 1.5


def test_crop_box_is_centred_and_square_in_the_source():
    config = preset_config("vit-l16").preprocess
    left, top, right, bottom = crop_box(1000, 200, config)
    assert right - left == pytest.approx(bottom - top)
    assert (left + right) / 2 == pytest.approx(500, abs=3)
    assert (top + bottom) / 2 == pytest.approx(100, abs=1)


@pytest.mark.parametrize(("width", "height"), [(1, 1), (1, 5000), (5000, 1), (3, 2)])
def test_tiny_and_extreme_images_become_model_input(width: int, height: int):
    config = preset_config("tiny").preprocess
    out = pixels_to_model_input(np.full((height, width, 3), 200, dtype=np.uint8), config)
    assert out.shape == (config.input_size, config.input_size, 3) and out.dtype == np.uint8
    assert np.all(np.abs(out.astype(int) - 200) <= 1)


def test_non_rgb_input_is_refused():
    config = preset_config("tiny").preprocess
    with pytest.raises(ValueError, match="RGB"):
        resize_to_model_input(Image.new("L", (4, 4)), config)
    with pytest.raises(ValueError, match=r"\(H, W, 3\)"):
        pixels_to_model_input(np.zeros((4, 4), dtype=np.uint8), config)
    assert torch.from_numpy(pixels_to_model_input(np.zeros((4, 4, 3), np.uint8), config)).is_contiguous()
