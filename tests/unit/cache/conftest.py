"""Fixtures for the cache tests."""

from __future__ import annotations

import pytest

from segment_fixtures import EventLog


@pytest.fixture
def event_log() -> EventLog:
    return EventLog()
