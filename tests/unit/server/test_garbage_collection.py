"""Start-up objects are frozen out of the cyclic collector's walks."""

from __future__ import annotations

import gc

from server.runtime.garbage_collection import freeze_start_up_objects


def test_objects_alive_at_start_up_are_frozen_and_later_ones_are_not():
    start_up = [[i] for i in range(1000)]
    try:
        frozen = freeze_start_up_objects()
        assert frozen >= len(start_up)
        assert all(not any(obj is item for obj in gc.get_objects()) for item in start_up[:3])
        later = [[i] for i in range(10)]
        assert any(obj is later[0] for obj in gc.get_objects()), "objects made after the freeze must stay collectable"
    finally:
        gc.unfreeze()
