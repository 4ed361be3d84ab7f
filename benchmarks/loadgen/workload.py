"""The synthetic workload: Poisson arrivals, a modality mix, an image popularity law.

Three seeded random streams, derived from one ``--seed`` but independent of
each other (arrival gaps, request choices, texts), so changing the mix does not
shift the arrival times and a run is reproducible end to end.

Image popularity is uniform over the pool, or Zipf(s): P(key k) ∝ 1 / (k+1)^s
over the pool's N keys. s = 0 is uniform; s ≈ 1 is the classic web-cache law;
larger s concentrates traffic on a few images and makes the cache hit more.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

from benchmarks.loadgen.errors import ConfigError
from benchmarks.loadgen.request_spec import Arrival, Modality, RequestSpec

DEFAULT_MIX_TEXT = "text:0.2,vision:0.3,fusion:0.5"
_RANGE_PATTERN = re.compile(r"^\s*(\d+)\s*(?::\s*(\d+)\s*)?$")


@dataclass(frozen=True)
class Mix:
    """Normalised share of each modality; shares sum to 1."""

    shares: tuple[tuple[Modality, float], ...]

    def as_dict(self) -> dict[str, float]:
        return {modality.value: share for modality, share in self.shares}


@dataclass(frozen=True)
class TextLengthRange:
    """Generated texts are ``min_chars``..``max_chars`` long (inclusive, uniform)."""

    min_chars: int
    max_chars: int


def parse_mix(text: str) -> Mix:
    """Parse ``text:0.2,vision:0.3,fusion:0.5``; weights need not sum to 1, they are normalised."""
    weights: dict[Modality, float] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, weight_text = item.partition(":")
        if not sep:
            raise ConfigError(f"mix item {item.strip()!r} is not NAME:WEIGHT")
        try:
            modality = Modality(name.strip().lower())
        except ValueError as e:
            known = ", ".join(m.value for m in Modality)
            raise ConfigError(f"mix names unknown modality {name.strip()!r} (known: {known})") from e
        try:
            weight = float(weight_text)
        except ValueError as e:
            raise ConfigError(f"mix weight {weight_text.strip()!r} for {modality.value} is not a number") from e
        if not weight >= 0.0 or weight == float("inf"):
            raise ConfigError(f"mix weight for {modality.value} must be finite and >= 0, got {weight_text.strip()}")
        if modality in weights:
            raise ConfigError(f"mix names {modality.value} twice")
        weights[modality] = weight
    total = sum(weights.values())
    if total <= 0.0:
        raise ConfigError(f"mix {text!r} has no positive weight")
    return Mix(tuple((modality, weight / total) for modality, weight in weights.items() if weight > 0.0))


def parse_text_length_range(text: str) -> TextLengthRange:
    """Parse ``N`` or ``MIN:MAX`` (characters)."""
    match = _RANGE_PATTERN.match(text)
    if match is None:
        raise ConfigError(f"text length {text!r} is not N or MIN:MAX")
    min_chars = int(match.group(1))
    max_chars = int(match.group(2)) if match.group(2) is not None else min_chars
    if min_chars < 1 or max_chars < min_chars:
        raise ConfigError(f"text length {text!r} needs 1 <= MIN <= MAX")
    return TextLengthRange(min_chars, max_chars)


def zipf_cum_weights(num_keys: int, exponent: float) -> list[float]:
    """Cumulative (unnormalised) weights of Zipf(exponent) over keys 0..num_keys-1."""
    if num_keys < 1:
        raise ConfigError(f"the image pool needs at least one image, got {num_keys}")
    if not exponent >= 0.0:
        raise ConfigError(f"zipf exponent must be >= 0, got {exponent}")
    return list(itertools.accumulate(1.0 / (rank + 1) ** exponent for rank in range(num_keys)))


class SyntheticWorkload:
    """Draws ``RequestSpec``s: modality from the mix, image key uniform or Zipf, text length uniform."""

    def __init__(
        self,
        mix: Mix,
        num_images: int,
        zipf_exponent: float | None,
        text_length: TextLengthRange,
        seed: int,
    ) -> None:
        if num_images < 1 and any(modality.has_image for modality, _ in mix.shares):
            raise ConfigError("the mix sends images, so --images must be >= 1")
        self._rng = random.Random(f"{seed}:choices")
        self._modalities = [modality for modality, _ in mix.shares]
        self._modality_cum = list(itertools.accumulate(share for _, share in mix.shares))
        self._keys = list(range(max(num_images, 1)))
        self._key_cum = zipf_cum_weights(len(self._keys), zipf_exponent) if zipf_exponent is not None else None
        self._text_length = text_length

    @property
    def image_keys(self) -> list[int]:
        """Every key this workload can draw (render them all before the run)."""
        return list(self._keys)

    def next_spec(self) -> RequestSpec:
        modality = self._rng.choices(self._modalities, cum_weights=self._modality_cum)[0]
        image_key: int | None = None
        if modality.has_image:
            if self._key_cum is None:
                image_key = self._keys[self._rng.randrange(len(self._keys))]
            else:
                image_key = self._rng.choices(self._keys, cum_weights=self._key_cum)[0]
        num_text_chars = 0
        if modality.has_text:
            num_text_chars = self._rng.randint(self._text_length.min_chars, self._text_length.max_chars)
        return RequestSpec(modality=modality, image_key=image_key, num_text_chars=num_text_chars)


def poisson_offsets_s(rate_rps: float, duration_s: float, seed: int) -> Iterator[float]:
    """Arrival times of a Poisson process at ``rate_rps`` in [0, duration_s), lazily.

    Gaps are exponential with mean 1/rate: the open-loop arrival law of many
    independent users, which is what bursts a batcher the way production does.
    """
    if not rate_rps > 0.0:
        raise ConfigError(f"rate must be > 0 req/s, got {rate_rps}")
    rng = random.Random(f"{seed}:arrivals")
    offset_s = rng.expovariate(rate_rps)
    while offset_s < duration_s:
        yield offset_s
        offset_s += rng.expovariate(rate_rps)


def synthetic_arrivals(workload: SyntheticWorkload, rate_rps: float, duration_s: float, seed: int) -> Iterator[Arrival]:
    """Open-loop arrivals: Poisson times, each with a freshly drawn spec."""
    for offset_s in poisson_offsets_s(rate_rps, duration_s, seed):
        yield Arrival(offset_s, workload.next_spec())
