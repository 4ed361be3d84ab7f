"""The pure parts of the mmserve-vs-Infinity benchmark: bodies, cosines, start-up failures, tables, verdicts.

The benchmark itself runs servers and is not a test; these hold its
arithmetic and its requests to what the table claims.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.harness import (
    AlternationPlan, ServerRuns, Targets, abba_order, format_comparison, run_orders, verdicts,
)
from benchmarks.embedding_agreement import AgreementRow, failure_reason, format_agreement_table
from benchmarks.loadgen.config import BenchConfig, RunMode
from benchmarks.loadgen.embeddings_payload import (
    EmbeddingsBodyBuilder, EmbeddingsDialect, data_uri, image_body, text_body,
)
from benchmarks.loadgen.errors import ConfigError
from benchmarks.loadgen.image_pool import ImageFormat, ImagePool, ImageSize
from benchmarks.loadgen.request_spec import Modality, RequestSpec
from benchmarks.loadgen.runner import Sample
from benchmarks.loadgen.text_source import TextSource
from benchmarks.loadgen.workload import parse_mix
from benchmarks.reference_embeddings import min_cosine

INFINITY = EmbeddingsDialect("clip", is_image_modality_marked=True)
MMSERVE = EmbeddingsDialect("tiny-clip", is_image_modality_marked=False)


def test_an_image_body_is_one_data_uri_and_only_infinitys_says_modality():
    uri = data_uri(b"iVBORw0KGgo=", ImageFormat.PNG)
    assert json.loads(image_body(INFINITY, uri)) == {
        "model": "clip", "input": ["data:image/png;base64,iVBORw0KGgo="], "modality": "image"}
    assert json.loads(image_body(MMSERVE, uri)) == {
        "model": "tiny-clip", "input": ["data:image/png;base64,iVBORw0KGgo="]}
    assert json.loads(image_body(EmbeddingsDialect(), uri)) == {"input": ["data:image/png;base64,iVBORw0KGgo="]}


def test_a_text_body_is_one_input_in_either_dialect():
    assert json.loads(text_body(INFINITY, "一只猫 \"quoted\"")) == {"model": "clip", "input": ["一只猫 \"quoted\""]}
    assert json.loads(text_body(MMSERVE, "a cat")) == {"model": "tiny-clip", "input": ["a cat"]}


def test_the_builder_posts_to_v1_embeddings_and_refuses_fusion():
    pool = ImagePool(0, ImageSize(8, 8), ImageFormat.JPEG)
    pool.prepare([0])
    builder = EmbeddingsBodyBuilder(pool, TextSource(0), INFINITY, ImageFormat.JPEG)
    assert builder.path == "/v1/embeddings"
    body = json.loads(builder.build(RequestSpec(Modality.VISION, image_key=0)))
    assert body["input"][0].startswith("data:image/jpeg;base64,") and body["modality"] == "image"
    assert len(json.loads(builder.build(RequestSpec(Modality.TEXT, num_text_chars=20)))["input"][0]) == 20
    with pytest.raises(ValueError, match="fusion"):
        builder.build(RequestSpec(Modality.FUSION, image_key=0, num_text_chars=5))


def test_a_run_of_embeddings_bodies_cannot_mix_in_fusion():
    with pytest.raises(ConfigError, match="fusion"):
        BenchConfig(url="http://127.0.0.1:1", mode=RunMode.CLOSED, duration_s=1.0, concurrency=1,
                    embeddings=MMSERVE)
    BenchConfig(url="http://127.0.0.1:1", mode=RunMode.CLOSED, duration_s=1.0, concurrency=1,
                mix=parse_mix("text:1"), embeddings=MMSERVE)


def test_min_cosine_ignores_scale_and_takes_the_worst_pair():
    want = [np.array([1.0, 0.0]), np.array([0.0, 1.0])]
    assert min_cosine([np.array([3.0, 0.0]), np.array([0.0, 0.5])], want) == pytest.approx(1.0)
    assert min_cosine([np.array([1.0, 0.0]), np.array([1.0, 1.0])], want) == pytest.approx(2 ** -0.5)
    assert min_cosine([np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0])], want) == float("-inf")  # wrong size
    with pytest.raises(ValueError):
        min_cosine([np.array([1.0, 0.0])], want)


def test_a_failed_start_up_is_told_by_its_exception_line():
    tail = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
            "OSError: /tmp/m does not appear to have a file named config.json.\n"
            "ERROR:    Application startup failed. Exiting.\n")
    assert failure_reason(tail) == "OSError: /tmp/m does not appear to have a file named config.json."
    assert failure_reason("ImportError: \nSiglipTokenizer requires the protobuf library\nERROR: failed.\n") == (
        "ImportError: SiglipTokenizer requires the protobuf library")
    assert failure_reason("just one line\n\n") == "just one line"
    assert failure_reason("") == "(no output)"
    assert len(failure_reason("ValueError: " + "x" * 500)) == 160


def test_the_agreement_table_says_met_not_met_and_cannot_serve():
    rows = [AgreementRow("clip", "mmserve", 0.999999, 1.0, (1.0, 1.0)),
            AgreementRow("siglip", "infinity", 0.999999, 0.93, (0.95, 1.0)),
            AgreementRow("open_clip", "infinity", failure="did not start: OSError: no config.json")]
    table = format_agreement_table(rows, num_images=3, num_texts=4)
    lines = table.splitlines()
    assert "3 images and 4 texts" in lines[0]
    assert lines[2].split()[-1] == "met" and lines[2].split()[-2] == "1.000"
    assert lines[3].endswith("NOT met") and "0.950-1.000" in lines[3]
    assert lines[4].endswith("cannot serve")
    assert lines[-1] == "  infinity on open_clip: did not start: OSError: no config.json"


def _runs(throughput_rps: float, latencies_s: list[float]) -> ServerRuns:
    runs = ServerRuns(throughputs_rps=[throughput_rps], saturation_other_cpus=[0.0], other_cpus=[0.0, 0.5])
    runs.open_samples = [Sample(Modality.TEXT, "text", 0.0, 0.0, latency, 200, "ok") for latency in latencies_s]
    runs.open_num_sent = runs.open_num_ok = len(latencies_s)
    return runs


def test_verdicts_are_ratios_of_ours_to_the_peers_against_the_targets():
    runs = {"infinity": _runs(100.0, [0.2] * 100), "mmserve": _runs(250.0, [0.05] * 100)}
    judged = verdicts(runs["infinity"], runs["mmserve"], Targets(2.0, 0.5))
    assert judged.throughput_ratio == pytest.approx(2.5) and judged.is_throughput_met
    assert judged.p99_ratio == pytest.approx(0.25) and judged.is_p99_met
    assert not verdicts(runs["infinity"], runs["mmserve"], Targets(3.0, 0.1)).is_throughput_met
    table = format_comparison("clip, text only", runs, "infinity", "mmserve", AlternationPlan(8.0, 2, 1.0, 16),
                              Targets(2.0, 0.5), num_cpus=2, ratio_label="mm/inf")
    lines = table.splitlines()
    assert lines[0].startswith("clip, text only: 8 s per run; saturation runs infinity, mmserve, mmserve, infinity")
    assert lines[1].split() == ["metric", "infinity", "mmserve", "mm/inf", "target", "verdict"]
    assert lines[2].split()[-6:] == ["100.0", "250.0", "2.50", ">=", "2.00", "met"]
    assert "70.0 req/s" in lines[4] and "<= 0.50" in lines[5] and lines[5].endswith(" met")


def test_rounds_mirror_their_order():
    assert [abba_order(i, "a", "b") for i in range(3)] == [("a", "b"), ("b", "a"), ("a", "b")]
    assert run_orders(2, "a", "b") == (["a", "b", "b", "a"], ["b", "a", "a", "b"])
