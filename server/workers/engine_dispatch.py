"""Which engine takes a request: the one that owns its first cacheable segment, unless it is much busier.

    a request with a cacheable segment   its key's owner among the serving engines, by rendezvous
                                          hashing (highest blake2b(key, engine) wins): the same key always
                                          goes to the same engine, and adding an engine moves only the
                                          keys it now wins, about 1/N of them
       ... unless                         the owner's estimated wait for the request's lane exceeds the
                                          least-loaded engine's by more than ``bound_s``
                                          (``engine_wait_bound_ms``): then the least-loaded takes it
    uncacheable work (use_cache false,    the least-loaded engine
    caches off)
    least-loaded                         the smallest wait the engines report for the lane (their
                                          schedulers' time to drain what is queued, polled every 0.2 s,
                                          ``server.workers.engine_connection``), ties broken by this
                                          process's calls in flight to each, so a burst between two polls
                                          is spread rather than sent to one, then by turns
    round_robin (a benchmark's setting)  in turn over the serving engines, to measure what affinity saves

So the segment cache is not split: a repeated image lands where it was
computed, and each engine's cache holds its own share of the working set,
not a copy of another's. Nothing is copied between engines.

Which segment is the key: the first image's exact key for vision and fusion
requests, the text's for text-only ones, the label set's for classify and
rank (``server.workers.engine_client``, ``server.workers.zero_shot_client``).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from typing import Protocol


class EngineLoad(Protocol):
    """What dispatch reads of an engine (``server.workers.engine_connection.EngineConnection``)."""

    index: int
    num_in_flight: int

    @property
    def is_serving(self) -> bool: ...

    def wait_s(self, lane: str) -> float: ...


class NoEngineServing(Exception):
    """No engine serves now (each one is starting again)."""


def owner(key: bytes, engines: Sequence[int]) -> int:
    """The engine among ``engines`` (their numbers) that wins ``key`` by rendezvous hashing."""
    return max(engines, key=lambda engine: hashlib.blake2b(key, digest_size=8,
                                                           salt=engine.to_bytes(8, "little")).digest())


class EngineDispatch:
    def __init__(self, engines: Sequence[EngineLoad], bound_s: float, mode: str = "affinity") -> None:
        self._engines = list(engines)
        self._bound_s = bound_s
        self._mode = mode
        self._turns = itertools.count()

    def choose(self, key: bytes | None, lane: str) -> EngineLoad:
        """The engine for a request of ``lane`` whose first cacheable segment is ``key`` (``None``: none)."""
        serving = [engine for engine in self._engines if engine.is_serving]
        if not serving:
            raise NoEngineServing()
        if len(serving) == 1:
            return serving[0]
        if self._mode == "round_robin":
            return serving[next(self._turns) % len(serving)]
        turn = next(self._turns)  # among engines equally loaded, each in turn (not always the first)
        least = min(serving, key=lambda engine: (engine.wait_s(lane), engine.num_in_flight,
                                                 (engine.index - turn) % len(self._engines)))
        if key is None:
            return least
        index = owner(key, [engine.index for engine in serving])
        preferred = next(engine for engine in serving if engine.index == index)
        if preferred.wait_s(lane) - least.wait_s(lane) > self._bound_s:
            return least
        return preferred
