"""Where a model's files are: a local directory, or a Hugging Face Hub id found in the local Hub cache.

``mmserve serve --model X`` takes either. A directory is used as it is. An id
(``org/name``, optionally ``org/name@revision``) is looked up in the Hub
cache first (``HF_HOME`` / ``HF_HUB_CACHE``, the same cache ``transformers``
and ``huggingface-cli download`` fill), without touching the network. Only
when it is not there, and ``HF_HUB_OFFLINE`` is not set, is it downloaded
(weights as safetensors only). Offline, a missing id fails with a message
naming the id and the cache directory.

Weights are read from safetensors only: a checkpoint that has only pickled
weights (``pytorch_model.bin``) is refused, with the way to convert it.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

from models.errors import ModelRepositoryError

# What a served model needs from a Hub repository: configs, tokenizers, safetensors weights.
_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.yaml"]
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def _split_revision(model_id: str) -> tuple[str, str | None]:
    repo_id, _, revision = model_id.partition("@")
    return repo_id, revision or None


def resolve_model_directory(name_or_path: str) -> Path:
    """The local directory holding ``name_or_path``'s files (see the module docstring)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.is_file():  # a weights or config file: the model is the directory around it
        raise ModelRepositoryError(f"--model {name_or_path!r} is a file, not a directory: pass the model's directory "
                                   f"({str(path.parent)!r}?)")
    repo_id, revision = _split_revision(name_or_path)
    if path.exists() or repo_id.count("/") != 1:
        raise ModelRepositoryError(f"--model {name_or_path!r} is neither a directory nor a Hub id (org/name)")
    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except HFValidationError as e:
        raise ModelRepositoryError(f"--model {name_or_path!r} is not a valid Hub id: {e}") from e
    except LocalEntryNotFoundError as e:
        if constants.HF_HUB_OFFLINE:
            raise ModelRepositoryError(
                f"{repo_id} is not in the local Hugging Face cache {constants.HF_HUB_CACHE} and HF_HUB_OFFLINE=1 "
                f"forbids downloading it: run `huggingface-cli download {repo_id}` where there is a network "
                "(with the same HF_HOME / HF_HUB_CACHE), or pass the model's directory") from e
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=_ALLOW_PATTERNS))
    except Exception as e:  # noqa: BLE001 - network and Hub errors come in many types; all mean "not available"
        raise ModelRepositoryError(
            f"{repo_id} is not in the local Hugging Face cache {constants.HF_HUB_CACHE} and downloading it "
            f"failed ({type(e).__name__}: {e}); set HF_HUB_OFFLINE=1 to look in the cache only") from e


def require_safetensors(directory: Path, weights_hint: str = "model.safetensors") -> None:
    """Refuse a checkpoint whose weights are only pickled (loading those can run code)."""
    has_safetensors = any(directory.glob("*.safetensors"))
    if has_safetensors:
        return
    pickled = sorted(p.name for p in directory.iterdir() if p.suffix in _PICKLE_SUFFIXES)
    if pickled:
        raise ModelRepositoryError(
            f"{directory} has weights only as pickle ({', '.join(pickled)}); mmserve loads safetensors only, "
            "since unpickling can run arbitrary code. Convert it once where you trust the file, e.g. "
            f"`python -c \"from transformers import AutoModel; AutoModel.from_pretrained('{directory}')"
            f".save_pretrained('{directory}-safetensors')\"` (transformers writes safetensors), then serve that "
            "directory")
    raise ModelRepositoryError(f"{directory} has no weights file ({weights_hint})")
