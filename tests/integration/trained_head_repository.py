"""A model repository whose fusion head is marked trained: the only score of a model without a calibrated one."""

from __future__ import annotations

from pathlib import Path


def write_tiny_with_a_trained_head(repository: Path, seed: int = 7) -> Path:
    """The tiny preset written to ``repository`` with a seeded fresh head saved as trained, for its towers."""
    from models.fusion_head_file import FUSION_HEAD_FILE, save_fusion_head
    from models.loading.repository import build_preset, fingerprint, load_repository, write_repository
    from models.training.loop import fresh_head

    write_repository(repository, build_preset("tiny", seed=0))
    bundle = load_repository(repository)
    towers = fingerprint(bundle.model, bundle.tokenizer, bundle.config, skip_prefix="fusion.")
    save_fusion_head(repository / FUSION_HEAD_FILE, fresh_head(bundle.model.fusion, seed), towers_fingerprint=towers,
                     is_trained=True)
    return repository
