"""Named model presets: the default ViT-L/16, a ViT-B/16, a tiny one for tests, and ``synthetic``.

``synthetic`` has towers that sleep for drawn service times instead of
computing (``models.families.synthetic``), for drift drills.

A preset is only a ``ModelConfig``; the weights come from a seed (random, for
trying the server) or from a model repository (``mmserve init-model-repo``).
"""

from __future__ import annotations

import math

from models.loading.config import FusionConfig, ModelConfig, PreprocessConfig, TextConfig, VisionConfig
from models.errors import UnknownPresetError

DEFAULT_PRESET = "vit-l16"
SYNTHETIC_ARCHITECTURE = "synthetic"  # VisionConfig.architecture of the preset whose towers sleep

# timm's eval transform for the ViT-B/16 and ViT-L/16 (augreg) checkpoints:
# bicubic resize to floor(224 / 0.9) on the shorter side, centre crop 224,
# mean = std = 0.5 per channel.
_VIT_CROP_PCT = 0.9
_VIT_MEAN_STD = (0.5, 0.5, 0.5)


def _vit_preprocess(input_size: int) -> PreprocessConfig:
    return PreprocessConfig(
        input_size=input_size,
        resize_size=math.floor(input_size / _VIT_CROP_PCT),
        interpolation="bicubic",
        mean=_VIT_MEAN_STD,
        std=_VIT_MEAN_STD,
    )


def _vit_with_text_encoder(name: str, architecture: str) -> ModelConfig:
    """A timm ViT at 224 px + the 6-layer, 384-wide BERT-style text encoder, rank-16 fusion."""
    return ModelConfig(
        name=name,
        vision=VisionConfig(architecture=architecture),
        text=TextConfig(hidden_size=384, num_layers=6, num_heads=6, intermediate_size=1536,
                        max_position_embeddings=512),
        fusion=FusionConfig(rank=16),
        preprocess=_vit_preprocess(224),
    )


def _tiny() -> ModelConfig:
    # A real timm ViT and a real BERT, only narrow and shallow: 32x32 input,
    # 8x8 patches (16 patches + class token), two layers each.
    return ModelConfig(
        name="tiny",
        vision=VisionConfig(
            architecture="vit_tiny_patch16_224",
            timm_kwargs={"img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 2},
        ),
        text=TextConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                        max_position_embeddings=64),
        fusion=FusionConfig(rank=16),
        preprocess=_vit_preprocess(32),
    )


def _synthetic() -> ModelConfig:
    # The tiny preset's text width, limits and preprocessing; the towers are models.families.synthetic's.
    tiny = _tiny()
    return ModelConfig(name="synthetic", vision=VisionConfig(architecture=SYNTHETIC_ARCHITECTURE),
                       text=tiny.text, fusion=tiny.fusion, preprocess=tiny.preprocess)


_PRESETS = {
    "vit-l16": lambda: _vit_with_text_encoder("vit-l16", "vit_large_patch16_224"),
    "vit-b16": lambda: _vit_with_text_encoder("vit-b16", "vit_base_patch16_224"),
    "tiny": _tiny,
    "synthetic": _synthetic,
}
PRESET_NAMES: tuple[str, ...] = tuple(_PRESETS)


def preset_config(name: str) -> ModelConfig:
    """The config of a named preset; ``UnknownPresetError`` lists the valid names."""
    try:
        return _PRESETS[name]()
    except KeyError as e:
        raise UnknownPresetError(
            f"unknown preset {name!r}; choose one of {', '.join(PRESET_NAMES)}"
        ) from e
