"""The engine's side of ``/v1/classify`` and ``/v1/rank`` for an API process: one ``zero_shot`` call.

    ("zero_shot", id, ZeroShotWork, arrival_ns, block, slots)
        work.tokenized   the texts' tokens and keys (the API process tokenized them)
        slots[i]         image i's pixels in the API process's block, or None (the peek said cached);
                         copied out as the call arrives (``take_pixels``), which frees the slot
    -> ("ok", id, ZeroShotScores) | ("error", id, None, error fields) | ("cancelled", id)

The call runs the single process's middle (``server.protocols.zero_shot_local.LocalZeroShot``)
on the engine's router: the texts planned against the segment cache (hits
cost nothing, misses go through the text lane, a label another request
computes is awaited), the images through the engine's intake with the API
process's pixels (``Engine._prepared``: an image not sent is one the cache
held; if it left the cache since, it is decoded here), then the (N, L) matrix,
or the trained fusion head's pair scores. The label embeddings stay here;
the answer carries the matrix, the cache statuses and the stage times, and
its image outcomes without their plans and segments (``engine_answers.portable``).
Errors are named by their field here, as one process names them.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import numpy as np

from router.intake import RequestIntake
from router.zero_shot import ZeroShotEncoder
from server.protocols.zero_shot_local import LocalZeroShot
from server.protocols.zero_shot_run import ZeroShotWork
from server.state import ServerState
from server.workers.engine_answers import error_fields, portable
from server.workers.pixel_slots import AttachedSlots


class ZeroShotEngine:
    """Answers ``zero_shot`` calls with the engine's model, cache and lanes.

    Args:
        state: The engine's state (its router, the model's score, the decode pool).
        intake: The engine's intake, which takes an image's pixels from ``prepared`` when there.
        prepared: ``id(ImageContent)`` -> pixels an API process decoded, shared with ``intake``.
    """

    def __init__(self, state: ServerState, intake: RequestIntake, prepared: dict[int, np.ndarray]) -> None:
        self._scorer = LocalZeroShot(ZeroShotEncoder(state.router, intake, state.decode_pool),
                                     state.router.bundle.model.score)
        self._prepared = prepared

    def take_pixels(self, work: ZeroShotWork, block: AttachedSlots, slots: list[int | None]) -> list[int]:
        """The slots' pixels copied out as the call arrives (each slot is free again at once); the images' ids."""
        prepared_ids = []
        for content, slot in zip(work.images, slots):
            if slot is not None:
                self._prepared[id(content)] = block.take_out(slot)
                prepared_ids.append(id(content))
        return prepared_ids

    async def answer(self, call_id: int, work: ZeroShotWork, arrival_ns: int, prepared_ids: list[int],
                     reply: Callable[..., None]) -> None:
        """Score ``work``, whose pixels ``take_pixels`` took out (``prepared_ids``), and reply."""
        try:
            scores = await self._scorer.score(work, arrival_ns)
            reply("ok", call_id, dataclasses.replace(scores, outcomes=tuple(map(portable, scores.outcomes))))
        except asyncio.CancelledError:
            reply("cancelled", call_id)
        except Exception as e:  # noqa: BLE001 - every failure goes back as an answer
            reply("error", call_id, None, error_fields(e, call_id))
        finally:  # kept to the end: a fusion head's pairs run the same images again
            for content_id in prepared_ids:
                self._prepared.pop(content_id, None)
