"""What each family's own library says an image or a text embeds to: the reference a server is held to.

One small random model per family (``benchmarks.random_pretrained``), its
library embedding one input at a time through its own Pillow path, as a
user's would: transformers for SigLIP (texts padded to max_length, as its
zero-shot pipeline does) and CLIP, open_clip, and timm ViT pre-logits with
BERT's mean-pooled last hidden state. Agreement is judged by cosine, which
ignores normalisation.
"""

from __future__ import annotations

import enum
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from benchmarks.random_pretrained import (
    TowerSize, write_clip, write_open_clip, write_siglip, write_timm_bert_repository,
)


class Family(str, enum.Enum):
    SIGLIP = "siglip"
    CLIP = "clip"
    OPEN_CLIP = "open_clip"
    TIMM_BERT = "timm_bert"


@dataclass(frozen=True)
class ReferenceInputs:
    """The inputs every server and the library embed: encoded images (their bytes) and texts."""

    images: tuple[bytes, ...]
    texts: tuple[str, ...]


@dataclass(frozen=True)
class ReferenceEmbeddings:
    """The library's embeddings of ``ReferenceInputs``, in the same order."""

    images: tuple[np.ndarray, ...]  # each (D_image,) float32
    texts: tuple[np.ndarray, ...]  # each (D_text,) float32


_WRITERS: dict[Family, Callable[[Path, TowerSize], Path]] = {
    Family.SIGLIP: lambda directory, size: write_siglip(directory, size),
    Family.CLIP: lambda directory, size: write_clip(directory, size),
    Family.OPEN_CLIP: lambda directory, size: write_open_clip(directory, size),
    Family.TIMM_BERT: lambda directory, size: write_timm_bert_repository(directory, size),
}


def write_family(family: Family, directory: Path, size: TowerSize) -> Path:
    """The family's small random model, written as its library writes it; returns the directory to serve."""
    return _WRITERS[family](Path(directory), size)


def _rgb(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def _features(output: object) -> torch.Tensor:
    """transformers 5 returns a ModelOutput from get_*_features (the projection in ``pooler_output``)."""
    pooled = getattr(output, "pooler_output", None)
    return output if pooled is None else pooled  # type: ignore[return-value]


def _transformers(directory: Path, inputs: ReferenceInputs, processor_name: str,
                  text_kwargs: dict) -> ReferenceEmbeddings:
    import transformers

    model = transformers.AutoModel.from_pretrained(str(directory)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    processor = getattr(transformers, processor_name).from_pretrained(str(directory))
    with torch.no_grad():
        images = tuple(
            _features(model.get_image_features(pixel_values=processor(images=_rgb(data), return_tensors="pt")[
                "pixel_values"]))[0].numpy()
            for data in inputs.images)
        texts = tuple(_features(model.get_text_features(**tokenizer([text], return_tensors="pt", **text_kwargs)))[0]
                      .numpy() for text in inputs.texts)
    return ReferenceEmbeddings(images, texts)


def _siglip(directory: Path, inputs: ReferenceInputs) -> ReferenceEmbeddings:
    from transformers import AutoTokenizer

    max_tokens = AutoTokenizer.from_pretrained(str(directory)).model_max_length
    return _transformers(directory, inputs, "SiglipImageProcessorPil",
                         {"padding": "max_length", "truncation": True, "max_length": max_tokens})


def _clip(directory: Path, inputs: ReferenceInputs) -> ReferenceEmbeddings:
    return _transformers(directory, inputs, "CLIPImageProcessorPil", {})


def _open_clip(directory: Path, inputs: ReferenceInputs) -> ReferenceEmbeddings:
    import open_clip

    model, _, transform = open_clip.create_model_and_transforms(f"local-dir:{directory}")
    tokenizer = open_clip.get_tokenizer(f"local-dir:{directory}")
    model.eval()
    with torch.no_grad():
        images = tuple(model.encode_image(transform(_rgb(data))[None])[0].numpy() for data in inputs.images)
        texts = tuple(model.encode_text(tokenizer([text]))[0].numpy() for text in inputs.texts)
    return ReferenceEmbeddings(images, texts)


def _timm_bert(directory: Path, inputs: ReferenceInputs) -> ReferenceEmbeddings:
    import timm
    from timm.data import create_transform, resolve_data_config
    from transformers import AutoModel, AutoTokenizer

    vit = timm.create_model(f"local-dir:{directory / 'vit'}", pretrained=True).eval()
    transform = create_transform(**resolve_data_config({}, model=vit))
    bert = AutoModel.from_pretrained(str(directory / "bert")).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(directory / "bert"))
    with torch.no_grad():
        images = tuple(vit.forward_head(vit.forward_features(transform(_rgb(data))[None]), pre_logits=True)[0].numpy()
                       for data in inputs.images)
        # One unpadded text: the mean over all of its tokens is the masked mean.
        texts = tuple(bert(**tokenizer([text], return_tensors="pt")).last_hidden_state[0].mean(0).numpy()
                      for text in inputs.texts)
    return ReferenceEmbeddings(images, texts)


_REFERENCES: dict[Family, Callable[[Path, ReferenceInputs], ReferenceEmbeddings]] = {
    Family.SIGLIP: _siglip, Family.CLIP: _clip, Family.OPEN_CLIP: _open_clip, Family.TIMM_BERT: _timm_bert,
}


def reference_embeddings(family: Family, directory: Path, inputs: ReferenceInputs) -> ReferenceEmbeddings:
    """The family library's embeddings of every input, computed in this process."""
    return _REFERENCES[family](Path(directory), inputs)


def min_cosine(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> float:
    """The smallest cosine between each served vector and its reference (pairs in order); -inf if none."""
    if len(got) != len(want):
        raise ValueError(f"{len(got)} served vectors for {len(want)} references")
    cosines = [float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))) if a.shape == b.shape else float("-inf")
               for a, b in zip((np.asarray(g, dtype=np.float64) for g in got),
                               (np.asarray(w, dtype=np.float64) for w in want))]
    return min(cosines, default=float("-inf"))
