"""Two servers' answers compared as a client would: the same structure, numbers equal to float32 rounding.

Shared by the tests that hold ``--api-workers N`` against one process.
"""

from __future__ import annotations

import pytest


def assert_same(ours: object, theirs: object) -> None:
    """Equal answers: the same structure, numbers equal to float32 rounding."""
    if isinstance(ours, dict):
        assert ours.keys() == theirs.keys()
        for key in ours:
            assert_same(ours[key], theirs[key])
    elif isinstance(ours, list):
        assert len(ours) == len(theirs)
        for mine, reference in zip(ours, theirs):
            assert_same(mine, reference)
    elif isinstance(ours, float):
        assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-6)
    else:
        assert ours == theirs
