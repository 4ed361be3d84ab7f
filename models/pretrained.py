"""Serve a pretrained image–text model from where users keep it (``mmserve serve --model``).

    --model DIR_OR_HUB_ID
        model.yaml                 an mmserve model repository (models.repository)
        config.json  siglip        transformers SiglipModel    score: siglip_sigmoid
        config.json  clip          transformers CLIPModel      score: clip_logit

Each family is loaded by the library that defines it (``from_pretrained``,
local files only, safetensors only) with its own tokenizer and image
processor settings; nothing of its code is copied. On top of its towers sits
mmserve's low-rank cross-modal head, read from ``fusion_head.safetensors``
beside the model when one was trained (``mmserve train-fusion``), else
initialised from the seed and reported as untrained.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

from models.config import FusionConfig, ModelConfig, TextConfig, VisionConfig
from models.errors import ModelRepositoryError
from models.fusion_head_file import FUSION_HEAD_FILE, FusionHeadInfo, load_fusion_head
from models.hub import require_safetensors, resolve_model_directory
from models.multimodal import MultimodalModel
from models.pretrained_towers import TransformersTextEncoder, TransformersVisionEncoder
from models.processor_settings import preprocess_from_hf_processor
from models.repository import CONFIG_FILE, ModelBundle, finish_bundle, fingerprint, load_repository
from models.scores import CalibratedScore, ScoreKind

logger = logging.getLogger(__name__)

_TRANSFORMERS_SCORES = {"siglip": ScoreKind.SIGLIP_SIGMOID, "clip": ScoreKind.CLIP_LOGIT}
SUPPORTED_FAMILIES = ("mmserve model repository (model.yaml)", "siglip", "clip")


def detect_family(directory: Path) -> str:
    """``mmserve``, or the transformers ``model_type`` of a supported family; names what it found otherwise."""
    if (directory / CONFIG_FILE).is_file():
        return "mmserve"
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ModelRepositoryError(f"{directory} has neither {CONFIG_FILE} nor config.json; supported: "
                                   f"{', '.join(SUPPORTED_FAMILIES)}")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as e:
        raise ModelRepositoryError(f"{config_path} is not readable JSON: {e}") from e
    model_type = config.get("model_type")
    if model_type in _TRANSFORMERS_SCORES:
        return model_type
    if "architecture" in config and model_type is None:
        raise ModelRepositoryError(
            f"{directory} is a timm checkpoint: an image tower only. Pair it with a text encoder in a model "
            f"repository ({CONFIG_FILE} with vision.timm_dir and text.hf_dir)")
    raise ModelRepositoryError(f"{directory}: model_type {model_type!r} is not served; supported: "
                               f"{', '.join(SUPPORTED_FAMILIES)}")


def _served_name(name_or_path: str, directory: Path) -> str:
    """What clients call the model: the Hub id as given, or the directory's name."""
    return directory.name if Path(name_or_path).expanduser().is_dir() else name_or_path.partition("@")[0]


def _load_transformers(directory: Path, family: str, name: str, rank: int, backend: str,
                       normalize_embeddings: bool | None) -> tuple[MultimodalModel, object]:
    require_safetensors(directory)
    try:
        model = AutoModel.from_pretrained(str(directory), local_files_only=True, use_safetensors=True,
                                          dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        processor = AutoImageProcessor.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelRepositoryError(f"cannot load the {family} model in {directory}: {e}") from e
    model.eval()
    preprocess = preprocess_from_hf_processor(processor, str(directory))
    text_config = model.config.text_config
    config = ModelConfig(
        name=name,
        vision=VisionConfig(architecture=type(model).__name__),
        text=TextConfig(hidden_size=text_config.hidden_size, num_layers=text_config.num_hidden_layers,
                        num_heads=text_config.num_attention_heads, intermediate_size=text_config.intermediate_size,
                        max_position_embeddings=text_config.max_position_embeddings),
        fusion=FusionConfig(rank=rank, backend=backend),
        preprocess=preprocess,
        family=family,
    )
    multimodal = MultimodalModel(
        config, TransformersVisionEncoder(model, preprocess), TransformersTextEncoder(model),
        score=CalibratedScore(_TRANSFORMERS_SCORES[family], model),
        normalize_embeddings=True if normalize_embeddings is None else normalize_embeddings,
    )
    return multimodal, tokenizer


def load_pretrained(name_or_path: str, *, device: str = "cpu", backend: str = "auto", rank: int = 16,
                    seed: int = 0, fusion_head: Path | None = None,
                    normalize_embeddings: bool | None = None) -> ModelBundle:
    """The bundle for ``--model``: a Hub id or directory of a supported family (module docstring).

    ``normalize_embeddings`` None follows the family's convention (the
    pretrained image–text families compare L2-normalised embeddings).
    ``fusion_head`` overrides ``fusion_head.safetensors`` beside the model.
    """
    directory = resolve_model_directory(name_or_path)
    family = detect_family(directory)
    if family == "mmserve":
        return load_repository(directory, device=device, backend=backend)
    torch.manual_seed(seed)  # the head's initial weights, when no trained head is found
    model, tokenizer = _load_transformers(directory, family, _served_name(name_or_path, directory), rank,
                                          backend, normalize_embeddings)
    head_info = FusionHeadInfo(is_trained=False)
    head_path = fusion_head if fusion_head is not None else directory / FUSION_HEAD_FILE
    if head_path.is_file():
        towers = fingerprint(model, tokenizer, model.config, skip_prefix="fusion.")
        head_info = load_fusion_head(head_path, model.fusion, towers_fingerprint=towers)
    elif fusion_head is not None:
        raise ModelRepositoryError(f"fusion head {fusion_head} does not exist")
    if not head_info.is_trained:
        logger.warning("the fusion head of %s is untrained: answers carry no match_score and fused_embedding "
                       "is not meaningful; train one with `mmserve train-fusion --model %s --pairs FILE.jsonl "
                       "--out DIR`", name_or_path, name_or_path)
    return finish_bundle(model, tokenizer, model.config, device, str(directory), False, head_info)
