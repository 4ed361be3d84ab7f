"""Dispatch over several engines: the key's owner, unless it is much busier; the least-loaded without a key."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import pytest

from server.workers.engine_dispatch import EngineDispatch, NoEngineServing, owner


@dataclass
class FakeEngine:
    """An engine as dispatch reads it: serving or not, its reported waits per lane, this process's calls."""

    index: int
    is_serving: bool = True
    waits: dict[str, float] = field(default_factory=dict)
    num_in_flight: int = 0

    def wait_s(self, lane: str) -> float:
        return self.waits.get(lane, 0.0)


def _keys(count: int) -> list[bytes]:
    return [hashlib.sha256(str(number).encode()).digest() for number in range(count)]


def test_a_key_always_goes_to_the_same_engine_and_the_keys_spread_evenly():
    engines = [FakeEngine(index) for index in range(4)]
    dispatch = EngineDispatch(engines, bound_s=0.05)
    keys = _keys(4000)
    first = [dispatch.choose(key, "vision").index for key in keys]
    assert first == [dispatch.choose(key, "vision").index for key in keys]
    shares = [first.count(index) / len(keys) for index in range(4)]
    assert all(0.2 < share < 0.3 for share in shares), shares


def test_adding_an_engine_moves_about_one_key_in_n_and_only_to_the_new_engine():
    keys = _keys(4000)
    before = [owner(key, [0, 1, 2]) for key in keys]
    after = [owner(key, [0, 1, 2, 3]) for key in keys]
    moved = [(old, new) for old, new in zip(before, after) if old != new]
    assert all(new == 3 for _, new in moved), "a key moves only to the engine that was added"
    assert 0.2 < len(moved) / len(keys) < 0.3, len(moved) / len(keys)


def test_an_engine_that_stops_serving_gives_up_only_its_own_keys():
    engines = [FakeEngine(index) for index in range(3)]
    dispatch = EngineDispatch(engines, bound_s=0.05)
    keys = _keys(2000)
    before = [dispatch.choose(key, "text").index for key in keys]
    engines[1].is_serving = False
    after = [dispatch.choose(key, "text").index for key in keys]
    assert all(new == old for old, new in zip(before, after) if old != 1)
    assert 1 not in after


def test_the_owner_keeps_its_key_within_the_bound_and_loses_it_beyond():
    engines = [FakeEngine(0), FakeEngine(1)]
    dispatch = EngineDispatch(engines, bound_s=0.05)
    key = next(key for key in _keys(100) if owner(key, [0, 1]) == 1)
    engines[1].waits = {"vision": 0.04}
    assert dispatch.choose(key, "vision").index == 1, "40 ms busier is within the 50 ms bound"
    assert dispatch.choose(key, "text").index == 1
    engines[1].waits = {"vision": 0.2}
    assert dispatch.choose(key, "vision").index == 0, "200 ms busier: the least-loaded takes it"
    assert dispatch.choose(key, "text").index == 1, "the wait that counts is the request's lane's"


def test_work_without_a_key_goes_to_the_least_loaded_and_a_burst_between_polls_is_spread():
    engines = [FakeEngine(0, waits={"vision": 0.3}), FakeEngine(1), FakeEngine(2)]
    dispatch = EngineDispatch(engines, bound_s=0.05)
    chosen = []
    for _ in range(6):  # the reported waits stay as polled; this process's calls in flight break the tie
        engine = dispatch.choose(None, "vision")
        engine.num_in_flight += 1
        chosen.append(engine.index)
    assert sorted(chosen) == [1, 1, 1, 2, 2, 2]


def test_round_robin_takes_the_serving_engines_in_turn_whatever_the_key():
    engines = [FakeEngine(0), FakeEngine(1, is_serving=False), FakeEngine(2)]
    dispatch = EngineDispatch(engines, bound_s=0.05, mode="round_robin")
    key = _keys(1)[0]
    assert [dispatch.choose(key, "vision").index for _ in range(4)] == [0, 2, 0, 2]


def test_no_engine_serving_is_said_so():
    dispatch = EngineDispatch([FakeEngine(0, is_serving=False)], bound_s=0.05)
    with pytest.raises(NoEngineServing):
        dispatch.choose(None, "text")
