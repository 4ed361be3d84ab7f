"""The token buckets API processes share: the in-process store's answers, its collision rule, two real processes.

The two-process cases spawn fresh interpreters (no fork), each mapping the
table by its path as an API process does, and take from one bucket at once.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from server.http.rate_limit import InProcessTokenBuckets, RateLimit
from server.workers.shared_rate_buckets import (
    DEFAULT_NUM_BUCKETS,
    FILE_PREFIX,
    SharedBucketTable,
    SharedTokenBuckets,
    caller_tag,
    table_bytes,
)

S = 1_000_000_000  # ns per second
SLOW = RateLimit(per_s=0.001, burst=1)  # a token each 1,000 s: nothing refills within these tests


@pytest.fixture
def table():
    created = SharedBucketTable.create(num_buckets=1024)
    yield created
    created.remove()


def one_set_table(directory: Path) -> SharedBucketTable:
    return SharedBucketTable.create(num_buckets=4, directory=str(directory))  # one set of four slots


def test_the_table_lives_in_shared_memory_and_is_removed(table):
    path = Path(table.path)
    assert path.parent == Path("/dev/shm") and path.name.startswith(FILE_PREFIX)
    assert path.stat().st_size == table_bytes(1024 // 4)
    table.remove()
    assert not path.exists()
    table.remove()  # removing twice is harmless (the supervisor's finally)


def test_the_default_table_holds_as_many_buckets_as_the_in_process_bound_in_1_5_mib(tmp_path):
    table = SharedBucketTable.create(directory=str(tmp_path))
    assert Path(table.path).stat().st_size == table_bytes(DEFAULT_NUM_BUCKETS // 4) == 64 + 1_572_864


def test_a_file_that_is_not_a_table_is_refused(tmp_path):
    other = tmp_path / "other"
    other.write_bytes(b"\0" * 4096)
    with pytest.raises(ValueError, match="not a rate-limit bucket table"):
        SharedTokenBuckets(str(other), SLOW)


def test_the_shared_store_answers_as_the_in_process_store(table):
    limit = RateLimit(per_s=4.0, burst=3)  # a token each 250 ms
    shared, local = SharedTokenBuckets(table.path, limit), InProcessTokenBuckets(limit)
    takes = [("k", S)] * 4 + [("k", S + S // 10), ("k", S + S // 4), ("other", S + S // 4)] + [("k", 100 * S)] * 4
    answers = [shared.take(caller, now_ns) for caller, now_ns in takes]
    assert answers == pytest.approx([local.take(caller, now_ns) for caller, now_ns in takes])
    assert answers[:4] == [0.0, 0.0, 0.0, pytest.approx(0.25)]  # the burst, then 250 ms to wait
    assert answers[4] == pytest.approx(0.15) and answers[5] == 0.0 and answers[6] == 0.0
    assert answers[-1] == pytest.approx(0.25)  # idle for long: refilled to the burst, never beyond
    shared.close()


def test_a_clock_reading_older_than_the_buckets_refills_nothing(table):
    buckets = SharedTokenBuckets(table.path, RateLimit(per_s=1.0, burst=1))
    assert buckets.take("k", 10 * S) == 0.0
    assert buckets.take("k", 9 * S) == pytest.approx(1.0)  # read the clock, then waited for the lock
    assert buckets.take("k", 10 * S + S // 2) == pytest.approx(0.5)  # the newer time was kept
    buckets.close()


def test_four_callers_of_one_set_are_held_and_a_fifth_forgets_the_one_updated_longest_ago(tmp_path):
    table = one_set_table(tmp_path)
    buckets = SharedTokenBuckets(table.path, SLOW)
    assert buckets.num_sets == 1
    for t, caller in enumerate("abcd", start=1):
        assert buckets.take(caller, t) == 0.0  # each starts full, empties its one token
    assert all(buckets.take(caller, 5 + t) > 0 for t, caller in enumerate("abcd"))  # all four still held
    assert buckets.take("a", 10) > 0  # a is now the one seen last; b (at 6) the one seen longest ago
    assert buckets.take("e", 11) == 0.0  # e takes b's slot and starts full
    assert buckets.take("b", 12) == 0.0  # b was forgotten: full again (taking c's slot, updated at 7)
    assert buckets.take("a", 13) > 0 and buckets.take("d", 14) > 0 and buckets.take("e", 15) > 0
    assert buckets.take("c", 16) == 0.0
    buckets.close()


def test_the_tag_is_the_same_in_every_process_and_never_zero():
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        assert pool.map(caller_tag, ["key:3f1c9a0b2e7d", "addr:10.0.0.7"]) == [
            caller_tag("key:3f1c9a0b2e7d"), caller_tag("addr:10.0.0.7")]
    assert caller_tag("key:3f1c9a0b2e7d") != caller_tag("key:3f1c9a0b2e7e") and caller_tag("") != 0


def take_at_one_instant(path: str, limit: RateLimit, num_takes: int, start, granted) -> None:
    """A process's share of the race: ``num_takes`` takes at one clock reading, so nothing refills."""
    buckets = SharedTokenBuckets(path, limit)
    start.wait()
    granted.put(sum(buckets.take("key:shared", 5 * S) == 0.0 for _ in range(num_takes)))
    buckets.close()


def take_for_a_while(path: str, limit: RateLimit, duration_s: float, start, granted) -> None:
    """A process taking as fast as it can for ``duration_s`` on the real clock; reports its grants' times."""
    buckets = SharedTokenBuckets(path, limit)
    start.wait()
    times_ns = []
    stop_ns = time.monotonic_ns() + int(duration_s * S)
    while (now_ns := time.monotonic_ns()) < stop_ns:
        if buckets.take("key:shared", now_ns) == 0.0:
            times_ns.append(now_ns)
    granted.put(times_ns)
    buckets.close()


def run_two(target, args: tuple) -> list:
    context = multiprocessing.get_context("spawn")
    start, granted = context.Barrier(2), context.Queue()
    processes = [context.Process(target=target, args=(*args, start, granted)) for _ in range(2)]
    for process in processes:
        process.start()
    results = [granted.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    return results


def test_two_processes_racing_for_one_bucket_get_its_burst_exactly_once(table):
    burst = 3000
    grants = run_two(take_at_one_instant, (table.path, RateLimit(per_s=1.0, burst=burst), 5000))
    # Per-process buckets would grant 2 x 3000; a read-refill-write not atomic across processes, more than 3000.
    assert sum(grants) == burst, grants
    assert min(grants) > 0, grants  # both took part


def test_two_processes_over_a_window_get_what_one_bucket_grants(table):
    limit = RateLimit(per_s=200.0, burst=100)  # the burst rides out half a second off the CPU
    times_ns = run_two(take_for_a_while, (table.path, limit, 1.0))
    assert all(times_ns), [len(each) for each in times_ns]  # both took tokens
    everything = sorted(t for each in times_ns for t in each)
    window_s = (everything[-1] - everything[0]) / S
    # The bucket starts full at the first take and refills per_s a second: at most that many grants, once.
    assert len(everything) <= limit.burst + limit.per_s * window_s + 1, (len(everything), window_s)
    # Taking all the time, they miss little (per-process buckets would give about twice the bound).
    assert len(everything) >= limit.burst + 0.25 * limit.per_s * window_s, (len(everything), window_s)


def test_a_table_outlives_an_api_process_that_closed_it(table):
    first = SharedTokenBuckets(table.path, SLOW)
    assert first.take("key:k", S) == 0.0
    first.close()  # an API process restarted: its successor maps the same table
    second = SharedTokenBuckets(table.path, SLOW)
    assert second.take("key:k", 2 * S) > 0
    second.close()
    assert os.path.exists(table.path)
