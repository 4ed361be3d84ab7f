"""``state.zero_shot`` in an API process: classify and rank prepared here, scored by the engine.

    texts      tokenized and keyed in this process's decode pool, remembered in a
               ``TokenMemo`` (``router.zero_shot.tokenize_texts``): the engine tokenizes nothing
    images     the engine's cache peeked, the others decoded, then put into pixel slots
               as the call is sent (``EngineClient.decode_pixels``, ``put_pixels``: a
               cached image is not decoded)
    ── both at once; a refused text or image is answered here, named by its field ──
    zero_shot  ("zero_shot", id, work with tokens and keys, arrival_ns, block, slots; raw pixels
               decoded here go as their key and length, ``server.workers.raw_pixels_sent``)
               -> the engine plans the texts against its segment cache, encodes the
                  misses in its text lane, runs the images through its intake with
                  these pixels, and scores (server.workers.zero_shot_engine)
               <- ("ok", id, ZeroShotScores): the (N, L) matrix, never the label embeddings

The answer, its errors, its ``cache`` field and its stages are the single
process's (``server.protocols.zero_shot_run``): the route renders and records
them as it does there. ``decode`` counts this process's preparing (tokenize,
peek, decode) plus the engine's (plans, pixels out of their slots), as
``EngineClient.run`` counts it for every other route. Deadlines count from
arrival here (``arrival_ns``, one monotonic clock for the machine); a client
that goes away cancels the call in the engine; the slots are free once the
engine has copied the pixels out, as the call arrives.

A label's segment key is made here with the engine's fingerprint (the
catalog of ``describe``), beside its tokens, so the engine neither tokenizes
nor hashes a label set: both sides key with the same ``router.segments`` code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from concurrent.futures import Executor

import numpy as np

from models.torch_free.text_ids import LimitedTokenizer
from router.errors import IntakeItemError
from router.intake import IntakeItem
from router.segments import SegmentCatalog
from router.zero_shot import MAX_MEMOIZED_TEXTS, TokenizedTexts, TokenMemo, tokenize_texts
from server.errors import ApiError
from server.protocols.zero_shot_run import ZeroShotScores, ZeroShotWork, named
from server.workers.engine_client import CallInFlight, EngineClient
from server.workers.engine_connection import EngineConnection
from server.workers.raw_pixels_sent import images_left_behind


class ZeroShotClient:
    """Classify and rank for an API process: texts and images prepared here, the rest in the engine.

    Args:
        client: This process's connection to the engine (slots, drills, in-flight count).
        tokenizer: The engine's tokenizer, rebuilt here from its files.
        catalog: Keys only, with the engine's fingerprint (the cache is the engine's).
        executor: Where texts are tokenized (the decode pool, as for every route).
    """

    def __init__(self, client: EngineClient, tokenizer: LimitedTokenizer, catalog: SegmentCatalog, executor: Executor,
                 *, max_memoized_texts: int = MAX_MEMOIZED_TEXTS) -> None:
        self._client = client
        self._tokenizer = tokenizer
        self._catalog = catalog
        self._executor = executor
        self.token_memo = TokenMemo(max_memoized_texts)

    async def score(self, work: ZeroShotWork, arrival_ns: int) -> ZeroShotScores:
        """The engine's scores for ``work``; a refused item raises here, as one process names it."""
        client = self._client
        with CallInFlight(client) as call:
            engine = client.choose(label_set_key(work) if work.options.use_cache else None, "text")
            tokenized, pixels = await self._prepare(work, engine)
            sent = work.with_tokens(tokenized, images_left_behind(work.images, pixels, self._catalog))
            slots = client.put_pixels([[image] for image in pixels])
            image_slots = [item_slots[0] for item_slots in slots]
            kind, fields = await call.send(engine, slots, "zero_shot", sent, arrival_ns, client.slots_name,
                                           image_slots)
        if kind != "ok":
            _, (status, code, message, field, retry_after_s) = fields
            raise ApiError(status, code, message, field, retry_after_s)
        scores: ZeroShotScores = fields[0]
        stage_ns = {**scores.stage_ns, "decode": call.prepare_ns + scores.stage_ns["decode"]}
        return dataclasses.replace(scores, stage_ns=stage_ns, outcomes=tuple(map(call.counted, scores.outcomes)))

    async def _prepare(self, work: ZeroShotWork,
                       engine: EngineConnection) -> tuple[TokenizedTexts, list[np.ndarray | None]]:
        """Texts tokenized and images in slots, at once; the first refused image, else text, named by its field.

        Each image is its own item, as the single process's intake runs it
        (``ZeroShotEncoder.encode_images``), so a drill delays it and a bad one
        is refused as there. Returns each image's model input (``None``: the engine holds it).
        """
        options = work.options
        items = [IntakeItem(request_id=f"{options.request_id}-image-{index}", images=(content,),
                            priority=options.priority, timeout_ms=options.timeout_ms, use_cache=options.use_cache,
                            trace=options.trace)
                 for index, content in enumerate(work.images)]
        texts = asyncio.wrap_future(self._executor.submit(
            tokenize_texts, self._tokenizer, self._catalog, self.token_memo, work.texts, options.truncate))
        images = asyncio.ensure_future(self._client.decode_pixels(items, engine))
        decoded, tokenized = await asyncio.gather(images, texts, return_exceptions=True)
        for outcome, field in ((decoded, work.image_field), (tokenized, work.text_field)):
            if isinstance(outcome, BaseException):
                raise (named(outcome, field) if isinstance(outcome, IntakeItemError) else outcome) from outcome
        return tokenized, [item_pixels[0] for item_pixels in decoded]  # type: ignore[return-value,union-attr]


def label_set_key(work: ZeroShotWork) -> bytes:
    """Which engine a classify or rank call goes to: the one that owns its label set (its texts, in order), whose
    embeddings it then finds in its cache (``server.workers.engine_dispatch``)."""
    digest = hashlib.blake2b(digest_size=16)
    for text in work.texts:
        digest.update(text.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.digest()
