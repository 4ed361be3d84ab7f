"""The tracing benchmarks' arithmetic: the interval on per-round ratios, and which profile samples are tracing's."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pytest

import benchmarks
from benchmarks.tracing_cpu_share import parse_raw, tracing_share
from benchmarks.tracing_overhead import mean_interval

CHECKOUT = Path(benchmarks.__file__).resolve().parents[1].as_posix()


def test_the_interval_is_the_t_interval_of_the_mean():
    mean, low, high = mean_interval([0.9, 1.0, 1.1])
    # sd 0.1, n 3: t(0.975, 2 df) = 4.303
    assert mean == pytest.approx(1.0)
    assert (low, high) == pytest.approx((1.0 - 4.303 * 0.1 / math.sqrt(3), 1.0 + 4.303 * 0.1 / math.sqrt(3)))


def test_more_rounds_of_the_same_spread_narrow_it():
    rng = random.Random(7)
    widths = []
    for num_rounds in (5, 20, 80):
        ratios = [rng.gauss(0.98, 0.15) for _ in range(num_rounds)]
        _, low, high = mean_interval(ratios)
        assert low < statistics.fmean(ratios) < high
        widths.append(high - low)
    assert widths[0] > widths[1] > widths[2]


def test_it_covers_the_true_mean_about_95_times_in_100():
    rng = random.Random(11)
    covered = 0
    for _ in range(400):
        _, low, high = mean_interval([rng.gauss(1.0, 0.15) for _ in range(12)])
        covered += low <= 1.0 <= high
    assert 0.91 <= covered / 400 <= 0.99


def test_one_round_has_no_interval():
    mean, low, high = mean_interval([0.97])
    assert mean == 0.97 and math.isnan(low) and math.isnan(high)


def test_a_sample_is_tracings_if_any_frame_is_and_is_filed_under_the_outermost():
    raw = [
        "_run_once (asyncio/base_events.py:1922);infer (/src/mmserve/server/routes/infer.py:201);"
        "answer_traced (/src/mmserve/server/http/traced_answer.py:59);"
        "finish (/src/mmserve/server/http/tracing.py:107) 6\n",
        "_bootstrap (threading.py:995);worker (/v/site-packages/opentelemetry/sdk/_shared_internal/__init__.py:159);"
        "send (/v/site-packages/requests/sessions.py:703) 3\n",
        "_serve (/src/mmserve/router/worker.py:128);_run (/src/mmserve/router/worker.py:148);"
        "_with_batch_trace (/src/mmserve/router/worker.py:170);replace (dataclasses.py:1501) 2\n",
        "_serve (/src/mmserve/router/worker.py:128);_run (/src/mmserve/router/worker.py:143);"
        "run (/src/mmserve/router/runner.py:90) 80\n",
        "\n",
        "infer (/src/mmserve/server/routes/infer.py:170);dumps (/src/mmserve/server/http/json_body.py:12) 9\n",
    ]
    share = tracing_share(parse_raw(line.replace("/src/mmserve", CHECKOUT) for line in raw))
    assert (share.num_samples, share.num_tracing) == (100, 11)
    assert share.fraction == pytest.approx(0.11)
    assert dict(share.top_frames) == {
        "answer_traced (server/http/traced_answer.py)": 6,
        "worker (opentelemetry/sdk/_shared_internal/__init__.py)": 3,
        "_with_batch_trace (router/worker.py)": 2,
    }


def test_a_frame_without_a_file_is_kept_and_is_not_tracings():
    [(frames, count)] = parse_raw(["<native> 4"])
    assert count == 4 and not frames[0].is_tracing
