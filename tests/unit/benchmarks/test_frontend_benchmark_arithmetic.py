"""benchmarks/frontend.py: wrk's report read right, runs pooled, targets judged, orders fair."""

from __future__ import annotations

import json

import pytest

from benchmarks.frontend import non_200_growth, request_bodies
from benchmarks.frontend_floor_app import answer_kind
from benchmarks.frontend_measure import (
    FLOOR, Pooled, RunResult, cpu_budget_ms, pool, run_order, table_rows, workers_speedup,
)
from benchmarks.harness.wrk_load import parse_wrk_report
from benchmarks.photo_like import photo_like_jpeg

WRK_OUTPUT = """Running 10s test @ http://127.0.0.1:8000
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    27.72ms   14.75ms 136.74ms   80.06%
    Req/Sec   598.14    270.98     1.28k    57.83%
  14912 requests in 25.07s, 13.64MB read
  Socket errors: connect 0, read 2, write 1, timeout 4
  Non-2xx or 3xx responses: 12
Requests/sec:    594.89
Transfer/sec:    557.13KB
"""


def test_wrk_report_counts_answers_errors_and_time():
    report = parse_wrk_report(WRK_OUTPUT)
    assert (report.num_responses, report.num_non_2xx, report.num_socket_errors) == (14912, 12, 7)
    assert report.duration_s == pytest.approx(25.07)
    assert report.num_ok == 14900
    assert report.ok_rps == pytest.approx(14900 / 25.07)


def test_non_200_growth_names_each_code_that_grew_over_a_run():
    before = {"200": 10.0, "503": 2.0}
    after = {"200": 90.0, "503": 42.0, "499": 64.0, "422": 0.0}
    assert non_200_growth(before, after) == "499 x64, 503 x40"
    assert non_200_growth(after, after) == "none"


def test_wrk_report_in_minutes_and_without_errors():
    report = parse_wrk_report("  300 requests in 1.50m, 1.00MB read\nRequests/sec: 3.33\n")
    assert report.duration_s == pytest.approx(90.0)
    assert (report.num_non_2xx, report.num_socket_errors, report.num_ok) == (0, 0, 300)


def test_a_failed_wrk_run_is_an_error_not_a_zero():
    with pytest.raises(ValueError, match="no request count"):
        parse_wrk_report("unable to connect to 127.0.0.1:1 Connection refused\n")


def test_pooling_weighs_each_run_by_what_it_answered():
    runs = [RunResult("mmserve w1", "text", 1.0, 10.0, 1000, 1), RunResult("mmserve w1", "text", 3.0, 10.0, 1000, 2)]
    pooled = pool(runs)
    assert pooled.cpu_ms_per_request == pytest.approx(2.0)  # 4 s over 2000 answers, not the mean of 1 and 3
    assert pooled.ok_rps == pytest.approx(100.0)
    assert pooled.cores_used == pytest.approx(0.2)
    assert pooled.num_failed == 3
    with pytest.raises(ValueError):
        pool([runs[0], RunResult(FLOOR, "text", 1.0, 1.0, 1, 0)])


def test_orders_are_abba_and_rotate_over_three_servers():
    assert [run_order(["a", "b"], r) for r in range(4)] == [("a", "b"), ("b", "a"), ("b", "a"), ("a", "b")]
    orders = [run_order(["f", "w1", "w2"], r) for r in range(6)]
    assert orders[0] == ("f", "w1", "w2") and orders[1] == ("w2", "w1", "f")
    for name in ("f", "w1", "w2"):  # over three pairs of rounds each server takes every place
        assert {order.index(name) for order in orders} == {0, 1, 2}


def test_targets_text_three_floors_image_one_and_a_half_floor_plus_decode():
    assert cpu_budget_ms("text", 0.2, None) == (pytest.approx(0.6), "3 x floor")
    limit_ms, _ = cpu_budget_ms("image", 0.2, 1.0)
    assert limit_ms == pytest.approx(1.8)
    assert cpu_budget_ms("image", 0.2, None) is None and cpu_budget_ms("fusion", 0.2, 1.0) is None


def test_table_verdicts_and_workers_speedup():
    pooled = [Pooled(FLOOR, "text", 0.2, 5000, 0.9, 0), Pooled("mmserve w1", "text", 0.59, 600, 0.9, 0),
              Pooled("mmserve w2", "text", 0.7, 900, 1.5, 0),
              Pooled(FLOOR, "image", 0.2, 4000, 0.9, 0), Pooled("mmserve w1", "image", 1.9, 300, 0.9, 0)]
    rows = {(row[0], row[1]): row for row in table_rows(pooled, decode_alone_ms=1.0)[1:]}
    assert rows[("text", "mmserve w1")][5:9] == ["2.95", "0.600", "3 x floor", "met"]
    assert rows[("text", "mmserve w2")][8] == "missed"
    assert rows[("image", "mmserve w1")][6:9] == ["1.800", "1.5 x (floor + decode)", "missed"]
    assert rows[("text", FLOOR)][5:9] == ["", "", "", ""]
    assert workers_speedup(pooled, "mmserve w1", "mmserve w2") == pytest.approx(1.5)
    assert workers_speedup(pooled, "mmserve w1", "mmserve w3") is None


def test_the_floor_answers_each_body_with_its_kind():
    bodies = request_bodies(photo_like_jpeg(224, 224))
    assert answer_kind("/v1/embeddings", json.loads(bodies["text"])) == "text"
    assert answer_kind("/v1/embeddings", json.loads(bodies["image"])) == "image"
    assert answer_kind("/v1/infer", json.loads(bodies["fusion"])) == "fusion"
    assert answer_kind("/v1/embeddings", {"input": ["data:image/png;base64,AAAA"]}) == "image"
    assert json.loads(bodies["image"])["input"].startswith("data:image/jpeg;base64,/9j/")  # a JPEG's magic


def test_a_server_of_several_processes_gets_its_cpu_split_by_process_pooled_over_runs():
    from benchmarks.frontend_measure import process_split_rows

    split = (("supervisor", 0.1), ("engine_process", 2.0), ("api_process", 6.0))
    runs = [RunResult("mmserve w2", "text", 8.1, 10.0, 4000, 0, split),
            RunResult("mmserve w2", "text", 8.1, 10.0, 6000, 0, split),
            RunResult("mmserve w1", "text", 9.0, 10.0, 8000, 0, (("one process", 9.0),)),
            RunResult(FLOOR, "text", 1.0, 10.0, 8000, 0, (("one process", 1.0),))]
    rows = process_split_rows(runs)
    assert rows[0] == ["kind", "server", "process", "CPU ms/req", "cores"]
    assert rows[1:] == [["text", "mmserve w2", "supervisor", "0.020", "0.01"],
                        ["text", "mmserve w2", "engine_process", "0.400", "0.20"],
                        ["text", "mmserve w2", "api_process", "1.200", "0.60"],
                        ["text", "mmserve w1", "one process", "1.125", "0.90"]]


def test_the_capacity_table_takes_the_engine_as_the_serial_part():
    from benchmarks.frontend_measure import capacity_rows

    runs = [RunResult("mmserve w2", "text", 8.0, 10.0, 10_000, 0,
                      (("supervisor", 0.1), ("engine_process", 0.5), ("engine_process main thread", 0.3),
                       ("api_process", 2.0))),
            RunResult("mmserve w2", "image", 8.0, 10.0, 1000, 0,
                      (("supervisor", 0.0), ("engine_process", 0.2), ("api_process", 0.9))),
            RunResult("mmserve w1", "text", 9.0, 10.0, 8000, 0, (("one process", 9.0),))]  # no engine of its own
    rows = capacity_rows(runs, {"text": 0.1, "image": 0.25})
    assert rows[0][:3] == ["kind", "server", "engine ms/req"]
    # text: 0.05 ms per request in the engine, 0.5 x the floor's 0.1: 20,000/s on one engine core, which
    # needs 20,000 x 0.2 ms = 4 API-process cores; of its 0.05 ms, 0.03 in its main thread (the event loop)
    assert rows[1] == ["text", "mmserve w2", "0.050", "0.50", "<= 0.6 x floor", "met", "20000", "0.200", "4.00",
                       "0.010", "0.030", "0.020"]
    assert rows[2][:6] == ["image", "mmserve w2", "0.200", "0.80", "<= 1 x floor", "met"]
    assert rows[2][6:9] == ["5000", "0.900", "4.50"]
    assert rows[2][10:] == ["", ""]  # a run whose threads were not read splits nothing
    assert len(rows) == 3
    assert capacity_rows(runs, {"text": 0.08})[1][3:6] == ["0.62", "<= 0.6 x floor", "missed"]


def test_the_headline_figures_are_read_off_the_printed_tables():
    from benchmarks.frontend_measure import headline_figures

    table = [["kind", "server", "answered/s", "CPU ms/req", "cores", "x floor"],
             ["text", "floor", "1786", "0.158", "0.28", ""], ["text", "mmserve w1", "577", "0.606", "0.35", "3.85"],
             ["image", "mmserve w1", "128", "2.342", "0.30", "12.32"]]
    capacity = [["kind", "server", "engine ms/req", "x floor", "target", "verdict", "engine/s/core"],
                ["text", "mmserve w2", "0.295", "1.87", "", "", "3391"], ["text", "base w2", "0.393", "", "", "", "2547"]]
    figures = {(figure.row, figure.name): (figure.value, figure.unit) for figure in headline_figures(table, capacity)}
    assert figures == {("cpu_vs_floor", "text, one process, x floor"): (3.85, ""),
                       ("cpu_vs_floor", "image, one process, x floor"): (12.32, ""),
                       ("cpu_vs_floor", "text CPU ms/req (floor 0.158)"): (0.606, ""),
                       ("engine_capacity", "text, engine ms/req"): (0.295, ""),
                       ("engine_capacity", "texts per engine core"): (3391, "/s")}
