"""Start-up objects are frozen out of the cyclic collector's walks, and young collections wait for the threshold."""

from __future__ import annotations

import gc

import pytest
from starlette.testclient import TestClient

from server.app import create_app
from server.runtime.garbage_collection import collect_young_objects_after, freeze_start_up_objects
from server.settings import Settings


@pytest.fixture
def python_collector_settings():
    threshold = gc.get_threshold()
    yield
    gc.set_threshold(*threshold)
    gc.unfreeze()


def test_objects_alive_at_start_up_are_frozen_and_later_ones_are_not(python_collector_settings):
    start_up = [[i] for i in range(1000)]
    frozen = freeze_start_up_objects()
    assert frozen >= len(start_up)
    assert all(not any(obj is item for obj in gc.get_objects()) for item in start_up[:3])
    later = [[i] for i in range(10)]
    assert any(obj is later[0] for obj in gc.get_objects()), "objects made after the freeze must stay collectable"


def test_the_young_threshold_is_set_and_the_older_generations_keep_theirs(python_collector_settings):
    gc.set_threshold(700, 11, 12)
    collect_young_objects_after(5_000)
    assert gc.get_threshold() == (5_000, 11, 12)


def test_a_young_collection_waits_for_the_threshold(python_collector_settings):
    """Python's default runs one every 700 net allocations of containers; at 10,000 a few thousand run none."""
    young_collections = []

    def count(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 0:
            young_collections.append(1)

    gc.collect()
    gc.callbacks.append(count)
    try:
        for threshold, expect_any in ((700, True), (10_000, False)):
            collect_young_objects_after(threshold)
            gc.collect()
            young_collections.clear()
            held = [[i] for i in range(3_000)]  # as requests in flight hold their objects
            assert bool(young_collections) is expect_any, (threshold, len(young_collections))
            del held
    finally:
        gc.callbacks.remove(count)


def test_a_served_app_uses_the_configured_young_threshold(python_collector_settings):
    with TestClient(create_app(Settings(preset="synthetic", gc_young_threshold=4_321))):
        assert gc.get_threshold()[0] == 4_321
        assert gc.get_freeze_count() > 0
