"""A timm image model in the Hub layout (``vision.timm_dir`` in ``model.yaml``), loaded by timm itself.

    my-vit/
    ├── config.json         architecture, num_classes, pretrained_cfg (timm's ``save_for_hf`` / ``push_to_hf_hub``)
    └── model.safetensors

``timm.create_model("local-dir:DIR", pretrained=True)`` builds the
architecture ``config.json`` names with the arguments it recorded and loads
the weights, as it does for ``hf-hub:`` ids. timm would fall back to a
pickled ``pytorch_model.bin`` when ``model.safetensors`` is missing, so such
a directory is refused before timm looks. The preprocessing is timm's eval
transform for the model (``timm.data.resolve_data_config``), mapped to
``PreprocessConfig`` by ``models.families.processor_settings.preprocess_from_timm``.

A timm checkpoint is an image tower only: it is served paired with a text
encoder (``text.hf_dir``), with no calibrated image–text score.
"""

from __future__ import annotations

import json
from pathlib import Path

import timm
from timm.data import resolve_data_config
from torch import nn

from models.loading.config import PreprocessConfig
from models.errors import ModelRepositoryError
from models.families.processor_settings import preprocess_from_timm

TIMM_WEIGHTS_FILE = "model.safetensors"


def is_timm_checkpoint(config: dict) -> bool:
    """Whether a parsed ``config.json`` is timm's (it names an ``architecture``, transformers' a ``model_type``)."""
    return "architecture" in config and config.get("model_type") is None


def load_timm_checkpoint(directory: Path) -> tuple[nn.Module, PreprocessConfig, str]:
    """The timm model in ``directory`` (eval mode, float32), its preprocessing and its architecture name."""
    config_path = directory / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as e:
        raise ModelRepositoryError(f"{config_path} is not a readable timm config: {e}") from e
    if not is_timm_checkpoint(config):
        raise ModelRepositoryError(f"{config_path} is not a timm config (it names no architecture)")
    if not (directory / TIMM_WEIGHTS_FILE).is_file():
        raise ModelRepositoryError(
            f"{directory} has no {TIMM_WEIGHTS_FILE}; mmserve loads timm weights from safetensors only (write them "
            "with timm.models.save_for_hf(model, DIR, safe_serialization=True))")
    try:
        model = timm.create_model(f"local-dir:{directory}", pretrained=True)
    except (OSError, RuntimeError, ValueError) as e:
        raise ModelRepositoryError(f"timm cannot load {directory}: {e}") from e
    model.eval()
    preprocess = preprocess_from_timm(resolve_data_config({}, model=model), str(directory))
    return model, preprocess, str(config["architecture"])
