"""``fusion_head.safetensors``: the low-rank cross-modal head's weights, beside the model.

    fusion_head.safetensors
      tensors   the state dict of ``LowRankCrossAttention`` (models/fusion.py):
                q_proj.weight (r, d_t)     k_proj.weight (r, d_v)    v_proj.weight (d_v, d_v)
                out_proj.weight (E_t, d_v) out_proj.bias (E_t,)      norm.weight, norm.bias (E_t,)
                image_proj.weight (E_t, E_v)                          match_logit_scale, match_logit_bias ()
      metadata  format = "mmserve-fusion-head", format_version = "1", rank,
                towers_fingerprint (the towers it was trained on; see ``towers_fingerprint``),
                trained = "true" | "false", card = JSON (what it was trained on, held-out AUC)

``mmserve train-fusion`` writes trained = "false" only when asked to keep a
head that learned nothing (``--keep-untrained-result``); the server loads
such a file but serves no ``match_score`` from it, as for any untrained head.

The pretrained towers stay frozen and untouched; only this file is written by
``mmserve train-fusion``. A head trained on other towers is refused: its
queries and keys would project token states it never saw.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from models.errors import ModelRepositoryError
from models.fusion import LowRankCrossAttention
from models.loading.weights_file import save_weights

FUSION_HEAD_FILE = "fusion_head.safetensors"
FORMAT = "mmserve-fusion-head"
FORMAT_VERSION = "1"


@dataclass(frozen=True)
class FusionHeadInfo:
    """Where the served head came from and whether its ``match_score`` means anything."""

    is_trained: bool
    source: str | None = None  # the file it was read from; None: initialised from a seed
    card: dict[str, Any] = field(default_factory=dict)


def save_fusion_head(path: Path, head: LowRankCrossAttention, *, towers_fingerprint: str,
                     is_trained: bool, card: dict[str, Any] | None = None) -> None:
    state = {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in head.state_dict().items()}
    metadata = {"format": FORMAT, "format_version": FORMAT_VERSION, "rank": str(head.rank),
                "towers_fingerprint": towers_fingerprint, "trained": "true" if is_trained else "false",
                "card": json.dumps(card or {}, sort_keys=True)}
    save_weights(state, path, metadata)  # not 0600: the server may run as another user


def load_fusion_head(path: Path, head: LowRankCrossAttention, *, towers_fingerprint: str) -> FusionHeadInfo:
    """Load ``path`` into ``head`` (in place), checking format, towers and every tensor's shape."""
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (OSError, ValueError, SafetensorError) as e:  # SafetensorError: not safetensors, or truncated
        raise ModelRepositoryError(f"cannot read the fusion head {path}: {e}") from e
    if metadata.get("format") != FORMAT:
        raise ModelRepositoryError(f"{path} is not an mmserve fusion head (metadata format is "
                                   f"{metadata.get('format')!r}, expected {FORMAT!r})")
    if metadata.get("towers_fingerprint") != towers_fingerprint:
        raise ModelRepositoryError(
            f"{path} was trained on other towers (towers fingerprint {metadata.get('towers_fingerprint')}, "
            f"this model's is {towers_fingerprint}); train a head for this model with `mmserve train-fusion`")
    expected = head.state_dict()
    problems = [f"missing tensor {name} {tuple(t.shape)}" for name, t in expected.items() if name not in tensors]
    problems += [f"unexpected tensor {name}" for name in tensors if name not in expected]
    problems += [f"tensor {name} has shape {tuple(tensors[name].shape)}, the head expects {tuple(t.shape)}"
                 for name, t in expected.items() if name in tensors and tensors[name].shape != t.shape]
    if problems:
        raise ModelRepositoryError(f"{path} does not fit this model's fusion head: " + "; ".join(problems))
    head.load_state_dict({name: t.to(expected[name].dtype) for name, t in tensors.items()})
    return FusionHeadInfo(is_trained=metadata.get("trained") == "true", source=str(path),
                          card=json.loads(metadata.get("card") or "{}"))
