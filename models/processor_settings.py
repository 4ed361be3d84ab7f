"""A pretrained model's own image processor settings, as mmserve's ``PreprocessConfig``.

mmserve does the processor's work itself (the resize on the host in uint8,
normalisation on the device), so it reads what the processor would do and
refuses what it cannot reproduce exactly rather than serving other pixels:

    Hugging Face processor                         PreprocessConfig
    size {shortest_edge: R} + center crop C        shortest_edge, resize R, input C, crop "floor"
    size {height: S, width: S}, no crop            squash, input S
    resample 0 / 2 / 3                             nearest / bilinear / bicubic
    rescale 1/255, image_mean, image_std           mean, std (normalised on the device)

After the same resize the pixel values equal the processor's (its PIL
backend; the torchvision backend resizes with other filters) within float
rounding.
"""

from __future__ import annotations

import math
from typing import Any

from models.config import PreprocessConfig
from models.errors import ModelRepositoryError

_PIL_RESAMPLE_NAMES = {0: "nearest", 2: "bilinear", 3: "bicubic"}


def _size(value: Any, key: str) -> int | None:
    if value is None:
        return None
    found = value.get(key) if hasattr(value, "get") else None
    return None if found is None else int(found)


def _resample_name(resample: Any) -> str:
    code = int(getattr(resample, "value", resample))
    try:
        return _PIL_RESAMPLE_NAMES[code]
    except KeyError as e:
        raise ModelRepositoryError(f"the image processor resamples with PIL filter {resample!r}; mmserve "
                                   f"supports {sorted(_PIL_RESAMPLE_NAMES.values())}") from e


def preprocess_from_hf_processor(processor: Any, source: str) -> PreprocessConfig:
    """The ``PreprocessConfig`` equal to a transformers image processor (``source`` names it in errors)."""
    def refuse(what: str) -> ModelRepositoryError:
        return ModelRepositoryError(f"{source}: the image processor {what}, which mmserve cannot reproduce")

    if not getattr(processor, "do_resize", True):
        raise refuse("does not resize")
    if getattr(processor, "do_rescale", True) is False or not math.isclose(
            float(getattr(processor, "rescale_factor", 1 / 255)), 1 / 255):
        raise refuse("does not rescale by 1/255")
    if getattr(processor, "do_normalize", True) is False:
        mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    else:
        mean = tuple(float(m) for m in processor.image_mean)
        std = tuple(float(s) for s in processor.image_std)
    if len(mean) != 3 or len(std) != 3:
        raise refuse(f"normalises with {len(mean)} channel means")
    interpolation = _resample_name(processor.resample)
    shortest_edge = _size(processor.size, "shortest_edge")
    does_crop = bool(getattr(processor, "do_center_crop", False))
    if shortest_edge is not None:
        if not does_crop:
            raise refuse("keeps the aspect ratio without a centre crop (non-square input)")
        crop_h, crop_w = _size(processor.crop_size, "height"), _size(processor.crop_size, "width")
        if crop_h != crop_w or crop_h is None or crop_h > shortest_edge:
            raise refuse(f"crops to {crop_h}x{crop_w} after resizing the shorter side to {shortest_edge}")
        return PreprocessConfig(input_size=crop_h, resize_size=shortest_edge, interpolation=interpolation,
                                mean=mean, std=std, resize_mode="shortest_edge", crop_rounding="floor")
    height, width = _size(processor.size, "height"), _size(processor.size, "width")
    if height is None or height != width:
        raise refuse(f"resizes to {processor.size!r} (mmserve takes a square size or a shortest edge)")
    if does_crop and _size(processor.crop_size, "height") not in (None, height):
        raise refuse("crops after resizing to a fixed size")
    return PreprocessConfig(input_size=height, resize_size=height, interpolation=interpolation,
                            mean=mean, std=std, resize_mode="squash", crop_rounding="floor")
