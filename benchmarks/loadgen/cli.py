"""``mmserve bench``: flags in, a table on stdout, optional JSON report and PNG.

Exit codes: 0 the run completed and most answers were successes, 1 the run
could not start (bad trace, an unreadable key file, no request reached the
server), 2 a usage error (a flag out of range, contradictory flags: one line,
as argparse's own errors), 3 the run completed but more than half of its
requests failed (``report.MOSTLY_ERRORS_SHARE``: a warning says which answers
and what to change).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import os
import resource
import sys
from pathlib import Path

from benchmarks.loadgen import trace as trace_module
from clients.api_key_file import ApiKeyFileError, read_api_key
from benchmarks.loadgen.bench import run_bench
from benchmarks.loadgen.config import DEFAULT_MAX_LAG_P99_MS, DEFAULT_TIMEOUT_S, BenchConfig, RunMode
from benchmarks.loadgen.errors import ConfigError, LoadgenError, RunNotStartedError
from benchmarks.loadgen.image_pool import ImageFormat, parse_image_size
from benchmarks.loadgen.report import format_table
from benchmarks.loadgen.workload import DEFAULT_MIX_TEXT, parse_mix, parse_text_length_range

_WANTED_OPEN_FILES = 65536
EXIT_CANNOT_START = 1  # the run could not start: bad trace, unreadable key file, no request reached the server
EXIT_USAGE = 2  # a usage error, as argparse's own
EXIT_MOSTLY_ERRORS = 3  # the run completed, but more than half of its requests failed
_DESCRIPTION = """\
Open-loop load generator for mmserve's POST /v1/infer.

With --rate, requests arrive as a Poisson process and latency is measured from
each request's intended send time, so a stalled server shows its whole queue
(no coordinated omission). With --concurrency, C workers send back to back
(closed loop). With --trace, a recorded schedule is replayed. The generator's
own lag behind schedule is reported; a run where it exceeds --max-lag-ms at p99
is flagged as generator-bound. /metrics is scraped before and after the run
for the server's batch sizes, queue waits and cache hit ratio.

Exit status: 0 the run completed and at most half of its requests failed;
3 more than half failed (the warnings say which answers, e.g. 401 without
--api-key-file on a server with keys, 422 for texts over the model's limit);
1 the run could not start (no request reached the server, a bad trace or key
file); 2 a usage error.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmserve bench",
        description=_DESCRIPTION,
        epilog=inspect.cleandoc(trace_module.__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("url", metavar="URL", help="server base URL, e.g. http://127.0.0.1:8000")
    pacing = parser.add_mutually_exclusive_group()
    pacing.add_argument("--rate", type=float, metavar="R", help="open loop: Poisson arrivals at R req/s")
    pacing.add_argument("--concurrency", type=int, metavar="C", help="closed loop: C workers back to back")
    parser.add_argument(
        "--duration", type=float, metavar="S", help="seconds to send for (required unless --trace; with it, a cut-off)"
    )
    parser.add_argument("--mix", default=DEFAULT_MIX_TEXT, help=f"modality weights (default {DEFAULT_MIX_TEXT})")
    parser.add_argument(
        "--images", type=int, default=100, metavar="N", help="distinct images in the pool (default 100)"
    )
    parser.add_argument(
        "--zipf", type=float, metavar="S", help="Zipf(S) image popularity over the pool (default: uniform)"
    )
    parser.add_argument("--image-size", default="224x224", metavar="WxH", help="image size (default 224x224)")
    parser.add_argument(
        "--image-format",
        choices=[f.value for f in ImageFormat],
        default=ImageFormat.JPEG.value,
        help="encoding of the pool's images (default jpeg)",
    )
    parser.add_argument(
        "--text-chars", default="32:256", metavar="MIN:MAX", help="generated text length in characters (default 32:256)"
    )
    parser.add_argument("--trace", type=Path, metavar="FILE", help="replay a trace (formats below)")
    parser.add_argument("--speed", type=float, default=1.0, metavar="X", help="replay X times faster (default 1)")
    parser.add_argument("--output", type=Path, metavar="FILE", help="write the JSON report here")
    parser.add_argument("--plot", type=Path, metavar="FILE", help="write a PNG (latency CDF, throughput, p99)")
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="seed of every random choice (default 0)")
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="T",
        help=f"client-side limit per request (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--max-lag-ms",
        type=float,
        default=DEFAULT_MAX_LAG_P99_MS,
        metavar="MS",
        help=f"p99 generator lag above which the run is flagged generator-bound (default {DEFAULT_MAX_LAG_P99_MS:g})",
    )
    parser.add_argument(
        "--truncate", action="store_true", help='send "truncate": true, so texts over the model\'s limit are cut'
    )
    parser.add_argument("--api-key-file", type=Path, metavar="FILE",
                        help="send the first key in FILE as a bearer token (servers with API keys)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return parser


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Turn parsed flags into a validated ``BenchConfig`` (raises ``ConfigError``)."""
    if args.trace is not None:
        if args.rate is not None or args.concurrency is not None:
            raise ConfigError("--trace replays the trace's own schedule; drop --rate/--concurrency")
        mode = RunMode.TRACE
    elif args.concurrency is not None:
        mode = RunMode.CLOSED
    elif args.rate is not None:
        mode = RunMode.OPEN
    else:
        raise ConfigError("choose --rate R (open loop), --concurrency C (closed loop) or --trace FILE")
    return BenchConfig(
        url=args.url.rstrip("/"),
        mode=mode,
        duration_s=args.duration,
        rate_rps=args.rate,
        concurrency=args.concurrency,
        mix=parse_mix(args.mix),
        num_images=args.images,
        zipf_exponent=args.zipf,
        image_size=parse_image_size(args.image_size),
        image_format=ImageFormat(args.image_format),
        text_length=parse_text_length_range(args.text_chars),
        trace_path=args.trace,
        speed=args.speed,
        seed=args.seed,
        timeout_s=args.timeout_s,
        max_lag_p99_ms=args.max_lag_ms,
        is_truncating=args.truncate,
        show_progress=not args.no_progress,
        api_key=_api_key(args.api_key_file),
    )


def _api_key(path: Path | None) -> str | None:
    """``--api-key-file``'s key, read as ``mmserve quantiles`` reads it (raises ``RunNotStartedError``)."""
    if path is None:
        return None
    try:
        return read_api_key(path)
    except ApiKeyFileError as e:
        raise RunNotStartedError(str(e)) from e


def _raise_open_file_limit() -> None:
    """An open loop against a stalled server holds one socket per request in flight."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _WANTED_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, _WANTED_OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def main(argv: list[str]) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2): argparse has printed why
        return int(e.code) if isinstance(e.code, int) else 2
    try:
        config = config_from_args(args)
        if args.output is not None and not args.output.parent.is_dir():
            raise RunNotStartedError(f"--output directory {args.output.parent} does not exist")
        if args.plot is not None and not args.plot.parent.is_dir():
            raise RunNotStartedError(f"--plot directory {args.plot.parent} does not exist")
        _raise_open_file_limit()
        outcome = asyncio.run(run_bench(config))
    except ConfigError as e:
        print(f"mmserve bench: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except LoadgenError as e:
        print(f"mmserve bench: error: {e}", file=sys.stderr)
        return EXIT_CANNOT_START
    except KeyboardInterrupt:
        print("mmserve bench: interrupted", file=sys.stderr)
        return 130

    _print_to_closed_stdout_or_not(format_table(outcome.report))
    if args.output is not None:
        args.output.write_text(json.dumps(outcome.report, indent=2) + "\n", encoding="utf-8")
    if args.plot is not None:
        from benchmarks.loadgen.plot import write_plot

        write_plot(outcome.result, args.plot, title=f"mmserve bench {config.url} ({config.mode.value})")
    return EXIT_MOSTLY_ERRORS if outcome.report["mostly_errors"] else 0


def _print_to_closed_stdout_or_not(text: str) -> None:
    """Print ``text``; a reader that stopped early (``| head -3``) is no error, as Python's docs on SIGPIPE
    recommend: stdout is pointed at devnull so the interpreter's final flush does not fail again."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
