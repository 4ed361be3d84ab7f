"""What a model's directory must hold before any library opens it, judged from its files alone (no torch).

    --model DIR         model.yaml, config.json or open_clip_config.json
                        (``models.families.pretrained.detect_family`` then picks the family)
    --model-repo DIR    model.yaml: YAML, a mapping, keys and values ``ModelConfig`` accepts;
                        the folder the tokenizer is read from (tokenizer/, or text.hf_dir)

``mmserve serve`` runs these before it imports torch (``server.runtime.startup_checks``),
so a directory missing its files is refused in a second; the loaders run the same
functions as they load, so the refusal reads the same either way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from models.errors import ModelRepositoryError
from models.loading.config import ModelConfig

CONFIG_FILE = "model.yaml"
TOKENIZER_DIR = "tokenizer"
OPEN_CLIP_CONFIG_FILE = "open_clip_config.json"
TRANSFORMERS_CONFIG_FILE = "config.json"
SUPPORTED_FAMILIES = ("mmserve model repository (model.yaml, optionally vision.timm_dir + text.hf_dir)", "siglip",
                      "clip", "open_clip (open_clip_config.json)")


def require_model_files(directory: Path) -> None:
    """``ModelRepositoryError`` unless ``directory`` holds a config some supported family is read from."""
    if not any((directory / name).is_file()
               for name in (CONFIG_FILE, TRANSFORMERS_CONFIG_FILE, OPEN_CLIP_CONFIG_FILE)):
        raise no_model_files(directory)


def no_model_files(directory: Path) -> ModelRepositoryError:
    return ModelRepositoryError(f"{directory} has neither {CONFIG_FILE} nor {TRANSFORMERS_CONFIG_FILE}; supported: "
                                f"{', '.join(SUPPORTED_FAMILIES)}")


def read_repository_config(directory: Path) -> tuple[dict[str, Any], ModelConfig]:
    """A model repository's ``model.yaml``: as written, and as ``ModelConfig``; ``ModelRepositoryError`` naming
    the file and the key otherwise."""
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise ModelRepositoryError(f"model repository {directory} has no {CONFIG_FILE}")
    try:
        raw = yaml.safe_load(config_path.read_text())
    except yaml.YAMLError as e:
        raise ModelRepositoryError(f"{config_path} is not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ModelRepositoryError(f"{config_path} must hold a mapping")
    return raw, ModelConfig.from_dict(raw)


def resolve_inside(repository: Path, relative: str, key: str) -> Path:
    """A path from model.yaml: absolute as written, relative ones may not leave the repository."""
    candidate = Path(relative)
    if candidate.is_absolute():
        return candidate
    resolved = (repository / candidate).resolve()
    if not resolved.is_relative_to(repository.resolve()):
        raise ModelRepositoryError(
            f"{CONFIG_FILE}: {key} {relative!r} points outside the repository {repository}"
        )
    return resolved


def text_folder(directory: Path, config: ModelConfig) -> Path:
    """The folder a repository's tokenizer is read from: ``text.hf_dir`` (the text encoder's too), else
    ``tokenizer/``; ``ModelRepositoryError`` naming it when it does not exist."""
    if config.text.hf_dir is not None:
        hf_dir = resolve_inside(directory, config.text.hf_dir, "text.hf_dir")
        if not hf_dir.is_dir():
            raise ModelRepositoryError(f"{CONFIG_FILE}: text.hf_dir {config.text.hf_dir!r}: "
                                       f"the folder {hf_dir} does not exist")
        return hf_dir
    tokenizer_dir = resolve_inside(directory, TOKENIZER_DIR, TOKENIZER_DIR)
    if not tokenizer_dir.is_dir():
        raise missing_tokenizer_folder(tokenizer_dir)
    return tokenizer_dir


def missing_tokenizer_folder(directory: Path) -> ModelRepositoryError:
    """Named as such: transformers would take the path for a Hub repo id and complain about the id's form."""
    return ModelRepositoryError(f"cannot load the tokenizer from {directory}: the folder does not exist")
