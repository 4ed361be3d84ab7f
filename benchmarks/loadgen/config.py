"""A validated description of one benchmark run.

The CLI builds a ``BenchConfig`` from flags; tests and scripts can build one
directly. Validation lives in ``__post_init__`` so that no run can start from
a configuration that contradicts itself.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.loadgen.embeddings_payload import EmbeddingsDialect
from benchmarks.loadgen.errors import ConfigError
from benchmarks.loadgen.image_pool import ImageFormat, ImageSize
from benchmarks.loadgen.workload import DEFAULT_MIX_TEXT, Mix, TextLengthRange, parse_mix

DEFAULT_MAX_LAG_P99_MS = 20.0
DEFAULT_TIMEOUT_S = 30.0


class RunMode(str, enum.Enum):
    """How requests are paced."""

    OPEN = "open"  # Poisson arrivals at a fixed rate
    CLOSED = "closed"  # C workers, back to back
    TRACE = "trace"  # a recorded schedule


@dataclass(frozen=True)
class BenchConfig:
    url: str
    mode: RunMode
    duration_s: float | None
    rate_rps: float | None = None
    concurrency: int | None = None
    mix: Mix = field(default_factory=lambda: parse_mix(DEFAULT_MIX_TEXT))
    num_images: int = 100
    zipf_exponent: float | None = None
    image_size: ImageSize = ImageSize(224, 224)
    image_format: ImageFormat = ImageFormat.JPEG
    text_length: TextLengthRange = TextLengthRange(32, 256)
    trace_path: Path | None = None
    speed: float = 1.0
    seed: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_lag_p99_ms: float = DEFAULT_MAX_LAG_P99_MS
    is_truncating: bool = False
    show_progress: bool = True
    embeddings: EmbeddingsDialect | None = None  # set: OpenAI /v1/embeddings bodies instead of /v1/infer
    api_key: str | None = field(default=None, repr=False)  # sent as a bearer token; never in the report

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"URL {self.url!r} must start with http:// or https://")
        if self.duration_s is not None and not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise ConfigError(f"--duration must be a positive number of seconds, got {self.duration_s}")
        is_rate_valid = self.rate_rps is not None and self.rate_rps > 0 and math.isfinite(self.rate_rps)
        if self.mode is RunMode.OPEN and not is_rate_valid:
            raise ConfigError(f"an open-loop run needs --rate > 0, got {self.rate_rps}")
        if self.mode is RunMode.CLOSED and (self.concurrency is None or self.concurrency < 1):
            raise ConfigError(f"a closed-loop run needs --concurrency >= 1, got {self.concurrency}")
        if self.mode in (RunMode.OPEN, RunMode.CLOSED) and self.duration_s is None:
            article = "an" if self.mode is RunMode.OPEN else "a"
            raise ConfigError(f"{article} {self.mode.value}-loop run needs --duration")
        if self.mode is RunMode.TRACE and self.trace_path is None:
            raise ConfigError("a trace replay needs --trace FILE")
        if not (self.speed > 0 and math.isfinite(self.speed)):
            raise ConfigError(f"--speed must be > 0, got {self.speed}")
        if self.num_images < 1:
            raise ConfigError(f"--images must be >= 1, got {self.num_images}")
        if self.zipf_exponent is not None and not (self.zipf_exponent >= 0 and math.isfinite(self.zipf_exponent)):
            raise ConfigError(f"--zipf must be >= 0, got {self.zipf_exponent}")
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise ConfigError(f"--timeout-s must be > 0, got {self.timeout_s}")
        if not self.max_lag_p99_ms > 0:
            raise ConfigError(f"--max-lag-ms must be > 0, got {self.max_lag_p99_ms}")
        if self.embeddings is not None and any(m.has_image and m.has_text for m, _ in self.mix.shares):
            raise ConfigError("OpenAI embeddings bodies hold a text or an image: the mix cannot send fusion")

    def to_json(self) -> dict[str, Any]:
        """The settings as they go into the report, so a report says how it was made."""
        return {
            "url": self.url,
            "mode": self.mode.value,
            "duration_s": self.duration_s,
            "rate_rps": self.rate_rps,
            "concurrency": self.concurrency,
            "mix": self.mix.as_dict(),
            "images": self.num_images,
            "zipf": self.zipf_exponent,
            "image_size": str(self.image_size),
            "image_format": self.image_format.value,
            "text_chars": [self.text_length.min_chars, self.text_length.max_chars],
            "trace": None if self.trace_path is None else str(self.trace_path),
            "speed": self.speed,
            "seed": self.seed,
            "timeout_s": self.timeout_s,
            "max_lag_p99_ms": self.max_lag_p99_ms,
            "truncate": self.is_truncating,
            "api_key_sent": self.api_key is not None,
            "embeddings": None if self.embeddings is None else {
                "model": self.embeddings.model, "image_modality_marked": self.embeddings.is_image_modality_marked},
        }
