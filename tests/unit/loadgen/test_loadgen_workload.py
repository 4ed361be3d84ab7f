"""The synthetic workload: mix, image popularity, Poisson arrivals, texts, images, bodies."""

from __future__ import annotations

import base64
import io
import itertools
import json
import math
import statistics
from collections import Counter

import pytest
from PIL import Image

from benchmarks.loadgen.errors import ConfigError
from benchmarks.loadgen.image_pool import ImageFormat, ImagePool, ImageSize, parse_image_size
from benchmarks.loadgen.payload import BodyBuilder
from benchmarks.loadgen.request_spec import Modality, Priority, RequestSpec
from benchmarks.loadgen.text_source import TextSource
from benchmarks.loadgen.workload import (
    SyntheticWorkload,
    TextLengthRange,
    parse_mix,
    parse_text_length_range,
    poisson_offsets_s,
    synthetic_arrivals,
    zipf_cum_weights,
)


def test_mix_weights_are_normalised() -> None:
    mix = parse_mix("text:2, vision:1,fusion:1")
    assert mix.as_dict() == {"text": 0.5, "vision": 0.25, "fusion": 0.25}
    assert parse_mix("vision:3,text:0").as_dict() == {"vision": 1.0}


@pytest.mark.parametrize(
    ("text", "problem"),
    [("audio:1", "unknown modality"), ("text", "NAME:WEIGHT"), ("text:x", "not a number"),
     ("text:-1", ">= 0"), ("text:0", "no positive weight"), ("text:1,text:2", "twice")],
)  # fmt: skip
def test_bad_mixes_are_refused(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_mix(text)


def test_sizes_and_lengths_parse() -> None:
    assert parse_image_size("640x480") == ImageSize(640, 480)
    assert parse_text_length_range("16:64") == TextLengthRange(16, 64)
    assert parse_text_length_range("40") == TextLengthRange(40, 40)
    for bad in ("640", "0x10", "axb"):
        with pytest.raises(ConfigError):
            parse_image_size(bad)
    with pytest.raises(ConfigError):
        parse_text_length_range("9:3")


def _draw(workload: SyntheticWorkload, count: int) -> list[RequestSpec]:
    return [workload.next_spec() for _ in range(count)]


def test_the_mix_is_followed_and_each_modality_carries_its_parts() -> None:
    mix = parse_mix("text:0.2,vision:0.3,fusion:0.5")
    specs = _draw(SyntheticWorkload(mix, 10, None, TextLengthRange(5, 9), seed=1), 20_000)
    counts = Counter(spec.modality for spec in specs)
    for modality, share in mix.shares:
        sigma = math.sqrt(share * (1 - share) / len(specs))
        assert counts[modality] / len(specs) == pytest.approx(share, abs=5 * sigma)
    for spec in specs:
        assert (spec.image_key is not None) == spec.modality.has_image
        assert (5 <= spec.num_text_chars <= 9) if spec.modality.has_text else spec.num_text_chars == 0


def test_zipf_popularity_follows_its_law_and_uniform_is_flat() -> None:
    num_images, exponent, draws = 20, 1.2, 40_000
    vision_only = parse_mix("vision:1")
    zipf_workload = SyntheticWorkload(vision_only, num_images, exponent, TextLengthRange(1, 1), seed=2)
    zipf = Counter(spec.image_key for spec in _draw(zipf_workload, draws))
    cum = zipf_cum_weights(num_images, exponent)
    for key in (0, 1, 5, 19):
        p = (cum[key] - (cum[key - 1] if key else 0.0)) / cum[-1]
        assert zipf[key] / draws == pytest.approx(p, abs=5 * math.sqrt(p * (1 - p) / draws))
    assert zipf[0] > 5 * zipf[19]

    uniform_workload = SyntheticWorkload(vision_only, num_images, None, TextLengthRange(1, 1), seed=2)
    uniform = Counter(spec.image_key for spec in _draw(uniform_workload, draws))
    assert set(uniform) == set(range(num_images))
    p = 1 / num_images
    for key in range(num_images):
        assert uniform[key] / draws == pytest.approx(p, abs=5 * math.sqrt(p * (1 - p) / draws))


def test_poisson_arrivals_have_the_rate_and_exponential_gaps() -> None:
    rate_rps, duration_s = 500.0, 20.0
    offsets = list(poisson_offsets_s(rate_rps, duration_s, seed=3))
    expected = rate_rps * duration_s
    assert len(offsets) == pytest.approx(expected, abs=5 * math.sqrt(expected))
    assert offsets == sorted(offsets) and offsets[0] >= 0 and offsets[-1] < duration_s
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    # Exponential: mean = standard deviation = 1 / rate.
    assert statistics.fmean(gaps) == pytest.approx(1 / rate_rps, rel=0.05)
    assert statistics.pstdev(gaps) == pytest.approx(1 / rate_rps, rel=0.05)


def test_runs_are_reproducible_from_the_seed() -> None:
    def arrivals(seed: int) -> list[tuple[float, RequestSpec]]:
        workload = SyntheticWorkload(parse_mix("text:1,fusion:1"), 8, 1.0, TextLengthRange(3, 30), seed)
        return [(a.intended_offset_s, a.spec) for a in synthetic_arrivals(workload, 50.0, 2.0, seed)]

    assert arrivals(4) == arrivals(4)
    assert arrivals(4) != arrivals(5)


def test_texts_have_the_exact_length_are_fresh_and_seeded() -> None:
    lengths = [1, 2, 5, 17, 64, 300] * 20
    made = _texts(9, lengths)
    assert [len(text) for text in made] == lengths
    long_texts = [text for text in made if len(text) >= 5]  # long enough to hold the serial number
    assert len(set(long_texts)) == len(long_texts)
    assert made == _texts(9, lengths) and made != _texts(10, lengths)


def _texts(seed: int, lengths: list[int]) -> list[str]:
    source = TextSource(seed)
    return [source.make(n) for n in lengths]


def test_images_are_distinct_per_key_identical_per_key_and_of_the_asked_size() -> None:
    size = ImageSize(48, 32)
    for image_format in ImageFormat:
        pool = ImagePool(seed=1, size=size, image_format=image_format)
        pool.prepare(range(5))
        encoded = [base64.b64decode(pool.b64(key)) for key in range(5)]
        assert len(set(encoded)) == 5
        again = ImagePool(seed=1, size=size, image_format=image_format)
        assert base64.b64decode(again.b64(3)) == encoded[3]
        other_seed = ImagePool(seed=2, size=size, image_format=image_format)
        assert base64.b64decode(other_seed.b64(3)) != encoded[3]
        with Image.open(io.BytesIO(encoded[0])) as image:
            assert image.format == {"png": "PNG", "jpeg": "JPEG"}[image_format.value]
            assert image.size == (48, 32) and image.mode == "RGB"


def test_bodies_are_valid_json_with_the_parts_of_their_modality() -> None:
    pool = ImagePool(seed=0, size=ImageSize(16, 16), image_format=ImageFormat.PNG)
    builder = BodyBuilder(pool, TextSource(0))
    specs = [
        RequestSpec(Modality.TEXT, num_text_chars=12),
        RequestSpec(Modality.VISION, image_key=4),
        RequestSpec(Modality.FUSION, image_key=4, num_text_chars=30, priority=Priority.HIGH, timeout_ms=250),
    ]
    bodies = [json.loads(builder.build(spec)) for spec in specs]
    assert set(bodies[0]) == {"text"} and len(bodies[0]["text"]) == 12
    assert set(bodies[1]) == {"image"} and bodies[1]["image"]["b64"] == pool.b64(4).decode()
    assert bodies[2]["image"] == bodies[1]["image"] and len(bodies[2]["text"]) == 30
    assert (bodies[2]["priority"], bodies[2]["timeout_ms"]) == ("high", 250)
    assert all("truncate" not in body for body in bodies)


def test_truncating_bodies_ask_for_it_only_when_they_carry_text() -> None:
    pool = ImagePool(seed=0, size=ImageSize(16, 16), image_format=ImageFormat.PNG)
    builder = BodyBuilder(pool, TextSource(0), is_truncating=True)
    text_only = json.loads(builder.build(RequestSpec(Modality.TEXT, num_text_chars=900)))
    fusion = json.loads(builder.build(RequestSpec(Modality.FUSION, image_key=1, num_text_chars=900)))
    vision = json.loads(builder.build(RequestSpec(Modality.VISION, image_key=1)))
    assert text_only["truncate"] is True and fusion["truncate"] is True and "truncate" not in vision
