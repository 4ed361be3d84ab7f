"""Model repositories: a directory that fully describes a servable model.

    my-model/
    ├── model.yaml            architecture, preprocessing, limits, dtype
    ├── weights.safetensors   every tensor of the model (no pickle)
    └── tokenizer/            a fast tokenizer (save_pretrained output)

``model.yaml`` may instead point ``text.hf_dir`` at a local Hugging Face
directory (``save_pretrained`` output, relative to the repository or
absolute); the text encoder and its tokenizer then come from there and
``weights.safetensors`` holds the vision and fusion tensors only. Likewise
``vision.timm_dir`` names a timm checkpoint in the Hub layout
(``models.families.timm_checkpoint``): the image tower, its architecture and its
preprocessing come from there. With both, each tower is loaded by its own
library and ``weights.safetensors`` (the fusion head) is optional:

    vision:  {timm_dir: my-vit}        # config.json + model.safetensors (timm save_for_hf)
    text:    {hf_dir: my-bert}         # any transformers text encoder + its tokenizer
    fusion:  {rank: 16}
    name:    vit-bert

Loading checks every tensor's name and shape against the architecture that
``model.yaml`` describes and names each mismatch. The fingerprint is a BLAKE2b
digest of the canonical config, the tokenizer and every tensor, computed the
same way for a preset built in memory, so equal models have equal
fingerprints and a changed model never shares cache entries with the old one.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import yaml
from torch import nn
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from transformers import PreTrainedTokenizerBase

from models.loading.config import ModelConfig
from models.torch_free.description import ModelDescription
from models.torch_free.model_files import (CONFIG_FILE, TOKENIZER_DIR, read_repository_config, resolve_inside,
                                          text_folder)
from models.errors import ModelRepositoryError
from models.fusion_head_file import FUSION_HEAD_FILE, FusionHeadInfo, load_fusion_head
from models.multimodal import MultimodalModel
from models.precision import torch_dtype
from models.families.presets import SYNTHETIC_ARCHITECTURE, preset_config
from models.families.synthetic import SyntheticServiceTimes, synthetic_towers
from models.text import TextEncoder
from models.families.timm_checkpoint import load_timm_checkpoint
from models.tokenizer import (
    TextTokenizer,
    build_byte_level_tokenizer,
    load_tokenizer,
)
from models.loading.weights_file import save_weights
from models.vision import VisionEncoder

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "weights.safetensors"
TEXT_PREFIX = "text."
VISION_PREFIX = "vision."
# What timm, transformers and torch raise on architecture numbers they cannot build.
_BUILD_ERRORS: tuple[type[Exception], ...] = (AssertionError, TypeError, ValueError, RuntimeError, KeyError)


@dataclass(frozen=True)
class ModelBundle:
    """A ready model with its tokenizer, config and identity."""

    model: MultimodalModel
    tokenizer: TextTokenizer
    config: ModelConfig
    fingerprint: str
    source: str  # "preset:<name> seed=<n>", the repository path, or the pretrained model's directory
    has_random_weights: bool
    fusion_head: FusionHeadInfo = FusionHeadInfo(is_trained=False)
    runtime: str = "torch"  # what runs the towers (``with_runtime``)
    quantization: str = "none"  # ``with_runtime``
    int8_cosine: float | None = None  # ``with_runtime``
    torch_fingerprint: str = ""  # the fingerprint under torch, which ``with_runtime`` derives from; "": ``fingerprint``

    def describe(self) -> ModelDescription:
        score = self.model.score
        return ModelDescription(
            name=self.config.name, fingerprint=self.fingerprint, family=self.config.family,
            score=None if score is None else score.kind.value,
            normalized_embeddings=self.model.normalize_embeddings,
            fusion_head="trained" if self.fusion_head.is_trained else "untrained",
            dtype=self.config.dtype, runtime=self.runtime, quantization=self.quantization,
            int8_cosine=self.int8_cosine,
        )


def with_runtime(bundle: ModelBundle, runtime: str, quantization: str = "none",
                 int8_cosine: float | None = None) -> ModelBundle:
    """``bundle`` served by ``runtime``, which is part of its fingerprint as the dtype is.

    Two runtimes compute the same function with other kernels, so their
    numbers differ in the last bits: a segment cached under one never answers
    for the other. Under torch the fingerprint is the one ``fingerprint``
    gives (the fusion head's towers check never sees a runtime). A
    quantization (``"int8"``) is part of it too.
    """
    torch_fingerprint = bundle.torch_fingerprint or bundle.fingerprint
    suffix = f"|runtime={runtime}" + (f"|quantization={quantization}" if quantization != "none" else "")
    served = torch_fingerprint if runtime == "torch" and quantization == "none" else hashlib.blake2b(
        f"{torch_fingerprint}{suffix}".encode(), digest_size=32).hexdigest()
    return replace(bundle, runtime=runtime, fingerprint=served, torch_fingerprint=torch_fingerprint,
                   quantization=quantization, int8_cosine=int8_cosine)


def _build(config: ModelConfig, tokenizer: PreTrainedTokenizerBase, text: TextEncoder | None,
           backbone: nn.Module | None = None) -> MultimodalModel:
    """The model ``config`` describes, around the towers given (``None``: built from its numbers).

    What the libraries raise on numbers they cannot build (timm's "dim should
    be divisible by num_heads" assertion, an unknown timm keyword) becomes a
    ``ModelRepositoryError`` naming the ``model.yaml`` section, not a traceback.
    """
    try:
        vision = VisionEncoder(config.vision, config.preprocess, backbone)
    except _BUILD_ERRORS as e:
        raise ModelRepositoryError(f"{CONFIG_FILE}: vision (architecture {config.vision.architecture!r}, "
                                   f"timm_kwargs {config.vision.timm_kwargs}) cannot be built: {e}") from e
    if text is None:
        try:
            text = TextEncoder.from_config(config.text, len(tokenizer), int(tokenizer.pad_token_id or 0))
        except _BUILD_ERRORS as e:
            raise ModelRepositoryError(f"{CONFIG_FILE}: text cannot be built from its numbers: {e}") from e
    try:
        return MultimodalModel(config, vision, text)
    except _BUILD_ERRORS as e:
        raise ModelRepositoryError(f"{CONFIG_FILE}: fusion (rank {config.fusion.rank}) cannot be built "
                                   f"on these towers: {e}") from e


def fingerprint(model: MultimodalModel, tokenizer: TextTokenizer, config: ModelConfig, *,
                skip_prefix: str | None = None) -> str:
    """BLAKE2b-256 over config, tokenizer and every tensor (name, dtype, shape, bytes).

    A tensor two towers share (a pretrained model's one set of weights) is
    hashed once, under its first name. ``skip_prefix`` leaves out a part of
    the model: ``"fusion."`` gives the towers' fingerprint, which a fusion
    head file names as the towers it was trained on.
    """
    digest = hashlib.blake2b(digest_size=32)
    config_data = config.to_dict()
    config_data["name"] = None  # what it is called is not what the model is,
    config_data["text"]["hf_dir"] = None  # nor where its files sit
    config_data["vision"]["timm_dir"] = None
    config_data["fusion"]["backend"] = None  # which kernel runs it is not either
    config_data["normalize_embeddings"] = model.normalize_embeddings
    digest.update(json.dumps(config_data, sort_keys=True).encode())
    digest.update(tokenizer.identity().encode())
    seen: set[int] = set()
    for name, tensor in sorted(model.state_dict(keep_vars=True).items()):
        if (skip_prefix is not None and name.startswith(skip_prefix)) or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)  # (N,): a 0-d tensor has no byte view
        digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return digest.hexdigest()


def attach_fusion_head(model: MultimodalModel, tokenizer: TextTokenizer, config: ModelConfig, directory: Path,
                       fusion_head: Path | None) -> FusionHeadInfo:
    """Load the trained head into ``model.fusion``: ``fusion_head`` when given, else ``fusion_head.safetensors``
    in ``directory`` when there is one; without either the head stays as initialised, reported untrained.

    Call it on the model as loaded, before ``finish_bundle``: the towers
    fingerprint the head file names is taken from the tensors as read, and the
    model's fingerprint must then cover the head it serves (cached K/V/Q
    segments are the head's projections).
    """
    head_path = fusion_head if fusion_head is not None else Path(directory) / FUSION_HEAD_FILE
    if head_path.is_file():
        towers = fingerprint(model, tokenizer, config, skip_prefix="fusion.")
        return load_fusion_head(head_path, model.fusion, towers_fingerprint=towers)
    if fusion_head is not None and fusion_head.is_dir():
        inside = fusion_head / FUSION_HEAD_FILE  # `mmserve train-fusion --out DIR` writes DIR/fusion_head.safetensors
        raise ModelRepositoryError(f"fusion head {fusion_head} is a directory, not a safetensors file"
                                   + (f": give the file in it, {inside}" if inside.is_file() else ""))
    if fusion_head is not None:
        raise ModelRepositoryError(f"fusion head {fusion_head} does not exist")
    return FusionHeadInfo(is_trained=False)


def finish_bundle(model: MultimodalModel, tokenizer: TextTokenizer, config: ModelConfig,
                  device: str, source: str, has_random_weights: bool,
                  fusion_head: FusionHeadInfo = FusionHeadInfo(is_trained=False),
                  dtype: str | None = None) -> ModelBundle:
    """Fingerprint ``model`` as loaded, then move it to its device and dtype: the servable bundle.

    ``dtype`` (``models.precision.SERVED_DTYPES``) overrides the config's;
    the served dtype is part of the config and so of the fingerprint (and of
    every segment-cache key), while a fusion head file keeps naming the
    towers as stored (``attach_fusion_head`` runs before this).
    """
    if dtype is not None:
        torch_dtype(dtype)  # names a bad value
        config = replace(config, dtype=dtype)
    model.eval()
    model.config = config
    model_fingerprint = fingerprint(model, tokenizer, config)
    model.to(device=device, dtype=torch_dtype(config.dtype))
    return ModelBundle(
        model=model,
        tokenizer=tokenizer,
        config=config,
        fingerprint=model_fingerprint,
        source=source,
        has_random_weights=has_random_weights,
        fusion_head=fusion_head,
    )


def build_preset(name: str, *, seed: int = 0, device: str = "cpu", backend: str | None = None,
                 service_times: SyntheticServiceTimes | None = None, dtype: str | None = None) -> ModelBundle:
    """A preset with seeded random weights (same seed, same weights, same fingerprint).

    ``service_times`` sets the ``synthetic`` preset's drawn stage times
    (``models.families.synthetic``; its defaults when None); other presets take none.
    """
    config = preset_config(name)
    if backend is not None:
        config = _with_backend(config, backend)
    tokenizer = build_byte_level_tokenizer(config.text.max_position_embeddings)
    torch.manual_seed(seed)
    if config.vision.architecture == SYNTHETIC_ARCHITECTURE:
        vision, text = synthetic_towers(config.preprocess, config.text, len(tokenizer),
                                        service_times or SyntheticServiceTimes(seed=seed))
        model = MultimodalModel(config, vision, text)
    elif service_times is not None:
        raise ValueError(f"preset {name!r} computes its stages; only 'synthetic' takes service times")
    else:
        model = _build(config, tokenizer, text=None)
    return finish_bundle(model, TextTokenizer.for_encoder(tokenizer, model.text.max_tokens), config, device,
                         f"preset:{name} seed={seed}", True, dtype=dtype)


def _with_backend(config: ModelConfig, backend: str) -> ModelConfig:
    return replace(config, fusion=replace(config.fusion, backend=backend))


def write_repository(directory: Path, bundle: ModelBundle) -> None:
    """Write ``bundle`` as a model repository (the directory may exist but must be empty).

    The ``synthetic`` preset is refused: its towers sleep for drawn service
    times instead of computing, so there are no weights to write and nothing
    ``load_repository`` could rebuild.
    """
    directory = Path(directory)
    if bundle.config.vision.architecture == SYNTHETIC_ARCHITECTURE:
        raise ModelRepositoryError(
            "the synthetic preset cannot be written as a model repository: its towers sleep instead of computing, "
            "so it has no weights to write; serve it with `mmserve serve --preset synthetic`")
    if directory.exists() and any(directory.iterdir()):
        raise ModelRepositoryError(f"{directory} exists and is not empty")
    directory.mkdir(parents=True, exist_ok=True)
    config = bundle.config
    (directory / CONFIG_FILE).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    state = {name: t.detach().to("cpu").contiguous() for name, t in bundle.model.state_dict().items()}
    if config.text.hf_dir is not None:
        state = {name: t for name, t in state.items() if not name.startswith(TEXT_PREFIX)}
    if config.vision.timm_dir is not None:
        state = {name: t for name, t in state.items() if not name.startswith(VISION_PREFIX)}
    save_weights(state, directory / WEIGHTS_FILE, {"format": "pt"})
    if config.text.hf_dir is None:
        bundle.tokenizer.tokenizer.save_pretrained(str(directory / TOKENIZER_DIR))


def _check_tensors(weights_path: Path, expected: dict[str, torch.Tensor]) -> None:
    """Compare names and shapes in the weights file with the architecture; name every mismatch."""
    try:
        with safe_open(str(weights_path), framework="pt") as f:
            found = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (OSError, SafetensorError) as e:
        raise ModelRepositoryError(f"{weights_path} is not a readable safetensors file "
                                   f"(truncated or corrupt?): {e}") from e
    problems: list[str] = []
    for name in sorted(set(expected) - set(found)):
        problems.append(f"missing tensor {name} (expected shape {tuple(expected[name].shape)})")
    for name in sorted(set(found) - set(expected)):
        problems.append(f"unexpected tensor {name} (shape {found[name]})")
    for name in sorted(set(found) & set(expected)):
        if found[name] != tuple(expected[name].shape):
            problems.append(
                f"tensor {name} has shape {found[name]}, the architecture expects {tuple(expected[name].shape)}"
            )
    if problems:
        raise ModelRepositoryError(f"{weights_path} does not match {CONFIG_FILE}: " + "; ".join(problems))


def _timm_tower(directory: Path, config: ModelConfig, raw: dict) -> tuple[ModelConfig, nn.Module]:
    """``vision.timm_dir``'s model, and ``config`` with its architecture and preprocessing (checked if written)."""
    backbone, preprocess, architecture = load_timm_checkpoint(
        resolve_inside(directory, config.vision.timm_dir, "vision.timm_dir"))
    written = raw["vision"].get("architecture")
    if written not in (None, architecture):
        raise ModelRepositoryError(f"{CONFIG_FILE}: vision.architecture {written!r} is not the timm checkpoint's "
                                   f"{architecture!r}; leave it out")
    if "preprocess" in raw and config.preprocess != preprocess:
        raise ModelRepositoryError(f"{CONFIG_FILE}: preprocess {config.preprocess} is not the timm checkpoint's "
                                   f"own eval transform {preprocess}; leave it out to use the checkpoint's")
    return replace(config, vision=replace(config.vision, architecture=architecture), preprocess=preprocess), backbone


def load_repository(directory: Path, *, device: str = "cpu", backend: str | None = None,
                    fusion_head: Path | None = None, is_trained_head_read: bool = True,
                    dtype: str | None = None) -> ModelBundle:
    """Load and verify a model repository written by ``write_repository`` (or by hand).

    With ``vision.timm_dir`` and ``text.hf_dir`` both towers come from their
    directories and ``weights.safetensors`` (the fusion head's tensors) is
    optional: without it the head starts from seed 0, untrained. A trained
    head (``fusion_head``, else ``fusion_head.safetensors`` in the repository)
    replaces the head's tensors of ``weights.safetensors``; ``is_trained_head_read``
    False leaves it unread (``mmserve train-fusion`` trains a new one).
    ``dtype`` serves the model in another dtype than ``model.yaml``'s
    (which is the dtype its weights are kept in).
    """
    directory = Path(directory)
    weights_path = directory / WEIGHTS_FILE
    raw, config = read_repository_config(directory)  # also judged before torch loads (server.runtime.startup_checks)
    if backend is not None:
        config = _with_backend(config, backend)

    backbone: nn.Module | None = None
    if config.vision.timm_dir is not None:
        config, backbone = _timm_tower(directory, config, raw)
    text: TextEncoder | None = None
    tokenizer_dir = text_folder(directory, config)  # also judged before torch loads
    tokenizer = load_tokenizer(tokenizer_dir)
    if config.text.hf_dir is not None:
        text = TextEncoder.from_pretrained(tokenizer_dir)
    is_weights_optional = backbone is not None and text is not None
    if not weights_path.is_file() and not is_weights_optional:
        raise ModelRepositoryError(f"model repository {directory} has no {WEIGHTS_FILE}")

    torch.manual_seed(0)  # the fusion head's initial weights when no weights file holds them
    model = _build(config, tokenizer, text, backbone)
    external = tuple(prefix for prefix, tower in ((VISION_PREFIX, backbone), (TEXT_PREFIX, text)) if tower is not None)
    if weights_path.is_file():
        expected = {name: t for name, t in model.state_dict().items() if not name.startswith(external)}
        _check_tensors(weights_path, expected)
        try:
            state = load_file(str(weights_path))
        except (OSError, SafetensorError) as e:
            raise ModelRepositoryError(f"{weights_path} is not a readable safetensors file: {e}") from e
        model.load_state_dict(state, strict=not external)
    text_tokenizer = TextTokenizer.for_encoder(tokenizer, model.text.max_tokens)
    head_info = (attach_fusion_head(model, text_tokenizer, config, directory, fusion_head) if is_trained_head_read
                 else FusionHeadInfo(is_trained=False))
    logger.info("loaded model repository %s (%s)", directory, config.name)
    return finish_bundle(model, text_tokenizer, config, device, str(directory), False, head_info, dtype=dtype)
