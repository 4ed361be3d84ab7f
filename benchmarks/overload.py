"""Overload: three times saturation for 30 s, open loop, against ``mmserve serve`` in its own process.

    python -m benchmarks.overload [--preset tiny] [--factor 3] [--overload-s 30] [--deadline-ms 1000]

Phases: capacity (closed loop, 32 outstanding), baseline (0.5 x saturation),
overload (factor x saturation, RSS read every second, a side probe of image
and text requests), recovery (0.5 x again). Every request carries
``timeout_ms = --deadline-ms``; the caches are off. Verdicts: admitted p99
within the deadline; refusals 503 or 504 only; 503s carry Retry-After; RSS
within 10 % of its warmed-up level; recovery p99 <= 1.5 x baseline + 20 ms.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from benchmarks.harness import (
    Figure, add_save_figures_argument, capacity_rps, lag_p99_ms, latency_ms, mmserve_command, ruled, run_samples, running,
    save_figures,
)
from benchmarks.harness.periodic_thread import PeriodicThread
from benchmarks.harness.process_resources import ProcessTreeSampler, rss_bytes
from benchmarks.loadgen.config import BenchConfig, RunMode
from benchmarks.loadgen.image_pool import ImageSize
from benchmarks.loadgen.runner import Sample
from benchmarks.loadgen.workload import poisson_offsets_s
from benchmarks.photo_like import noise_image

# Large images make decoding the costly part, which keeps saturation at a rate one
# Python load generator can offer three times over on the same small machine.
IMAGE_PX = 1024
MIX = "vision:0.5,fusion:0.5"
NUM_IMAGES = 100
DECODE_THREADS = 2
MAX_DECODE_QUEUE = 16
RSS_TOLERANCE = 0.10
RECOVERY_SLACK = 1.5
RECOVERY_SLACK_MS = 20.0


class RefusalProbe(PeriodicThread):
    """Every ``interval_s``, on its own thread, an image request and a text request.

    The image requests go where the overload is (the image lanes): their
    refusals must be 503 with ``Retry-After``. The text requests go to the
    text lane, which has its own executor: they show whether text is still
    served while the image lanes shed. Records ``(kind, status, has Retry-After)``.
    """

    def __init__(self, url: str, image_px: int, interval_s: float = 0.25) -> None:
        super().__init__(interval_s, "refusal-probe", is_ticking_at_start=False)
        self.url = url
        self.answers: list[tuple[str, int, bool]] = []
        # One JPEG of the overloaded kind (the load's image size), noise so that it costs a real decode.
        image_b64 = base64.b64encode(noise_image(image_px, image_px, seed=11)).decode()
        self._image_body = {"image": {"b64": image_b64}, "use_cache": False}
        self._client: httpx.Client | None = None

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as self._client:
            super()._run()

    def tick(self) -> None:
        assert self._client is not None
        for kind, body in (("image", self._image_body), ("text", {"text": f"probe at {time.monotonic():.3f}"})):
            response = self._client.post("/v1/infer", json=body)
            self.answers.append((kind, response.status_code, "retry-after" in response.headers))

    def statuses(self, kind: str) -> Counter:
        return Counter(status for answer_kind, status, _ in self.answers if answer_kind == kind)


def _deadline_trace(directory: Path, rate_rps: float, duration_s: float, deadline_ms: int, seed: int) -> Path:
    """Poisson arrivals of ``MIX`` requests, each with ``timeout_ms``, as a JSON Lines trace."""
    modalities, weights = zip(*(item.split(":") for item in MIX.split(",")))
    rng = random.Random(seed)
    path = directory / f"phase-{seed}.jsonl"
    with path.open("w") as trace:
        for offset_s in poisson_offsets_s(rate_rps, duration_s, seed):
            modality = rng.choices(modalities, [float(w) for w in weights])[0]
            record: dict = {"offset_ms": offset_s * 1000, "modality": modality, "timeout_ms": deadline_ms,
                            "image_id": rng.randrange(NUM_IMAGES)}
            if modality != "vision":
                record["text_chars"] = rng.randint(8, 60)
            trace.write(json.dumps(record) + "\n")
    return path


def _replay(url: str, trace: Path, duration_s: float) -> list[Sample]:
    return run_samples(BenchConfig(url=url, mode=RunMode.TRACE, duration_s=duration_s, trace_path=trace,
                                   num_images=NUM_IMAGES, image_size=ImageSize(IMAGE_PX, IMAGE_PX),
                                   is_truncating=True, show_progress=False))


def _phase_row(name: str, offered_rps: float, samples: list[Sample], duration_s: float) -> tuple[str, ...]:
    outcomes = Counter(sample.outcome for sample in samples)
    num_ok = outcomes.pop("ok", 0)
    others = ", ".join(f"{outcome}:{count}" for outcome, count in sorted(outcomes.items())) or "-"
    return (name, f"{offered_rps:.0f}", f"{len(samples)}", f"{num_ok}", f"{num_ok / duration_s:.1f}", others,
            f"{latency_ms(samples, 50, from_sent=True):.0f}", f"{latency_ms(samples, 99, from_sent=True):.0f}",
            f"{latency_ms(samples, 99):.0f}", f"{lag_p99_ms(samples):.0f}")


def overload(preset: str, factor: float, overload_s: float, deadline_ms: int,
             phase_s: float) -> tuple[str, bool, list[Figure]]:
    settings = {"DEFAULT_TIMEOUT_MS": str(deadline_ms), "CACHE_IMAGE_BYTES": "0", "CACHE_TEXT_BYTES": "0",
                "DECODE_THREADS": str(DECODE_THREADS), "MAX_DECODE_QUEUE": str(MAX_DECODE_QUEUE)}
    with running(mmserve_command(preset, settings)) as server:
        saturation_rps = capacity_rps(server.url, image_px=IMAGE_PX, mix=MIX)
        calm_rps = 0.5 * saturation_rps
        with tempfile.TemporaryDirectory() as directory:
            traces = [_deadline_trace(Path(directory), rate, duration, deadline_ms, seed)
                      for rate, duration, seed in ((calm_rps, phase_s, 3), (factor * saturation_rps, overload_s, 4),
                                                   (calm_rps, phase_s, 5))]
            baseline = _replay(server.url, traces[0], phase_s)
            warm_rss = rss_bytes(server.pid)
            with ProcessTreeSampler(server.pid, interval_s=1.0) as sampler, RefusalProbe(server.url, IMAGE_PX) as probe:
                burst = _replay(server.url, traces[1], overload_s)
            recovery = _replay(server.url, traces[2], phase_s)

    rows = [("phase", "offered/s", "sent", "200", "200/s", "other answers", "p50 ms", "p99 ms",
             "p99 ms from schedule", "client lag p99 ms"),
            _phase_row("baseline", calm_rps, baseline, phase_s),
            _phase_row(f"overload {factor:g}x", factor * saturation_rps, burst, overload_s),
            _phase_row("recovery", calm_rps, recovery, phase_s)]
    refused = [sample for sample in burst if not sample.is_ok]
    probe_refusals = [has_retry_after for kind, status, has_retry_after in probe.answers
                      if kind == "image" and status == 503]
    overload_rss = sampler.series[server.pid].rss_bytes  # the server's own process
    max_rss = max(overload_rss)
    checks = {
        "admitted p99 within the deadline": latency_ms(burst, 99, from_sent=True) <= deadline_ms,
        "refusals are 503/504 only": all(sample.outcome in ("503", "504") for sample in refused),
        "503s carry Retry-After (probe)": bool(probe_refusals) and all(probe_refusals),
        f"RSS within {RSS_TOLERANCE:.0%} of warmed-up": max_rss <= warm_rss * (1 + RSS_TOLERANCE),
        "latency back to baseline": latency_ms(recovery, 99, from_sent=True)
        <= RECOVERY_SLACK * latency_ms(baseline, 99, from_sent=True) + RECOVERY_SLACK_MS,
    }
    lines = [
        f"overload: preset {preset}, saturation {saturation_rps:.1f} answers/s (closed loop, 32 outstanding), "
        f"deadline {deadline_ms} ms, caches off, {IMAGE_PX} px JPEGs ({MIX}), {DECODE_THREADS} decode threads, "
        f"max_decode_queue {MAX_DECODE_QUEUE}; latency of 200s from the actual send time "
        "(what the server's deadline counts), and from the intended one (includes the generator's lag)",
        ruled(rows),
        f"RSS: warmed-up {warm_rss / 1024**2:.1f} MiB, during overload max {max_rss / 1024**2:.1f} MiB "
        f"(+{(max_rss / warm_rss - 1) * 100:.1f} %), min {min(overload_rss) / 1024**2:.1f} MiB",
        f"refusal probe during overload: {sum(probe.statuses('image').values())} image requests, "
        f"{len(probe_refusals)} got 503, {sum(probe_refusals)} of them with Retry-After; "
        f"{sum(probe.statuses('text').values())} text requests beside them: "
        + ", ".join(f"{count} x {status}" for status, count in sorted(probe.statuses("text").items())),
        *(f"[{'PASS' if ok else 'FAIL'}] {name}" for name, ok in checks.items()),
    ]
    figures = [Figure("overload", f"admitted p99 at {factor:g}x saturation (deadline {deadline_ms} ms)",
                      round(latency_ms(burst, 99, from_sent=True)), "ms"),
               Figure("overload", "RSS over warmed-up", round((max_rss / warm_rss - 1) * 100, 1), "%")]
    return "\n".join(lines), all(checks.values()), figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--factor", type=float, default=3.0, help="offered load as a multiple of saturation")
    parser.add_argument("--overload-s", type=float, default=30.0)
    parser.add_argument("--deadline-ms", type=int, default=1000)
    parser.add_argument("--phase-s", type=float, default=10.0, help="length of the baseline and recovery phases")
    add_save_figures_argument(parser)
    args = parser.parse_args(argv)
    report, is_pass, figures = overload(args.preset, args.factor, args.overload_s, args.deadline_ms, args.phase_s)
    print(report)
    save_figures(args.save_figures, figures)
    return 0 if is_pass else 1


if __name__ == "__main__":
    sys.exit(main())
