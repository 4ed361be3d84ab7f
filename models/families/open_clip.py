"""OpenCLIP checkpoints, computed by open_clip itself (``pip install 'mmserve[openclip]'``).

    my-open-clip/               (what open_clip's save_for_hf / push_to_hf_hub write)
    ├── open_clip_config.json   {"model_cfg": ..., "preprocess_cfg": ...}
    ├── open_clip_model.safetensors
    └── tokenizer files         (only for models with an hf_tokenizer_name)

The model is built and loaded by ``open_clip.create_model("local-dir:DIR")``,
the tokenizer by ``open_clip.get_tokenizer("local-dir:DIR")``: the same calls
open_clip makes for ``hf-hub:`` ids, here on the directory or Hub cache
snapshot ``models.loading.hub`` found. open_clip would fall back to a pickled
``open_clip_pytorch_model.bin`` when the safetensors file is missing, so such
a directory is refused before it looks.

Both towers call ``forward_intermediates``, open_clip's own forward that
returns the final embedding together with the last block's tokens, so the
embedding is ``encode_image`` / ``encode_text``'s by construction and the
cross-modal head gets the tokens of the same pass:

    image   image_features (= encode_image)   tokens: class token + patches after ln_post
    text    text_features  (= encode_text)    tokens: every position after ln_final

Texts are padded to the full ``context_length``, as open_clip's tokenizer
pads them (its positional table and causal mask are sized for it). The score
is ``exp(logit_scale) * cos``, a CLIP logit; a model with a ``logit_bias``
(SigLIP trained in open_clip) adds it and applies the sigmoid.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from models.loading.config import FusionConfig, ModelConfig, PreprocessConfig, TextConfig, VisionConfig
from models.errors import ModelRepositoryError
from models.multimodal import MultimodalModel
from models.families.open_clip_tokenizer import OpenClipTokenizer
from models.families.processor_settings import preprocess_from_open_clip
from models.scores import CalibratedScore, ScoreKind
from models.text import TextEncoder
from models.vision import UInt8VisionEncoder

OPEN_CLIP_CONFIG_FILE = "open_clip_config.json"
OPEN_CLIP_WEIGHTS_FILE = "open_clip_model.safetensors"
INSTALL_HINT = "pip install 'mmserve[openclip]'"


def _import_open_clip() -> Any:
    try:
        import open_clip
    except ImportError as e:
        raise ModelRepositoryError(f"serving an OpenCLIP checkpoint needs open_clip: {INSTALL_HINT}") from e
    return open_clip


class OpenClipVisionEncoder(UInt8VisionEncoder):
    """The image side of an open_clip ``CLIP`` / ``CustomTextCLIP``."""

    def __init__(self, model: nn.Module, preprocess: PreprocessConfig) -> None:
        with torch.inference_mode():  # one tiny forward at load, to read the widths open_clip gives
            tokens, embedding = self._features_of(
                model, torch.zeros(1, 3, preprocess.input_size, preprocess.input_size))
        super().__init__(preprocess, embed_dim=tokens.shape[-1], embedding_dim=embedding.shape[-1],
                         num_tokens=tokens.shape[1])
        self.model = model

    @staticmethod
    def _features_of(model: nn.Module, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = model.forward_intermediates(image=pixels, image_indices=1, normalize=False,
                                          normalize_intermediates=True, image_output_fmt="NLC",
                                          image_output_extra_tokens=True)
        patches = out["image_intermediates"][-1]  # (B, Np, d_v)
        prefix = out.get("image_intermediates_prefix")
        tokens = patches if prefix is None else torch.cat([prefix[-1], patches], dim=1)  # (B, Lv, d_v)
        return tokens, out["image_features"]  # (B, Lv, d_v), (B, E_v)

    def features(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._features_of(self.model, pixels)


class OpenClipTextEncoder(TextEncoder):
    """The text side of an open_clip model; ``attention_mask`` is unused (open_clip masks causally)."""

    def __init__(self, model: nn.Module, context_length: int, vocab_size: int) -> None:
        with torch.inference_mode():  # one tiny forward at load, to read the widths open_clip gives
            tokens, embedding = self._encode_with(model, torch.zeros(1, context_length, dtype=torch.long))
        super().__init__(model, hidden_size=tokens.shape[-1], embedding_dim=embedding.shape[-1],
                         max_tokens=context_length, fixed_length=context_length, vocab_size=vocab_size)

    @staticmethod
    def _encode_with(model: nn.Module, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = model.forward_intermediates(text=input_ids, text_indices=1, normalize=False,
                                          normalize_intermediates=True)
        return out["text_intermediates"][-1], out["text_features"]  # (B, Lt, d_t), (B, E_t)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._encode_with(self.model, input_ids)


def is_open_clip_checkpoint(directory: Path) -> bool:
    return (directory / OPEN_CLIP_CONFIG_FILE).is_file()


def load_open_clip(directory: Path, name: str, rank: int, backend: str,
                   normalize_embeddings: bool | None) -> tuple[MultimodalModel, OpenClipTokenizer]:
    """The open_clip model in ``directory`` as mmserve's model, and its tokenizer (see the module docstring)."""
    open_clip = _import_open_clip()
    if not (directory / OPEN_CLIP_WEIGHTS_FILE).is_file():
        raise ModelRepositoryError(
            f"{directory} has no {OPEN_CLIP_WEIGHTS_FILE}; mmserve loads open_clip weights from safetensors only "
            "(open_clip's save_for_hf(..., safe_serialization=True) writes it)")
    try:
        model_cfg = json.loads((directory / OPEN_CLIP_CONFIG_FILE).read_text())["model_cfg"]
        model = open_clip.create_model(f"local-dir:{directory}", require_pretrained=True, pretrained_text=False)
        tokenizer = open_clip.get_tokenizer(f"local-dir:{directory}")
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise ModelRepositoryError(f"open_clip cannot load {directory}: {e}") from e
    model.eval()
    preprocess = preprocess_from_open_clip(model.visual.preprocess_cfg, str(directory))
    text_cfg = model_cfg.get("text_cfg", {})
    context_length = int(tokenizer.context_length)
    vision = OpenClipVisionEncoder(model, preprocess)
    text = OpenClipTextEncoder(model, context_length, int(text_cfg.get("vocab_size", 49408)))
    config = ModelConfig(
        name=name,
        vision=VisionConfig(architecture=f"open_clip.{type(model).__name__}"),
        text=TextConfig(hidden_size=text.hidden_size, num_layers=int(text_cfg.get("layers", 12)),
                        num_heads=int(text_cfg.get("heads", 8)),
                        intermediate_size=int(text.hidden_size * float(text_cfg.get("mlp_ratio", 4.0))),
                        max_position_embeddings=context_length),
        fusion=FusionConfig(rank=rank, backend=backend),
        preprocess=preprocess,
        family="open_clip",
    )
    kind = ScoreKind.CLIP_LOGIT if getattr(model, "logit_bias", None) is None else ScoreKind.SIGLIP_SIGMOID
    multimodal = MultimodalModel(config, vision, text, score=CalibratedScore(kind, model),
                                 normalize_embeddings=True if normalize_embeddings is None else normalize_embeddings)
    return multimodal, OpenClipTokenizer(tokenizer, context_length)
