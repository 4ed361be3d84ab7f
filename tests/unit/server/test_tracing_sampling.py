"""The tail-biased keep-or-drop rule: errors, slow requests and sampled parents always; the ratio otherwise."""

from __future__ import annotations

import random

import pytest

from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

from server.http.tail_sampling import TailSampler

SLOW_NS = 500_000_000


@pytest.mark.parametrize(("parent_sampled", "status_code", "duration_ns", "is_kept"), [
    (True, 200, 1, True),  # the caller records this trace
    (None, 500, 1, True),  # the server's failure
    (None, 504, 1, True),
    (False, 503, 1, True),  # errors override a parent that said no
    (None, 200, SLOW_NS, True),  # slow
    (False, 200, SLOW_NS, True),
    (None, 200, SLOW_NS - 1, False),  # ratio 0: nothing else
    (None, 422, 1, False),  # the client's fault follows the ratio
    (False, 200, 1, False),
])
def test_the_rules_in_order(parent_sampled, status_code, duration_ns, is_kept):
    sampler = TailSampler(ratio=0.0, slow_ns=SLOW_NS)
    assert sampler.should_keep(12345, parent_sampled=parent_sampled, status_code=status_code,
                               duration_ns=duration_ns) is is_kept


def test_a_parent_that_said_no_is_not_overridden_by_the_ratio():
    sampler = TailSampler(ratio=1.0, slow_ns=0)
    assert not sampler.should_keep(7, parent_sampled=False, status_code=200, duration_ns=1)
    assert sampler.should_keep(7, parent_sampled=None, status_code=200, duration_ns=1)


def test_slow_rule_off_at_zero():
    assert not TailSampler(ratio=0.0, slow_ns=0).should_keep(1, parent_sampled=None, status_code=200,
                                                             duration_ns=10**12)


@pytest.mark.parametrize("ratio", [0.0, 0.01, 0.25, 1.0])
def test_the_ratio_decides_as_trace_id_ratio_based_does(ratio):
    reference = TraceIdRatioBased(ratio)
    sampler = TailSampler(ratio=ratio, slow_ns=0)
    rng = random.Random(0)
    trace_ids = [rng.getrandbits(128) for _ in range(5000)]
    expected = [reference.should_sample(None, trace_id, "span").decision.is_sampled() for trace_id in trace_ids]
    assert [sampler.is_ratio_sampled(trace_id) for trace_id in trace_ids] == expected
    assert abs(sum(expected) / len(expected) - ratio) < 0.02


@pytest.mark.parametrize(("ratio", "slow_ns"), [(-0.1, 0), (1.5, 0), (0.5, -1)])
def test_bad_values_are_refused(ratio, slow_ns):
    with pytest.raises(ValueError):
        TailSampler(ratio=ratio, slow_ns=slow_ns)
