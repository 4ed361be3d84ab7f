"""The access-layer CPU-share benchmark's arithmetic: which samples are the layer's, and its µs per request."""

from __future__ import annotations

from pathlib import Path

import pytest

import benchmarks
from benchmarks.auth_cpu_share import SampledRun, access_cost_us, is_access_layer
from benchmarks.harness.sampled_stacks import parse_raw, share_held

CHECKOUT = Path(benchmarks.__file__).resolve().parents[1].as_posix()
RAW = [
    "_run_once (asyncio/base_events.py:1922);__call__ (/src/server/http/auth.py:80);"
    "check (/src/server/http/keys.py:51);compare_digest (hmac.py:10) 3\n",
    "_run_once (asyncio/base_events.py:1922);__call__ (/src/server/http/rate_limit.py:120) 2\n",
    # Under the middleware, in the app it awaits: the route's, not the layer's.
    "_run_once (asyncio/base_events.py:1922);__call__ (/src/server/http/auth.py:95);"
    "__call__ (/v/site-packages/starlette/routing.py:700);infer (/src/server/routes/infer.py:201) 85\n",
    "_run_once (asyncio/base_events.py:1922);__call__ (/src/server/http/auth.py:95);"
    "__call__ (/v/site-packages/starlette/routing.py:700) 5\n",
    "_run_once (asyncio/base_events.py:1922);oauth (/v/site-packages/lib/auth.py:3) 5\n",
]


def stacks():
    return parse_raw(line.replace("/src", CHECKOUT) for line in RAW)


def test_a_sample_is_the_layers_when_its_innermost_non_stdlib_frame_is_not_when_the_layer_only_wraps_it():
    share = share_held(stacks(), is_access_layer)
    assert (share.num_samples, share.num_matching) == (100, 5)  # hmac under the key check counts, routing not
    assert dict(share.top_frames) == {"check (server/http/keys.py)": 3, "__call__ (server/http/rate_limit.py)": 2}


def test_the_layers_microseconds_are_its_share_of_the_servers_cpu_per_request():
    share = share_held(stacks(), is_access_layer)
    with_keys = SampledRun("B", num_requests=1000, num_failed=0, cpu_s=0.8, share=share)  # 800 us a request
    assert with_keys.access_us_per_request == pytest.approx(0.05 * 800)
    no_layer = share_held(parse_raw([RAW[2].replace("/src", CHECKOUT)]), is_access_layer)
    without = SampledRun("A", num_requests=1000, num_failed=0, cpu_s=0.7, share=no_layer)
    cost, _ = access_cost_us([without, with_keys, with_keys, without])
    assert no_layer.num_matching == 0
    assert cost == pytest.approx(40.0)
