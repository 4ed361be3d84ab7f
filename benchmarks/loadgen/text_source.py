"""Fresh, seeded request texts of an exact length.

Every text starts with a per-request serial number, so no two texts of a run
are equal (once they are long enough to hold it) and the server's text cache never turns a benchmark of the text
encoder into a benchmark of a dictionary lookup. The rest is words drawn from
a small built-in vocabulary with a seeded RNG, so a run is reproducible.
"""

from __future__ import annotations

import random

# fmt: off
_VOCABULARY: tuple[str, ...] = (
    "a", "photo", "of", "the", "red", "blue", "green", "small", "large", "dog", "cat",
    "bird", "car", "street", "river", "mountain", "city", "night", "morning", "people",
    "walking", "sitting", "near", "under", "above", "with", "and", "old", "new", "bright",
    "dark", "window", "table", "chair", "tree", "forest", "beach", "boat", "bridge",
    "sky", "cloud", "snow", "rain", "light", "shadow", "child", "woman", "man", "group",
    "playing", "holding", "looking", "at", "in", "on", "two", "three", "many", "one",
    "building", "road", "field", "flower", "garden", "kitchen", "room", "market", "train",
)
# fmt: on


class TextSource:
    """Makes texts; one instance per run (it counts requests to keep texts unique)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(f"{seed}:texts")
        self._serial = 0

    def make(self, num_chars: int) -> str:
        """A new text of exactly ``num_chars`` characters (``num_chars`` >= 1)."""
        if num_chars < 1:
            raise ValueError(f"num_chars must be >= 1, got {num_chars}")
        self._serial += 1
        parts = [f"#{self._serial}"]
        length = len(parts[0])
        while length < num_chars:
            word = self._rng.choice(_VOCABULARY)
            parts.append(word)
            length += 1 + len(word)
        text = " ".join(parts)[:num_chars]
        if text.endswith(" "):
            text = text[:-1] + "."
        return text
