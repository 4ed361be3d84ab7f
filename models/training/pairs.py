"""The image–text pairs ``mmserve train-fusion`` learns from: read, checked, split, mismatches sampled.

    pairs.jsonl     one JSON object a line; blank lines are skipped
      {"image": "shapes/0001.png", "text": "a red circle"}                  a matching pair
      {"image": "shapes/0001.png", "text": "a blue square", "label": 0}     a mismatched pair

    image   an image file, relative to the JSONL file's directory (or absolute)
    text    the text, non-empty
    label   optional: 1 (the text describes the image; the default) or 0 (it does not)

A file with no ``label: 0`` line gets its mismatched pairs sampled: each
matching pair's image with another image's text that is not one of its own
captions (``sample_mismatches``, one per matching pair, drawn afresh each
epoch for training and once for the validation and held-out sets). Captions
repeat across images ("a red circle" for many), so "its own" compares texts
as written up to case and spacing, never by line. A sampled text may still
say almost the same as the true caption ("a red square" for "a red
circle"): ``is_near_duplicate`` (token Jaccard >= 0.5, lower-cased words)
counts those for the model card, since they teach the finest distinctions
and are the first to be wrong in a caption set with near-synonyms. A file
with labelled mismatches is used as written.

Pairs are split by image, so every held-out image is one the head never saw
in training (``split_by_image``); texts may repeat across the split, as
captions do. Every problem names its line: ``pairs.jsonl:12: label must be
0 or 1, got 2``.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from models.errors import TrainingDataError

MIN_PAIRS = 10
MIN_IMAGES = 5  # a fifth is held out: at least one image on each side of the split
_KEYS = frozenset({"image", "text", "label"})
_SAMPLING_TRIES = 64  # random draws before listing the candidates outright
NEAR_DUPLICATE_JACCARD = 0.5  # "a red circle" / "a red square": {a, red} of {a, red, circle, square}


@dataclass(frozen=True)
class ImageTextPair:
    image: Path  # resolved against the JSONL file's directory
    text: str
    is_match: bool
    line_number: int  # where it came from; a sampled mismatch names its matching pair's line


@dataclass(frozen=True)
class PairsFile:
    path: Path
    sha256: str  # of the file's bytes: the model card says exactly what the head was trained on
    pairs: tuple[ImageTextPair, ...]

    @property
    def has_mismatches(self) -> bool:
        return any(not pair.is_match for pair in self.pairs)

    @property
    def num_images(self) -> int:
        return len({pair.image for pair in self.pairs})


@dataclass(frozen=True)
class PairSplit:
    train: tuple[ImageTextPair, ...]
    held_out: tuple[ImageTextPair, ...]


def _parse_line(path: Path, line_number: int, line: str) -> ImageTextPair:
    where = f"{path}:{line_number}"
    try:
        record = json.loads(line)
    except ValueError as e:
        raise TrainingDataError(f"{where}: not valid JSON: {e}") from e
    if not isinstance(record, dict):
        raise TrainingDataError(f"{where}: expected a JSON object like "
                                f'{{"image": "a.png", "text": "a red circle"}}, got {type(record).__name__}')
    unknown = sorted(set(record) - _KEYS)
    if unknown:
        raise TrainingDataError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
                                f"a line has {', '.join(sorted(_KEYS))}")
    image, text, label = record.get("image"), record.get("text"), record.get("label", 1)
    if not isinstance(image, str) or not image:
        raise TrainingDataError(f"{where}: \"image\" must be a non-empty path, got {image!r}")
    if not isinstance(text, str) or not text.strip():
        raise TrainingDataError(f"{where}: \"text\" must be a non-empty string, got {text!r}")
    if isinstance(label, bool) or label not in (0, 1):  # JSON true is not a label: say 1
        raise TrainingDataError(f"{where}: \"label\" must be 0 or 1, got {json.dumps(label)}")
    image_path = (path.parent / image).resolve()
    if not image_path.is_file():
        raise TrainingDataError(f"{where}: image file {image_path} does not exist")
    return ImageTextPair(image=image_path, text=text, is_match=label == 1, line_number=line_number)


def read_pairs(path: Path) -> PairsFile:
    """Every pair of ``path``, checked line by line; ``TrainingDataError`` names the first bad line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TrainingDataError(f"cannot read the pairs file {path}: {e}") from e
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise TrainingDataError(f"{path} is not UTF-8 text: {e}") from e
    pairs = tuple(_parse_line(path, number, line) for number, line in enumerate(lines, start=1) if line.strip())
    num_images = len({pair.image for pair in pairs})
    if len(pairs) < MIN_PAIRS or num_images < MIN_IMAGES:
        raise TrainingDataError(f"{path}: too few pairs to train and hold some out: {len(pairs)} pairs of "
                                f"{num_images} images; train-fusion needs at least {MIN_PAIRS} pairs of at "
                                f"least {MIN_IMAGES} images")
    if not any(pair.is_match for pair in pairs):
        raise TrainingDataError(f"{path}: every line has label 0; the head needs matching pairs to learn from")
    return PairsFile(path=path, sha256=hashlib.sha256(data).hexdigest(), pairs=pairs)


def num_held_out_images(num_images: int, held_out_fraction: float) -> int:
    """How many of ``num_images`` images ``split_by_image`` holds out: the fraction rounded up, at least one,
    never all."""
    return min(max(1, math.ceil(held_out_fraction * num_images)), num_images - 1)


def split_by_image(pairs: Sequence[ImageTextPair], held_out_fraction: float, seed: int | str) -> PairSplit:
    """Hold out ``held_out_fraction`` of the images (at least one, never all) with all their pairs."""
    if not 0.0 < held_out_fraction < 1.0:
        raise ValueError(f"held_out_fraction must be in (0, 1), got {held_out_fraction}")
    images = sorted({pair.image for pair in pairs})
    random.Random(seed).shuffle(images)
    held_out_images = set(images[:num_held_out_images(len(images), held_out_fraction)])
    return PairSplit(train=tuple(p for p in pairs if p.image not in held_out_images),
                     held_out=tuple(p for p in pairs if p.image in held_out_images))


def same_text(text: str) -> str:
    """The form two texts are compared in: lower case, runs of spaces as one ("A red  circle" is "a red circle")."""
    return " ".join(text.casefold().split())


def _words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"\w+", text.casefold()))


def token_jaccard(a: str, b: str) -> float:
    """|words(a) & words(b)| / |words(a) | words(b)|, words lower-cased; 1.0 for two texts without words."""
    words_a, words_b = _words(a), _words(b)
    union = words_a | words_b
    return len(words_a & words_b) / len(union) if union else 1.0


def is_near_duplicate(text: str, captions: Sequence[str] | set[str]) -> bool:
    """Whether ``text`` shares at least ``NEAR_DUPLICATE_JACCARD`` of its words with one of ``captions``."""
    return any(token_jaccard(text, caption) >= NEAR_DUPLICATE_JACCARD for caption in captions)


def captions_by_image(pairs: Sequence[ImageTextPair]) -> dict[Path, set[str]]:
    """Each image's matching texts, as written."""
    described: dict[Path, set[str]] = {}
    for pair in pairs:
        if pair.is_match:
            described.setdefault(pair.image, set()).add(pair.text)
    return described


def count_near_duplicates(mismatches: Sequence[ImageTextPair], described: dict[Path, set[str]]) -> int:
    """How many of ``mismatches`` are near-duplicates (``is_near_duplicate``) of a caption of their image."""
    return sum(is_near_duplicate(m.text, described.get(m.image, ())) for m in mismatches)


def sample_mismatches(pairs: Sequence[ImageTextPair], texts: Sequence[str],
                      rng: random.Random) -> tuple[ImageTextPair, ...]:
    """One mismatched pair per matching pair of ``pairs``: its image with a text from ``texts`` that is none of
    that image's captions (compared by ``same_text``, so a caption shared with other images never comes back)."""
    own_of = {image: {same_text(t) for t in texts_} for image, texts_ in captions_by_image(pairs).items()}
    pool = sorted(set(texts))
    mismatches = []
    for pair in pairs:
        if not pair.is_match:
            continue
        own = own_of[pair.image]
        text = next((t for t in (rng.choice(pool) for _ in range(_SAMPLING_TRIES)) if same_text(t) not in own), None)
        if text is None:  # almost every text describes this image: choose among the few that do not
            others = [t for t in pool if same_text(t) not in own]
            if not others:
                raise TrainingDataError(f"line {pair.line_number}: every text in the file describes {pair.image}, "
                                        "so no mismatched pair can be sampled; add lines with \"label\": 0")
            text = rng.choice(others)
        mismatches.append(ImageTextPair(image=pair.image, text=text, is_match=False, line_number=pair.line_number))
    return tuple(mismatches)
