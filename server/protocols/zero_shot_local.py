"""Classify and rank on this process's own model (engine-side: the scores are torch).

The single process and the engine of ``--api-workers N``
(``server.workers.zero_shot_engine``) score here; an API process sends the
same ``ZeroShotWork`` to the engine instead (``server.workers.zero_shot_client``),
so the work, the answer and the error naming live in the torch-free
``server.protocols.zero_shot_run``.
"""

from __future__ import annotations

import asyncio

import numpy as np

from models.scores import CalibratedScore
from models.zero_shot import classify_score_kind, classify_scores, pair_scores, stack_embeddings
from router.errors import IntakeItemError
from router.zero_shot import EncodedImages, EncodedTexts, ZeroShotEncoder
from server.protocols.zero_shot_run import Pairing, ZeroShotScores, ZeroShotWork, named


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
        """Images and texts at once; a failure names its item; the other side is cancelled.

        The texts are tokenized and planned while the images decode, and computed once every image is
        prepared: a call refused for an image computes (and caches) no text, as with API processes, which
        decode a call's images before the engine sees it.
        """
        encoder, options = self.encoder, work.options
        images_prepared = asyncio.Event()
        image_task = asyncio.ensure_future(encoder.encode_images(work.images, options, arrival_ns, images_prepared))
        text_task = asyncio.ensure_future(
            encoder.encode_texts(work.texts, options, arrival_ns, images_prepared) if work.tokenized is None
            else encoder.encode_tokenized(work.tokenized, options, arrival_ns, images_prepared))
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
