"""The model's configuration: what ``model.yaml`` in a model repository holds.

Frozen dataclasses, round-tripped through plain dicts so the YAML file stays
readable and the fingerprint (a digest over the canonical dict) is stable.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from models.errors import ModelRepositoryError

SUPPORTED_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
SUPPORTED_INTERPOLATIONS: tuple[str, ...] = ("bicubic", "bilinear", "nearest")
SUPPORTED_RESIZE_MODES: tuple[str, ...] = ("crop_box", "shortest_edge", "squash")
SUPPORTED_CROP_ROUNDINGS: tuple[str, ...] = ("round", "floor")
MODEL_FAMILIES: tuple[str, ...] = ("mmserve", "siglip", "clip", "open_clip")


@dataclass(frozen=True)
class VisionConfig:
    """A timm Vision Transformer: the architecture name plus keyword overrides.

    ``timm_kwargs`` are passed to ``timm.create_model`` (e.g. ``img_size``,
    ``embed_dim``) so small test models are real timm ViTs, not look-alikes.
    ``timm_dir`` (relative to the repository, or absolute) names a timm
    checkpoint in the Hub layout (``config.json`` + ``model.safetensors``, as
    timm's ``save_for_hf`` writes it); the architecture, weights and
    preprocessing then come from there (``models.families.timm_checkpoint``).
    """

    architecture: str = "vit_large_patch16_224"
    timm_kwargs: dict[str, Any] = field(default_factory=dict)
    timm_dir: str | None = None


@dataclass(frozen=True)
class PreprocessConfig:
    """How an image becomes model input; the one place that decides it.

    ``resize_mode`` says how the geometry is done (``models.preprocessing``):

        crop_box       timm's eval transform (shorter side to ``resize_size``,
                       centre crop ``input_size``) read straight from the source
                       box: the presets' path, cheap for any aspect ratio
        shortest_edge  the same transform done as the reference libraries do it
                       (whole image resized, then cropped; ``crop_rounding``
                       "round" is torchvision/timm, "floor" is Hugging Face)
        squash         resize to ``input_size`` x ``input_size``, no crop (SigLIP)

    Normalisation with ``mean``/``std`` then happens on the device.
    """

    input_size: int = 224
    resize_size: int = 248
    interpolation: str = "bicubic"
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    resize_mode: str = "crop_box"
    crop_rounding: str = "round"

    def identity(self) -> str:
        """A canonical string naming this preprocessing (part of cache keys)."""
        return (
            f"size={self.input_size};resize={self.resize_size};interp={self.interpolation};"
            f"mean={','.join(repr(m) for m in self.mean)};std={','.join(repr(s) for s in self.std)};"
            f"mode={self.resize_mode};crop={self.crop_rounding}"
        )


@dataclass(frozen=True)
class TextConfig:
    """A BERT-family encoder, built from these numbers or loaded from ``hf_dir``.

    ``hf_dir`` (relative to the repository, or absolute) names a local
    Hugging Face directory written by ``save_pretrained``; when it is set the
    width and depth come from that directory's own ``config.json``.
    """

    hidden_size: int = 384
    num_layers: int = 6
    num_heads: int = 6
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    hf_dir: str | None = None


@dataclass(frozen=True)
class FusionConfig:
    """The low-rank cross-modal attention layer: rank and kernel backend."""

    rank: int = 16
    backend: str = "auto"


@dataclass(frozen=True)
class ModelConfig:
    """Everything needed to rebuild the model bit for bit from its weights."""

    name: str
    vision: VisionConfig
    text: TextConfig
    fusion: FusionConfig
    preprocess: PreprocessConfig
    dtype: str = "float32"
    # Which library defines the towers: "mmserve" (timm ViT + BERT-style text,
    # this file's numbers) or a pretrained family loaded by ``models.families.pretrained``.
    family: str = "mmserve"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["preprocess"]["mean"] = list(self.preprocess.mean)
        data["preprocess"]["std"] = list(self.preprocess.std)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        """Build a config from ``model.yaml`` content, naming any bad key.

        An unknown top-level key is refused as one inside a section is: a typo
        (``dtpye``) silently dropped would serve the default in its place.
        """
        known = tuple(f.name for f in fields(cls))
        unknown = sorted(str(key) for key in data if key not in known)
        if unknown:
            raise ModelRepositoryError(f"model.yaml: unknown top-level key {', '.join(map(repr, unknown))}; "
                                       f"the keys are {', '.join(known)}")
        try:
            vision = VisionConfig(**data["vision"])
            # A timm checkpoint brings its own preprocessing; the loader fills it in (and checks one given here).
            preprocess = dict(data["preprocess"] if vision.timm_dir is None or "preprocess" in data
                              else asdict(PreprocessConfig()))
            preprocess["mean"] = tuple(float(m) for m in preprocess["mean"])
            preprocess["std"] = tuple(float(s) for s in preprocess["std"])
            config = cls(
                name=str(data["name"]),
                vision=vision,
                text=TextConfig(**data["text"]),
                fusion=FusionConfig(**data.get("fusion", {})),
                preprocess=PreprocessConfig(**preprocess),
                dtype=str(data.get("dtype", "float32")),
                family=str(data.get("family", "mmserve")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ModelRepositoryError(f"model.yaml is malformed: {e!r}") from e
        config.validate()
        return config

    def validate(self) -> None:
        """Refuse what would load and then fail while serving: each message names the model.yaml key."""
        self._validate_numbers()
        if self.dtype not in SUPPORTED_DTYPES:
            raise ModelRepositoryError(
                f"model.yaml: dtype {self.dtype!r} is not one of {SUPPORTED_DTYPES}"
            )
        if self.preprocess.interpolation not in SUPPORTED_INTERPOLATIONS:
            raise ModelRepositoryError(
                f"model.yaml: preprocess.interpolation {self.preprocess.interpolation!r} "
                f"is not one of {SUPPORTED_INTERPOLATIONS}"
            )
        if self.preprocess.resize_mode not in SUPPORTED_RESIZE_MODES:
            raise ModelRepositoryError(
                f"model.yaml: preprocess.resize_mode {self.preprocess.resize_mode!r} "
                f"is not one of {SUPPORTED_RESIZE_MODES}"
            )
        if self.preprocess.crop_rounding not in SUPPORTED_CROP_ROUNDINGS:
            raise ModelRepositoryError(
                f"model.yaml: preprocess.crop_rounding {self.preprocess.crop_rounding!r} "
                f"is not one of {SUPPORTED_CROP_ROUNDINGS}"
            )
        if self.family not in MODEL_FAMILIES:
            raise ModelRepositoryError(f"model.yaml: family {self.family!r} is not one of {MODEL_FAMILIES}")
        if self.preprocess.resize_size < self.preprocess.input_size:
            raise ModelRepositoryError(
                "model.yaml: preprocess.resize_size must be >= preprocess.input_size"
            )
        if self.fusion.rank < 1:
            raise ModelRepositoryError("model.yaml: fusion.rank must be >= 1")

    def _validate_numbers(self) -> None:
        """Sizes are positive ints; ``mean``/``std`` are 3 finite numbers (one per RGB channel), ``std`` > 0."""
        sizes = {"preprocess.input_size": self.preprocess.input_size,
                 "preprocess.resize_size": self.preprocess.resize_size,
                 "text.hidden_size": self.text.hidden_size, "text.num_layers": self.text.num_layers,
                 "text.num_heads": self.text.num_heads, "text.intermediate_size": self.text.intermediate_size,
                 "text.max_position_embeddings": self.text.max_position_embeddings, "fusion.rank": self.fusion.rank}
        for key, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelRepositoryError(f"model.yaml: {key} {value!r} is not a positive integer")
        for key, values in (("mean", self.preprocess.mean), ("std", self.preprocess.std)):
            if len(values) != 3 or not all(math.isfinite(v) for v in values):
                raise ModelRepositoryError(f"model.yaml: preprocess.{key} {list(values)} must be 3 finite numbers, "
                                           "one per RGB channel")
        if min(self.preprocess.std) <= 0:
            raise ModelRepositoryError(f"model.yaml: preprocess.std {list(self.preprocess.std)} must be > 0 "
                                       "in every channel (images are divided by it)")
