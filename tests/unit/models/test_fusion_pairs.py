"""The pairs file of ``mmserve train-fusion``: every bad line named, the split by image, sampled mismatches."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest
from PIL import Image

from encoded_images import encode

from models.errors import TrainingDataError
from models.training.pairs import read_pairs, sample_mismatches, split_by_image


def _write(tmp_path: Path, records: list[object], num_images: int = 6) -> Path:
    for i in range(num_images):
        (tmp_path / f"{i}.png").write_bytes(encode(Image.new("RGB", (4, 4), (i * 40, 0, 0)), "PNG"))
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _good(num: int = 12, num_images: int = 6) -> list[dict]:
    return [{"image": f"{i % num_images}.png", "text": f"caption {i % num_images}"} for i in range(num)]


def test_a_good_file_reads_with_paths_relative_to_it_and_a_digest_of_its_bytes(tmp_path: Path):
    path = _write(tmp_path, [*_good(11), "", {"image": "0.png", "text": "caption 3", "label": 0}])
    pairs = read_pairs(path)
    assert len(pairs.pairs) == 12 and pairs.num_images == 6 and pairs.has_mismatches
    assert pairs.pairs[0].image == (tmp_path / "0.png").resolve() and pairs.pairs[0].is_match
    assert (pairs.pairs[-1].is_match, pairs.pairs[-1].line_number) == (False, 13)  # the blank line 12 is skipped
    assert pairs.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(("bad_line", "message"), [
    ("{not json", "pairs.jsonl:3: not valid JSON"),
    ('["0.png", "a cat"]', "pairs.jsonl:3: expected a JSON object"),
    ({"image": "0.png", "text": "a", "label": 2}, 'pairs.jsonl:3: "label" must be 0 or 1, got 2'),
    ({"image": "0.png", "text": "a", "label": True}, 'pairs.jsonl:3: "label" must be 0 or 1, got true'),
    ({"image": "0.png", "text": "  "}, 'pairs.jsonl:3: "text" must be a non-empty string'),
    ({"image": "missing.png", "text": "a"}, "pairs.jsonl:3: image file"),
    ({"image": "0.png", "caption": "a"}, "pairs.jsonl:3: unknown key(s) 'caption'"),
])
def test_a_bad_line_is_named_by_its_number(tmp_path: Path, bad_line, message):
    good = _good()
    path = _write(tmp_path, [*good[:2], bad_line, *good[2:]])
    with pytest.raises(TrainingDataError) as caught:
        read_pairs(path)
    assert message in str(caught.value)


@pytest.mark.parametrize(("num_pairs", "num_images"), [(9, 5), (12, 4)])
def test_too_few_pairs_or_images_are_refused_with_the_counts(tmp_path: Path, num_pairs, num_images):
    path = _write(tmp_path, _good(num_pairs, num_images), num_images)
    with pytest.raises(TrainingDataError, match=f"{num_pairs} pairs of {num_images} images"):
        read_pairs(path)


def test_the_split_keeps_every_image_on_one_side_and_is_seeded(tmp_path: Path):
    pairs = read_pairs(_write(tmp_path, _good(30, 10), 10)).pairs
    split = split_by_image(pairs, 0.2, seed=3)
    assert {p.image for p in split.train}.isdisjoint({p.image for p in split.held_out})
    assert len({p.image for p in split.held_out}) == 2 and len(split.train) + len(split.held_out) == 30
    assert split == split_by_image(pairs, 0.2, seed=3) and split != split_by_image(pairs, 0.2, seed=4)


def test_a_sampled_mismatch_never_pairs_an_image_with_a_text_of_its_own(tmp_path: Path):
    records = [*_good(12), {"image": "0.png", "text": "caption 1"}]  # image 0 is described by two captions
    pairs = read_pairs(_write(tmp_path, records)).pairs
    texts = sorted({p.text for p in pairs})
    own = {}
    for pair in pairs:
        own.setdefault(pair.image, set()).add(pair.text)
    rng = random.Random(0)
    for _ in range(50):
        mismatches = sample_mismatches(pairs, texts, rng)
        assert len(mismatches) == len(pairs) and not any(m.is_match for m in mismatches)
        assert all(m.text not in own[m.image] for m in mismatches)


def test_no_mismatch_can_be_sampled_when_every_text_describes_the_image(tmp_path: Path):
    records = [{"image": f"{i % 6}.png", "text": "the same caption"} for i in range(12)]
    pairs = read_pairs(_write(tmp_path, records)).pairs
    with pytest.raises(TrainingDataError, match="line 1: every text in the file describes"):
        sample_mismatches(pairs, ["the same caption"], random.Random(0))


@pytest.mark.parametrize(("a", "b", "jaccard"), [
    ("a red circle", "a red square", 2 / 4),
    ("a red circle", "A  RED circle!", 1.0),
    ("a red circle", "two dogs", 0.0),
    ("a blue car parked on the street", "a blue car", 3 / 7),
])
def test_token_jaccard_compares_lower_cased_words(a, b, jaccard):
    from models.training.pairs import NEAR_DUPLICATE_JACCARD, is_near_duplicate, token_jaccard

    assert token_jaccard(a, b) == pytest.approx(jaccard)
    assert is_near_duplicate(a, [b]) is (jaccard >= NEAR_DUPLICATE_JACCARD)


def test_a_caption_shared_by_many_images_never_comes_back_as_their_mismatch(tmp_path: Path):
    # "a red circle" describes images 0-3 (once with other case and spacing); two other captions exist
    records = [{"image": f"{i}.png", "text": "a red circle" if i != 2 else "A red  circle"} for i in range(4)]
    records += [{"image": "4.png", "text": "a red square"}, {"image": "5.png", "text": "a blue circle"}]
    pairs = read_pairs(_write(tmp_path, records * 2)).pairs
    texts = sorted({p.text for p in pairs})
    from models.training.pairs import captions_by_image, count_near_duplicates

    rng = random.Random(0)
    for _ in range(50):
        circles = [m for m in sample_mismatches(pairs, texts, rng) if m.image.name in ("0.png", "1.png", "2.png", "3.png")]
        assert len(circles) == 8 and all(m.text in ("a red square", "a blue circle") for m in circles), circles
        # every mismatch of images 0-3 shares "a red" or "a circle" with the caption: all near-duplicates
        assert count_near_duplicates(circles, captions_by_image(pairs)) == 8
