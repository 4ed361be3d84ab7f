"""The middle of ``/v1/classify`` and ``/v1/rank``, run where the model is: encode both sides, score, report.

    ZeroShotWork ──LocalZeroShot.score──> images: one vision item each (intake)   ─┐
                                          texts:  cached text segments, misses    ├─> (N, L) scores ──> ZeroShotScores
                                                  through the text lane          ─┘    (pool: torch off the loop)

One process runs it for its own routes (``server.routes.zero_shot``). With
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

import asyncio
import enum
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from models.scores import CalibratedScore
from models.zero_shot import classify_score_kind, classify_scores, pair_scores, stack_embeddings
from router.errors import IntakeItemError
from router.intake import IntakeOutcome
from router.segments import ImageContent
from router.zero_shot import EncodedImages, EncodedTexts, TokenizedTexts, ZeroShotEncoder, ZeroShotOptions
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


class LocalZeroShot:
    """Classify and rank on this process's model: its segment cache, lanes and score.

    Args:
        encoder: The zero-shot encoder over this process's router and intake.
        score: The model's calibrated score; ``None``: its trained fusion head
            scores (the routes refuse a model with neither before this runs).
    """

    def __init__(self, encoder: ZeroShotEncoder, score: CalibratedScore | None) -> None:
        self.encoder = encoder
        self._score = score

    async def score(self, work: ZeroShotWork, arrival_ns: int) -> ZeroShotScores:
        images, texts = await self._encode(work, arrival_ns)
        (matrix, score_kind), score_ns = await self.encoder.timed(self._matrix(work, images, texts, arrival_ns))
        first = images.outcomes[0]
        stage_ns = dict(first.result.stage_ns)
        stage_ns["decode"] = max([texts.prepare_ns, *(outcome.decode_ns for outcome in images.outcomes)])
        if texts.text_ns:
            stage_ns["text"] = texts.text_ns
        stage_ns["score"] = score_ns
        return ZeroShotScores(
            matrix, score_kind, images.outcomes,
            tuple(outcome.plan.image_statuses()[0] for outcome in images.outcomes), texts.status_counts(),
            max(len(tokens.token_ids) for tokens in texts.tokens), stage_ns)

    async def _encode(self, work: ZeroShotWork, arrival_ns: int) -> tuple[EncodedImages, EncodedTexts]:
        """Images and texts at once; a failure names its item; the other side is cancelled."""
        encoder, options = self.encoder, work.options
        image_task = asyncio.ensure_future(encoder.encode_images(work.images, options, arrival_ns))
        text_task = asyncio.ensure_future(
            encoder.encode_texts(work.texts, options, arrival_ns) if work.tokenized is None
            else encoder.encode_tokenized(work.tokenized, options, arrival_ns))
        tasks = {image_task: work.image_field, text_task: work.text_field}
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:  # one side failed, or the request was cancelled: the other side stops and settles its plans
            if not all(task.done() for task in tasks):
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        for task, field in tasks.items():
            error = None if task.cancelled() else task.exception()
            if error is not None:
                raise (named(error, field) if isinstance(error, IntakeItemError) else error) from error
        return image_task.result(), text_task.result()

    async def _matrix(self, work: ZeroShotWork, images: EncodedImages, texts: EncodedTexts,
                      arrival_ns: int) -> tuple[np.ndarray, str]:
        """(N, L) scores and their kind: the model's calibrated score, or its trained fusion head's."""
        score = self._score
        if score is None:
            pair_texts = work.texts if work.tokenized is None else work.tokenized.tokens
            return await self.encoder.head_scores(work.images, pair_texts, work.options, arrival_ns), "match_score"
        image_embeddings = [segment.pooled for segment in images.segments]
        text_embeddings = [segment.pooled for segment in texts.segments]
        if work.pairing is Pairing.CLASSIFY:
            matrix = await self.encoder.off_loop(_classify_matrix, score, image_embeddings, text_embeddings)
            return matrix, classify_score_kind(score.kind).value
        matrix = await self.encoder.off_loop(_pair_matrix, score, image_embeddings, text_embeddings)
        return matrix, score.kind.value


def _classify_matrix(score: CalibratedScore, images: list, texts: list) -> np.ndarray:
    return classify_scores(score, stack_embeddings(images), stack_embeddings(texts)).numpy()  # (N, L)


def _pair_matrix(score: CalibratedScore, images: list, texts: list) -> np.ndarray:
    return pair_scores(score, stack_embeddings(images), stack_embeddings(texts)).numpy()  # (N, L)
