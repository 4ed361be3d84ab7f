"""Test doubles for the cache tests: an event recorder and key factories."""

from __future__ import annotations

import threading
from collections import Counter

from cache import SegmentKey, encoded_image_key, token_ids_key


class EventLog:
    """Records ``on_event`` calls, thread-safely, as a multiset of (modality, event)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: list[tuple[str, str, int]] = []

    def __call__(self, modality: str, event: str, count: int) -> None:
        with self._lock:
            self.calls.append((modality, event, count))

    def totals(self) -> Counter[tuple[str, str]]:
        with self._lock:
            totals: Counter[tuple[str, str]] = Counter()
            for modality, event, count in self.calls:
                totals[(modality, event)] += count
            return totals


def image_key(name: str) -> SegmentKey:
    """A distinct image key per name (the name stands in for the uploaded bytes)."""
    return encoded_image_key("model-fp", "vit-pre-v1", name.encode())


def text_key(name: str) -> SegmentKey:
    """A distinct text key per name (one token id per character)."""
    return token_ids_key("model-fp", "tok-v1", [ord(ch) for ch in name])
