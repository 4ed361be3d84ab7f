"""benchmarks.engines: the Zipf bodies wrk draws, the image cache read from /metrics, and the verdicts it prints.

The draws are held to real ``wrk`` posting to ``tests/http_sink.py`` (a real
HTTP server that counts requests and bytes); the arithmetic to made-up runs
worked out by hand.
"""

from __future__ import annotations

import httpx
import pytest

from benchmarks import engines
from benchmarks.engines import (
    AFFINITY, CPU_SHAPES, ONE_ENGINE, ROUND_ROBIN, CacheRuns, affinity_verdict, batches_by_engine, cpu_verdict,
    partial_metrics_notes,
)
from benchmarks.engines_workload import (
    CacheCount, bytes_per_image_entry, cache_bytes_for, image_cache_count, write_zipf_bodies, zipf_script,
)
from benchmarks.harness import ServerRuns, run_wrk, running
from benchmarks.loadgen.server_metrics import parse_metrics_text
from http_sink import sink_command
from tests.conftest import find_wrk_binary

SHORT, LONG = b"s" * 100, b"l" * 300


def _long_share(tmp_path, exponent: float) -> float:
    """The share of requests that carried the second (300-byte) body, from the bytes the sink received."""
    bodies = write_zipf_bodies(tmp_path, "body", "/v1/traces", [SHORT, LONG], exponent, seed=3)
    with running(sink_command(), ready_timeout_s=30.0) as sink:
        report = run_wrk(sink.url, bodies, seconds=1.0, connections=2)
        stats = httpx.get(sink.url + "/stats", timeout=5.0, trust_env=False).json()
    num_long, remainder = divmod(stats["bytes"] - 100 * stats["requests"], 200)
    assert remainder == 0 and report.num_ok > 200  # every request carried one body, whole
    return num_long / stats["requests"]


def test_wrk_draws_the_bodies_zipf_by_rank(tmp_path):
    find_wrk_binary()
    # Zipf(1.1) over two ranks: P(second) = 2**-1.1 / (1 + 2**-1.1) = 0.318; uniform (exponent 0): 0.5.
    assert 0.25 < _long_share(tmp_path / "zipf", 1.1) < 0.39
    assert 0.42 < _long_share(tmp_path / "uniform", 0.0) < 0.58


def test_the_script_carries_its_seed_and_refuses_a_negative_one():
    assert zipf_script(1.1, 7).startswith("local exponent, seed = 1.1, 7\n")
    with pytest.raises(ValueError):
        zipf_script(1.1, -1)


def _scrape(hits: tuple[float, float], misses: tuple[float, float], coalesced: float = 0.0) -> str:
    """Two engines' image cache series, as an engine-labelled /metrics would show them, and one text series."""
    lines = ["# TYPE mmserve_cache_events_total counter"]
    for engine, (hit, miss) in enumerate(zip(hits, misses)):
        lines.append(f'mmserve_cache_events_total{{engine="{engine}",event="hit",modality="image"}} {hit}')
        lines.append(f'mmserve_cache_events_total{{engine="{engine}",event="miss",modality="image"}} {miss}')
        lines.append(f'mmserve_cache_events_total{{engine="{engine}",event="insert",modality="image"}} {miss}')
    lines.append(f'mmserve_cache_events_total{{engine="0",event="coalesced",modality="image"}} {coalesced}')
    lines.append('mmserve_cache_events_total{engine="0",event="hit",modality="text"} 1000')
    lines += ["# TYPE mmserve_cache_bytes gauge", 'mmserve_cache_bytes{engine="0",modality="image"} 3000',
              'mmserve_cache_bytes{engine="1",modality="image"} 1000',
              'mmserve_cache_bytes{engine="0",modality="text"} 9',
              "# TYPE mmserve_cache_entries gauge", 'mmserve_cache_entries{engine="0",modality="image"} 3',
              'mmserve_cache_entries{engine="1",modality="image"} 1']
    return "\n".join(lines) + "\n"


def test_the_image_hit_rate_sums_both_engines_between_two_scrapes_and_counts_coalesced_as_lookups():
    before = parse_metrics_text(_scrape((10, 20), (5, 5)))
    after = parse_metrics_text(_scrape((100, 50), (15, 15), coalesced=5))
    count = image_cache_count(before, after)
    # hits 90 + 30, misses 10 + 10, coalesced 5: inserts and the text cache are not lookups of the image cache.
    assert (count.num_hits, count.num_lookups) == (120, 145)
    assert count.hit_rate == pytest.approx(120 / 145)
    assert (count + CacheCount(0, 55)).hit_rate == pytest.approx(0.6)
    assert CacheCount().hit_rate is None


def test_an_image_entry_is_the_bytes_over_the_entries_of_every_engine():
    assert bytes_per_image_entry(parse_metrics_text(_scrape((0, 0), (0, 0)))) == 1000.0
    assert bytes_per_image_entry(parse_metrics_text("")) is None
    assert cache_bytes_for(256, 1000.5) == 256_128
    assert cache_bytes_for(3, 1000.1) == 3001  # rounded up: the cache holds every one of them


def _runs(*rps: float, cpu_s: float = 1.0) -> ServerRuns:
    return ServerRuns(throughputs_rps=list(rps), saturation_other_cpus=[0.0] * len(rps),
                      saturation_cpu_s=[cpu_s] * len(rps), saturation_num_ok=[100] * len(rps),
                      saturation_wall_s=[1.0] * len(rps), other_cpus=[0.0] * len(rps))


def test_affinity_is_judged_on_its_hit_rate_gap_and_its_answers_per_second():
    cache = CacheRuns()
    cache.add(ONE_ENGINE, CacheCount(900, 1000))
    cache.add(AFFINITY, CacheCount(440, 500))
    cache.add(AFFINITY, CacheCount(440, 500))  # 88 %
    cache.add(ROUND_ROBIN, CacheCount(800, 1000))
    runs = {ONE_ENGINE: _runs(100.0, 110.0), AFFINITY: _runs(120.0, 86.0), ROUND_ROBIN: _runs(84.0)}
    lines, figures = affinity_verdict(runs, cache)
    # 88 % against 90 %: 2 points, judged as printed; 103 answers/s against 105.
    assert lines[0] == ("affinity vs 1 engine: hit rate -2.0 points (target within 2: met), answered/s 0.98x "
                        "(target >= 1.00: MISSED)")
    assert lines[1] == "round robin vs affinity: hit rate -8.0 points, answered/s 0.82x (what affinity saves)"
    assert [figure.value for figure in figures] == [-2.0, 0.98, 8.0]


def test_a_server_without_image_lookups_stops_the_table():
    with pytest.raises(RuntimeError, match="no image cache lookup"):
        CacheRuns().hit_rate_pct(AFFINITY)


@pytest.fixture(autouse=True)
def _two_cpus(monkeypatch):
    """The runs below were made up on a 2-CPU machine: answers per free CPU divide by what 2 CPUs leave."""
    monkeypatch.setattr(engines, "num_usable_cpus", lambda: 2)


def test_the_cpu_verdict_names_the_shape_that_answers_more():
    one, two = CPU_SHAPES
    line, figures = cpu_verdict("torch", {one: _runs(100.0, cpu_s=2.0), two: _runs(110.0, cpu_s=1.5)})
    assert line == ("torch: --engines 2 over --engines 1: answered/s 1.10x, per free CPU 1.10x, CPU per answer 0.75x "
                    "-> --engines 2 answers more")
    assert [figure.value for figure in figures] == [1.1, 1.1, 0.75]
    line, _ = cpu_verdict("onnxruntime", {one: _runs(100.0), two: _runs(90.0)})
    assert line.endswith("-> --engines 1 answers more")


def test_a_win_that_the_neighbours_load_explains_is_no_win():
    one, two = CPU_SHAPES
    # 100 answers/s with 1 of 2 CPUs taken by others (100 per free CPU) against 110 with none taken (55).
    busy = _runs(100.0)
    busy.saturation_other_cpus[:] = [1.0]
    line, figures = cpu_verdict("torch", {one: busy, two: _runs(110.0)})
    assert "answered/s 1.10x, per free CPU 0.55x" in line and line.endswith("disagree (the neighbours' load)")
    assert figures[1].value == 0.55


def test_batches_are_counted_by_engine_over_the_lanes():
    text = ("# TYPE mmserve_batch_size histogram\n"
            'mmserve_batch_size_count{engine="0",lane="vision"} 7\nmmserve_batch_size_count{engine="0",lane="text"} 2\n'
            'mmserve_batch_size_count{engine="1",lane="vision"} 5\n')
    assert batches_by_engine(parse_metrics_text(text)) == {"0": 9.0, "1": 5.0}
    assert batches_by_engine(parse_metrics_text('mmserve_batch_size_count{lane="vision"} 3\n')) == {"-": 3.0}
    assert batches_by_engine(None) == {}


def test_a_metrics_page_that_counts_one_engine_of_two_is_named_under_the_table():
    cache = CacheRuns()
    cache.add(ONE_ENGINE, CacheCount(180, 201))
    cache.add(AFFINITY, CacheCount(90, 101))  # engine 0's half of 200 answers
    runs = {ONE_ENGINE: _runs(100.0, 100.0), AFFINITY: _runs(100.0, 100.0)}
    assert cache.lookups_per_answer(ONE_ENGINE, 200) == pytest.approx(1.005)
    (note,) = partial_metrics_notes(runs, cache)
    assert note.startswith(f"NOTE: {AFFINITY}'s /metrics counted 0.51 image cache lookups per answer")


def test_a_servers_memory_is_read_for_every_process_of_its_tree():
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    child = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "0"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline_s = time.monotonic() + 30.0
        while b"http.server" not in Path(f"/proc/{child.pid}/cmdline").read_bytes():  # until it runs its program
            assert time.monotonic() < deadline_s, "the child never started"
            time.sleep(0.05)
        text = engines.memory_by_process(child.pid)
    finally:
        child.kill()
        child.wait()
    assert text.startswith("server x1: ") and " MiB RSS (" in text and "PSS of the whole server" in text
    assert engines.pss_bytes(os.getpid()) > 1024 * 1024


def test_the_figures_read_as_the_headline_prints_them():
    from benchmarks.headline import figure_text

    cache = CacheRuns()
    for name, count in ((ONE_ENGINE, CacheCount(900, 1000)), (AFFINITY, CacheCount(910, 1000)),
                        (ROUND_ROBIN, CacheCount(800, 1000))):
        cache.add(name, count)
    runs = {name: _runs(100.0) for name in (ONE_ENGINE, AFFINITY, ROUND_ROBIN)}
    _, figures = affinity_verdict(runs, cache)
    assert figure_text(vars(figures[0])) == "image hit rate, 2 engines (affinity) minus 1 engine: 1.0 points"


def test_a_gap_that_rounds_to_nothing_prints_without_a_sign():
    cache = CacheRuns()
    for name, count in ((ONE_ENGINE, CacheCount(9090, 10000)), (AFFINITY, CacheCount(9089, 10000)),
                        (ROUND_ROBIN, CacheCount(8100, 10000))):
        cache.add(name, count)
    lines, figures = affinity_verdict({name: _runs(100.0) for name in (ONE_ENGINE, AFFINITY, ROUND_ROBIN)}, cache)
    assert lines[0].startswith("affinity vs 1 engine: hit rate +0.0 points") and str(figures[0].value) == "0.0"
