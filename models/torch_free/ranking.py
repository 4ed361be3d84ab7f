"""The order classify and rank answer in: what the transformers zero-shot pipeline's stable sort gives."""

from __future__ import annotations

from collections.abc import Sequence


def best_first(scores: Sequence[float], top_k: int | None = None) -> list[int]:
    """Indices of ``scores``, highest first; ties keep their given order (the pipeline's stable sort), cut to ``top_k``."""
    order = sorted(range(len(scores)), key=lambda index: -scores[index])
    return order if top_k is None else order[:top_k]
