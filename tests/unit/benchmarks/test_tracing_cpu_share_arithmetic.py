"""The tracing CPU-share benchmark's arithmetic: which profile samples are tracing's, and under which frame."""

from __future__ import annotations

from pathlib import Path

import pytest

import benchmarks
from benchmarks.harness.sampled_stacks import parse_raw
from benchmarks.tracing_cpu_share import is_tracing, tracing_share

CHECKOUT = Path(benchmarks.__file__).resolve().parents[1].as_posix()


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
    assert (share.num_samples, share.num_matching) == (100, 11)
    assert share.fraction == pytest.approx(0.11)
    assert dict(share.top_frames) == {
        "answer_traced (server/http/traced_answer.py)": 6,
        "worker (opentelemetry/sdk/_shared_internal/__init__.py)": 3,
        "_with_batch_trace (router/worker.py)": 2,
    }


def test_a_frame_without_a_file_is_kept_and_is_not_tracings():
    [(frames, count)] = parse_raw(["<native> 4"])
    assert count == 4 and not is_tracing(frames[0])
