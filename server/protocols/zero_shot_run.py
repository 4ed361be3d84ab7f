"""The middle of ``/v1/classify`` and ``/v1/rank`` as values: the work, its scores, and how an item's error is named.

Where the model is, ``server.protocols.zero_shot_local.LocalZeroShot`` runs it:

    ZeroShotWork ──LocalZeroShot.score──> images: one vision item each (intake)   ─┐
                                          texts:  cached text segments, misses    ├─> (N, L) scores ──> ZeroShotScores
                                                  through the text lane          ─┘    (pool: torch off the loop)

This module is API-side (no torch): one process runs it for its own routes (``server.routes.zero_shot``). With
``--api-workers N`` the engine runs it for an API process, which tokenized
and keyed the texts and decoded the images already
(``server.workers.zero_shot_client``): so ``ZeroShotWork`` and
``ZeroShotScores`` are plain values that cross between processes
(``server.workers.frame_codec``). The label embeddings stay where they were
computed; only the (N, L) matrix, the cache statuses and the stage times
travel back.

Scores are the model's own (``models.zero_shot``): classify gives what
transformers' ``zero-shot-image-classification`` pipeline gives (SigLIP's
sigmoid per label, CLIP's softmax over the labels), rank the family's
per-pair score. A model whose only image-text score is its trained fusion
head answers with the head's ``match_score`` (``ZeroShotEncoder.head_scores``).

A failed item is its own answer, named by its field: each side's field is a
template (``images[{}]``, ``image``, ``labels[{}]``, ``query``, ...) filled
with the item's index, so the name crosses processes as a string.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from router.errors import IntakeItemError
from router.intake import IntakeOutcome
from router.segments import ImageContent
from router.zero_shot import TokenizedTexts, ZeroShotOptions
from server.errors import ApiError
from server.http.error_mapping import api_error_from


class Pairing(enum.Enum):
    """Which scores a call wants: classify's (the pipeline's normalisation) or rank's (per pair)."""

    CLASSIFY = "classify"
    RANK = "rank"


@dataclass(frozen=True)
class ZeroShotWork:
    """A checked classify or rank call's middle: its images against its texts, and how to name and score them.

    ``texts`` as sent (templated labels, a query, candidates), or, where an API
    process tokenized and keyed them already, ``tokenized`` (and ``texts`` empty).
    """

    images: tuple[ImageContent, ...]
    texts: tuple[str, ...]
    tokenized: TokenizedTexts | None
    pairing: Pairing
    image_field: str  # image i's field in errors: a template filled with i ("images[{}]", "query")
    text_field: str  # likewise ("labels[{}]", "candidates[{}]", "query")
    options: ZeroShotOptions

    def with_tokens(self, tokenized: TokenizedTexts, images: tuple[ImageContent, ...] | None = None) -> ZeroShotWork:
        """This work as an API process sends it: texts as tokens and keys, ``images`` as sent (default: these)."""
        return ZeroShotWork(self.images if images is None else images, (), tokenized, self.pairing,
                            self.image_field, self.text_field, self.options)


@dataclass(frozen=True)
class ZeroShotScores:
    """A scored call: what the route renders and records (plain values: they cross processes).

    ``stage_ns``: ``decode`` (the longest of the texts' and the images'
    preparing), the first image's batch stages, ``text`` when a text was
    encoded, ``score`` (the matrix).
    """

    matrix: np.ndarray  # (N, L) float
    score_kind: str
    outcomes: tuple[IntakeOutcome, ...]  # the images', in order
    image_statuses: tuple[str, ...]  # each image's cache status
    text_statuses: dict[str, int]  # distinct texts per cache status (hit, miss, coalesced, bypass)
    num_text_tokens: int  # the longest text's
    stage_ns: dict[str, int]


class ZeroShotScorer(Protocol):
    """``state.zero_shot``: this process's model (``LocalZeroShot``) or the engine's (``ZeroShotClient``)."""

    async def score(self, work: ZeroShotWork, arrival_ns: int) -> ZeroShotScores:
        """The call's scores; raises ``ApiError`` naming the failed item's field, or the router's errors."""


def named(error: IntakeItemError, field: str) -> ApiError | IntakeItemError:
    """An item's failure as its own answer, named by its field (``labels[3]``); 503/504 keep theirs."""
    inner = api_error_from(error.error)
    if inner is None:
        return error
    if inner.status in (503, 504):
        return inner
    name = field.format(error.item_index)
    return ApiError(inner.status, inner.code, f"{name}: {inner.message}", name, inner.retry_after_s)
