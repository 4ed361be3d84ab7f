"""Serve a pretrained image–text model from where users keep it (``mmserve serve --model``).

    --model DIR_OR_HUB_ID
        model.yaml                 an mmserve model repository (models.loading.repository), also
                                   vision.timm_dir + text.hf_dir: a timm ViT with a
                                   transformers text encoder                   score: none
        config.json  siglip        transformers SiglipModel                    score: siglip_sigmoid
        config.json  clip          transformers CLIPModel                      score: clip_logit
        open_clip_config.json      open_clip CLIP (models.families.open_clip)     score: clip_logit,
                                   or siglip_sigmoid when it has a logit_bias

Each family is loaded by the library that defines it (``from_pretrained``,
``open_clip.create_model("local-dir:...")``, ``timm.create_model
("local-dir:...")``; local files only, safetensors only) with its own
tokenizer and preprocessing settings; nothing of its code is copied. A
directory with both a servable transformers ``config.json`` and an
``open_clip_config.json`` (some Hub repositories carry both) is served
through transformers. SigLIP 2 (``model_type`` siglip2, NaFlex) is refused
with the reason; fixed-resolution SigLIP 2 checkpoints that declare
``siglip`` are served as SigLIP.

Over-long texts follow the reference library: SigLIP (the transformers
pipeline truncates to its length) and open_clip (its tokenizers always cut)
truncate by default, CLIP is refused unless the request says ``truncate``.

On top of its towers sits mmserve's low-rank cross-modal head, read from ``fusion_head.safetensors``
beside the model when one was trained (``mmserve train-fusion``), else
initialised from the seed and reported as untrained (``ModelBundle.fusion_head``;
the server warns at start-up).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

from models.loading.config import FusionConfig, ModelConfig, TextConfig, VisionConfig
from models.errors import ModelRepositoryError
from models.fusion_head_file import FusionHeadInfo
from models.loading.hub import require_safetensors, resolve_model_directory
from models.multimodal import MultimodalModel
from models.families.open_clip import is_open_clip_checkpoint, load_open_clip
from models.families.transformers_towers import TransformersTextEncoder, TransformersVisionEncoder
from models.families.processor_settings import preprocess_from_hf_processor
from models.loading.repository import CONFIG_FILE, ModelBundle, attach_fusion_head, finish_bundle, load_repository
from models.torch_free.model_files import SUPPORTED_FAMILIES, no_model_files
from models.scores import CalibratedScore, ScoreKind
from models.families.timm_checkpoint import is_timm_checkpoint
from models.tokenizer import TextTokenizer, require_vocabulary

_TRANSFORMERS_SCORES = {"siglip": ScoreKind.SIGLIP_SIGMOID, "clip": ScoreKind.CLIP_LOGIT}
# Families whose reference library cuts an over-long text rather than refusing it (module docstring).
_TRUNCATING_FAMILIES = frozenset({"siglip"})
_NOT_YET_SERVED = {
    "siglip2": "SigLIP 2 NaFlex (Siglip2Model) takes a variable number of patches per image with its own "
               "resize to a patch budget and a pixel attention mask; mmserve's vision lane batches fixed-size "
               "square uint8 images, so it is not served yet. Fixed-resolution SigLIP 2 checkpoints published "
               "as model_type 'siglip' are served",
}


def detect_family(directory: Path) -> str:
    """``mmserve``, ``open_clip``, or the transformers ``model_type`` of a supported family; names what it found
    otherwise."""
    if (directory / CONFIG_FILE).is_file():
        return "mmserve"
    config_path = directory / "config.json"
    if is_open_clip_checkpoint(directory) and not _is_servable_transformers(config_path):
        return "open_clip"
    if not config_path.is_file():
        raise no_model_files(directory)  # also judged before torch loads (server.runtime.startup_checks)
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as e:
        raise ModelRepositoryError(f"{config_path} is not readable JSON: {e}") from e
    model_type = config.get("model_type")
    if model_type in _TRANSFORMERS_SCORES:
        return model_type
    if model_type in _NOT_YET_SERVED:
        raise ModelRepositoryError(f"{directory}: model_type {model_type!r} is not served yet: "
                                   f"{_NOT_YET_SERVED[model_type]}")
    if is_timm_checkpoint(config):
        raise ModelRepositoryError(
            f"{directory} is a timm checkpoint: an image tower only. Pair it with a text encoder in a model "
            f"repository ({CONFIG_FILE} with vision.timm_dir and text.hf_dir)")
    raise ModelRepositoryError(f"{directory}: model_type {model_type!r} is not served; supported: "
                               f"{', '.join(SUPPORTED_FAMILIES)}")


def _is_servable_transformers(config_path: Path) -> bool:
    try:
        return json.loads(config_path.read_text()).get("model_type") in _TRANSFORMERS_SCORES
    except (OSError, ValueError, AttributeError):
        return False


def _served_name(name_or_path: str, directory: Path) -> str:
    """What clients call the model: the Hub id as given, or the directory's name."""
    return directory.name if Path(name_or_path).expanduser().is_dir() else name_or_path.partition("@")[0]


def _load_transformers(directory: Path, family: str, name: str, rank: int, backend: str,
                       normalize_embeddings: bool | None) -> tuple[MultimodalModel, TextTokenizer]:
    try:
        model = AutoModel.from_pretrained(str(directory), local_files_only=True, use_safetensors=True,
                                          dtype=torch.float32)
        hf_tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        processor = AutoImageProcessor.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelRepositoryError(f"cannot load the {family} model in {directory}: {e}") from e
    require_vocabulary(hf_tokenizer, directory)
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
    text = TransformersTextEncoder(model)
    multimodal = MultimodalModel(
        config, TransformersVisionEncoder(model, preprocess), text,
        score=CalibratedScore(_TRANSFORMERS_SCORES[family], model),
        normalize_embeddings=True if normalize_embeddings is None else normalize_embeddings,
    )
    return multimodal, TextTokenizer.for_encoder(hf_tokenizer, text.max_tokens,
                                                 truncates_by_default=family in _TRUNCATING_FAMILIES)


def load_pretrained(name_or_path: str, *, device: str = "cpu", backend: str = "auto", rank: int = 16,
                    seed: int = 0, fusion_head: Path | None = None, is_trained_head_read: bool = True,
                    normalize_embeddings: bool | None = None, dtype: str | None = None) -> ModelBundle:
    """The bundle for ``--model``: a Hub id or directory of a supported family (module docstring).

    ``normalize_embeddings`` None follows the family's convention (the
    pretrained image–text families compare L2-normalised embeddings).
    ``fusion_head`` overrides ``fusion_head.safetensors`` beside the model;
    ``is_trained_head_read`` False reads neither (``mmserve train-fusion``
    starts from a fresh head, whatever lies beside the model).
    ``dtype`` (``models.precision``) is what the model computes in; None:
    float32 (a model repository: its ``model.yaml``'s). Every family is read
    in float32 as stored, fingerprinted, then cast (``finish_bundle``), so a
    fusion head trained at one dtype serves at any other.
    """
    directory = resolve_model_directory(name_or_path)
    family = detect_family(directory)
    if family == "mmserve":
        return load_repository(directory, device=device, backend=backend, fusion_head=fusion_head,
                               is_trained_head_read=is_trained_head_read, dtype=dtype)
    torch.manual_seed(seed)  # the head's initial weights, when no trained head is found
    name = _served_name(name_or_path, directory)
    if family == "open_clip":
        model, tokenizer = load_open_clip(directory, name, rank, backend, normalize_embeddings)
    else:
        require_safetensors(directory)
        model, tokenizer = _load_transformers(directory, family, name, rank, backend, normalize_embeddings)
    head_info = (attach_fusion_head(model, tokenizer, model.config, directory, fusion_head) if is_trained_head_read
                 else FusionHeadInfo(is_trained=False))
    return finish_bundle(model, tokenizer, model.config, device, str(directory), False, head_info, dtype=dtype)
