"""A pretrained model's own image preprocessing settings, as mmserve's ``PreprocessConfig``.

mmserve does the processor's work itself (the resize on the host in uint8,
normalisation on the device), so it reads what the processor would do and
refuses what it cannot reproduce exactly rather than serving other pixels:

    Hugging Face processor                         PreprocessConfig
    size {shortest_edge: R} + center crop C        shortest_edge, resize R, input C, crop "floor"
    size {height: S, width: S}, no crop            squash, input S
    resample 0 / 2 / 3                             nearest / bilinear / bicubic
    rescale 1/255, image_mean, image_std           mean, std (normalised on the device)

    open_clip preprocess_cfg (torchvision on PIL)  PreprocessConfig
    resize_mode "shortest", size S                 shortest_edge, resize S, input S, crop "round"
    resize_mode "squash", size S                   squash, input S
    interpolation bicubic / bilinear / random      bicubic / bilinear / bicubic (random is bicubic at inference)

    timm data config (its eval transform)          PreprocessConfig
    crop_mode "center", crop_pct p, size S         shortest_edge, resize floor(S / p), input S, crop "round"
    crop_mode "squash", crop_pct 1, size S         squash, input S

After the same resize the pixel values equal the reference's (Hugging Face's
PIL backend, torchvision's PIL path for open_clip and timm; the Hugging Face
torchvision backend resizes with other filters) within float rounding.
"""

from __future__ import annotations

import math
from typing import Any

from models.loading.config import PreprocessConfig
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


def _square(size: Any, refuse) -> int:
    sizes = (size, size) if isinstance(size, int) else tuple(size)[-2:]
    if len(sizes) != 2 or sizes[0] != sizes[1]:
        raise refuse(f"takes {size!r} px input (mmserve takes a square input)")
    return int(sizes[0])


def _three(values: Any, name: str, refuse) -> tuple[float, float, float]:
    values = (values,) * 3 if isinstance(values, (int, float)) else tuple(float(v) for v in values)
    if len(values) != 3:
        raise refuse(f"normalises with {len(values)} channel {name}s")
    return values  # type: ignore[return-value]


def preprocess_from_open_clip(preprocess_cfg: dict[str, Any], source: str) -> PreprocessConfig:
    """The ``PreprocessConfig`` equal to open_clip's inference transform (``image_transform_v2``) for this config."""
    def refuse(what: str) -> ModelRepositoryError:
        return ModelRepositoryError(f"{source}: the open_clip preprocessing {what}, which mmserve cannot reproduce")

    size = _square(preprocess_cfg.get("size", 224), refuse)
    interpolation = {"bicubic": "bicubic", "bilinear": "bilinear", "random": "bicubic"}.get(
        preprocess_cfg.get("interpolation") or "bicubic")
    if interpolation is None:
        raise refuse(f"interpolates with {preprocess_cfg.get('interpolation')!r}")
    mean = _three(preprocess_cfg["mean"], "mean", refuse)
    std = _three(preprocess_cfg["std"], "std", refuse)
    resize_mode = preprocess_cfg.get("resize_mode") or "shortest"
    if resize_mode == "shortest":
        return PreprocessConfig(input_size=size, resize_size=size, interpolation=interpolation, mean=mean, std=std,
                                resize_mode="shortest_edge", crop_rounding="round")
    if resize_mode == "squash":
        return PreprocessConfig(input_size=size, resize_size=size, interpolation=interpolation, mean=mean, std=std,
                                resize_mode="squash", crop_rounding="round")
    raise refuse(f"resizes with resize_mode {resize_mode!r} (letterbox padding)")


def preprocess_from_timm(data_config: dict[str, Any], source: str) -> PreprocessConfig:
    """The ``PreprocessConfig`` equal to timm's eval transform for ``timm.data.resolve_data_config``'s answer."""
    def refuse(what: str) -> ModelRepositoryError:
        return ModelRepositoryError(f"{source}: timm's eval transform {what}, which mmserve cannot reproduce")

    size = _square(data_config["input_size"], refuse)
    interpolation = data_config.get("interpolation", "bilinear")
    if interpolation not in _PIL_RESAMPLE_NAMES.values():
        raise refuse(f"interpolates with {interpolation!r}")
    mean = _three(data_config["mean"], "mean", refuse)
    std = _three(data_config["std"], "std", refuse)
    crop_pct = float(data_config.get("crop_pct") or 0.875)  # timm's DEFAULT_CROP_PCT when unset
    crop_mode = data_config.get("crop_mode") or "center"
    resize_size = math.floor(size / crop_pct)
    if crop_mode == "center":
        return PreprocessConfig(input_size=size, resize_size=resize_size, interpolation=interpolation, mean=mean,
                                std=std, resize_mode="shortest_edge", crop_rounding="round")
    if crop_mode == "squash" and resize_size == size:
        return PreprocessConfig(input_size=size, resize_size=size, interpolation=interpolation, mean=mean, std=std,
                                resize_mode="squash", crop_rounding="round")
    raise refuse(f"uses crop_mode {crop_mode!r} with crop_pct {crop_pct}")
