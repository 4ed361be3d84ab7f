"""Server CPU per answered request at saturation: pooled over runs, taken as a ratio, judged, shown, kept for next time.

Made-up runs with figures worked out by hand; ``benchmarks.real_models``'s
targets (text <= 0.6x Infinity's, images no worse than the previous run's
ratio) and the bodies wrk posts for it.
"""

from __future__ import annotations

import json

import pytest

from benchmarks.harness import (
    AlternationPlan, SaturationRun, ServerRuns, Targets, cpu_ratio, cpu_target_text, format_comparison,
    format_saturation, verdicts,
)
from benchmarks.harness.cpu_accounting import CpuSpent
from benchmarks.loadgen.embeddings_payload import EmbeddingsDialect
from benchmarks.loadgen.request_spec import Modality
from benchmarks.loadgen.runner import Sample
from benchmarks.loadgen.text_source import TextSource
from benchmarks.real_models import INFINITY_TEXT_TOKENS, LANES, TEXT_CHARS, WrkInputs
from benchmarks.real_models_figures import (
    figures_document, lane_figures, load_figures, previous_cpu_ratio, save_figures,
)

PLAN = AlternationPlan(8.0, 2, 1.0, 16)


def _saturated(runs: list[tuple[int, float, float]], latency_s: float = 0.1) -> ServerRuns:
    """``ServerRuns`` from (answers, server CPU s, wall s) per saturation run, and 100 open-loop samples."""
    server = ServerRuns()
    for num_ok, cpu_s, wall_s in runs:
        server.record_saturation(SaturationRun(num_ok, num_ok / wall_s, {}),
                                 CpuSpent(wall_s=wall_s, server_s=cpu_s, ours_s=cpu_s, machine_s=cpu_s))
    server.open_samples = [Sample(Modality.TEXT, "text", 0.0, 0.0, latency_s, 200, "ok") for _ in range(100)]
    server.open_num_sent = server.open_num_ok = 100
    return server


def test_cpu_per_answer_is_pooled_over_runs_not_averaged_run_by_run():
    server = _saturated([(1000, 2.0, 8.0), (3000, 3.0, 8.0)])
    assert server.cpu_ms_per_request == pytest.approx(1000.0 * 5.0 / 4000)  # 1.25, not the mean of 2.0 and 1.0
    assert server.server_cores == pytest.approx(5.0 / 16.0)
    assert server.throughputs_rps == [pytest.approx(125.0), pytest.approx(375.0)]
    assert server.saturation_other_cpus == [0.0, 0.0] and server.other_cpus == [0.0, 0.0]


def test_a_saturation_run_counts_its_errors_into_the_servers():
    server = ServerRuns()
    spent = CpuSpent(wall_s=1.0, server_s=0.5, ours_s=0.5, machine_s=0.5)
    server.record_saturation(SaturationRun(10, 10.0, {"non-2xx": 2}), spent)
    server.record_saturation(SaturationRun(10, 10.0, {"non-2xx": 1, "socket": 4}), spent)
    assert server.errors == {"non-2xx": 3, "socket": 4}


def test_the_cpu_ratio_is_ours_over_the_peers_and_needs_both():
    infinity, mmserve = _saturated([(1000, 8.9, 8.0)]), _saturated([(1000, 5.0, 8.0)])
    assert cpu_ratio(infinity, mmserve) == pytest.approx(5.0 / 8.9)
    assert cpu_ratio(ServerRuns(throughputs_rps=[1.0]), mmserve) is None


def test_text_cpu_target_is_met_at_or_under_0_65_of_infinitys():
    text = LANES[0].targets
    assert (text.min_throughput_ratio, text.max_cpu_ratio) == (1.6, 0.65)
    infinity = _saturated([(1000, 8.9, 8.0)])
    met = verdicts(infinity, _saturated([(1000, 5.3, 8.0)]), text)
    missed = verdicts(infinity, _saturated([(1000, 6.5, 8.0)]), text)  # 0.73x, an earlier run's
    assert met.cpu_ratio == pytest.approx(0.5955, abs=1e-4) and met.is_cpu_met is True
    assert missed.cpu_ratio == pytest.approx(0.7303, abs=1e-4) and missed.is_cpu_met is False


def test_the_image_cpu_target_is_half_of_infinitys():
    image = LANES[1].targets
    assert (image.min_throughput_ratio, image.max_cpu_ratio) == (2.0, 0.5)
    infinity = _saturated([(300, 6.0, 8.0)])
    assert verdicts(infinity, _saturated([(300, 2.9, 8.0)]), image).is_cpu_met is True
    assert verdicts(infinity, _saturated([(300, 3.1, 8.0)]), image).is_cpu_met is False
    assert verdicts(infinity, _saturated([(300, 5.1, 8.0)]), Targets(1.15, 0.7, 0.8)).is_cpu_met is False
    previous = figures_document({"clip": {"image": {"cpu_ratio": 0.8, "servers": {}}}}, "then")
    assert previous_cpu_ratio(previous, "clip", "image") == 0.8  # printed beside, no longer the bound


def test_cpu_target_cells_say_the_bound_and_where_it_comes_from():
    assert cpu_target_text(Targets(2.0, 0.5, 0.6)) == "<= 0.60"
    assert cpu_target_text(Targets(1.15, 0.7, 0.81, "previous run")) == "<= 0.81 (previous run)"
    assert cpu_target_text(Targets(1.15, 0.7, None, "previous run")) == "<= previous run (none)"
    assert cpu_target_text(Targets(1.15, 0.7)) == "-"


def test_the_comparison_table_has_the_cpu_row_with_its_target_and_verdict():
    runs = {"infinity": _saturated([(1000, 8.9, 8.0), (1000, 8.9, 8.0)], latency_s=0.2),
            "mmserve": _saturated([(2000, 10.0, 8.0), (2000, 10.0, 8.0)], latency_s=0.1)}
    table = format_comparison("clip, text only", runs, "infinity", "mmserve", PLAN, Targets(2.0, 0.5, 0.6),
                              num_cpus=2, ratio_label="mm/inf", generator="wrk -t1")
    lines = table.splitlines()
    assert lines[2].split()[:5] == ["saturation", "ok/s", "(wrk", "-t1,", "C=16)"]
    assert lines[2].split()[-6:] == ["125.0", "250.0", "2.00", ">=", "2.00", "met"]
    cpu_row = next(line for line in lines if "server CPU ms per answered request" in line)
    assert cpu_row.split()[-6:] == ["8.90", "5.00", "0.56", "<=", "0.60", "met"]
    cores_row = next(line for line in lines if "server CPUs busy" in line)
    assert cores_row.split()[-5:] == ["1.11", "1.25", "1.12", "-", "-"]
    assert "p50 ms" in lines[6] and "p99 ms" in lines[7] and lines[7].endswith(" met")  # after the CPU rows


def test_a_table_of_runs_without_cpu_keeps_its_rows():
    runs = {"peer": ServerRuns(throughputs_rps=[100.0], saturation_other_cpus=[0.0], other_cpus=[0.0]),
            "ours": ServerRuns(throughputs_rps=[200.0], saturation_other_cpus=[0.0], other_cpus=[0.0])}
    for server in runs.values():
        server.open_samples = [Sample(Modality.TEXT, "text", 0.0, 0.0, 0.1, 200, "ok")]
    table = format_comparison("t", runs, "peer", "ours", PLAN, Targets(1.0, 1.0, 0.6), 2, "r")
    assert "server CPU" not in table and len(table.splitlines()) == 10


def test_saturation_alone_shows_each_servers_answers_cpu_and_errors():
    mmserve = _saturated([(1000, 5.0, 8.0)])
    mmserve.count_errors({"socket": 2})
    lines = format_saturation("clip, text only, mmserve alone", {"mmserve": mmserve}, PLAN, "wrk -t1").splitlines()
    assert lines[0] == "clip, text only, mmserve alone: 8 s per run, 2 rounds (each server's runs pooled)"
    assert lines[2].split()[-1] == "125.0"
    assert lines[3].split()[-1] == "5.00" and lines[4].split()[-1] == "0.62"
    assert lines[-1].split()[-2:] == ["socket", "2"]


def test_figures_are_kept_per_family_and_lane_and_read_back(tmp_path):
    runs = {"infinity": _saturated([(1000, 8.9, 8.0)]), "mmserve": _saturated([(1000, 6.5, 8.0)])}
    figures = lane_figures(runs, "infinity", "mmserve")
    assert figures["cpu_ratio"] == pytest.approx(0.7303, abs=1e-4)
    assert figures["servers"]["mmserve"] == {"cpu_ms_per_request": 6.5, "ok_rps": 125.0}
    assert lane_figures({"mmserve": runs["mmserve"]}, None, "mmserve")["cpu_ratio"] is None
    path = tmp_path / "figures.json"
    save_figures(path, figures_document({"clip": {"image": figures}}, "2026-12-03 12:30 UTC"))
    document = load_figures(path)
    assert json.loads(path.read_text())["saved"] == "2026-12-03 12:30 UTC"
    assert previous_cpu_ratio(document, "clip", "image") == pytest.approx(0.7303, abs=1e-4)
    assert previous_cpu_ratio(document, "clip", "text") is None
    assert previous_cpu_ratio(None, "clip", "image") is None
    headline = {(figure["row"], figure["name"]): figure["value"] for figure in document["figures"]}
    assert headline == {("infinity_image", "saturation ok/s over Infinity's"): 1.0,
                        ("infinity_image", "server CPU per answer over Infinity's"): 0.73,
                        ("infinity_image", "open-loop p99 over Infinity's"): 1.0}
    assert load_figures(None) is None
    with pytest.raises(FileNotFoundError):
        load_figures(tmp_path / "missing.json")


def test_the_headline_figures_name_what_served_and_are_judged_as_the_verdict_lines():
    """A --quantize run keeps to its own row, so its figures never stand in for the fp32 targets' rows."""
    lanes = {"served": "onnxruntime float32",
             "text": {"throughput_ratio": 2.1869, "cpu_ratio": 0.6501, "p99_ratio": 0.383},
             "image": {"throughput_ratio": 1.4158, "cpu_ratio": 0.4999, "p99_ratio": 0.4688, "torch_cpu_ratio": 0.99}}
    targets = {lane.name: lane.targets for lane in LANES}
    fp32 = figures_document({"clip": lanes}, "now", targets=targets, torch_target=0.55)["figures"]
    assert [(f["row"], f["name"], f["value"]) for f in fp32] == [
        ("infinity_text", "onnxruntime float32, saturation ok/s over Infinity's (target >= 1.60, met)", 2.19),
        ("infinity_text", "server CPU per answer over Infinity's (target <= 0.65, NOT met)", 0.65),  # 0.6501
        ("infinity_text", "open-loop p99 over Infinity's (target <= 0.50, met)", 0.38),
        ("infinity_image", "onnxruntime float32, saturation ok/s over Infinity's (target >= 2.00, NOT met)", 1.42),
        ("infinity_image", "server CPU per answer over Infinity's (target <= 0.50, met)", 0.5),
        ("infinity_image", "open-loop p99 over Infinity's (target <= 0.70, met)", 0.47),
        ("infinity_image", "CPU per answer over mmserve's on torch (target <= 0.55, NOT met)", 0.99)]
    int8 = figures_document({"clip": {**lanes, "served": "onnxruntime int8"}}, "now", targets=targets,
                            is_quantized=True)["figures"]
    assert {f["row"] for f in int8} == {"infinity_int8"}
    assert int8[0]["name"] == "text, onnxruntime int8, saturation ok/s over Infinity's (target >= 1.60, met)"
    assert int8[3]["name"].startswith("images, onnxruntime int8, saturation") and int8[4]["name"].startswith("images, ")


def test_wrk_posts_the_same_inputs_to_both_servers_each_in_its_dialect():
    inputs = WrkInputs()
    infinity, mmserve = EmbeddingsDialect("clip", True), EmbeddingsDialect("tiny-clip", False)
    texts = [json.loads(body) for body in inputs.bodies("text", mmserve)]
    assert len(texts) == 64 and len({text["input"][0] for text in texts}) == 64
    assert all(TEXT_CHARS.min_chars <= len(text["input"][0]) <= TEXT_CHARS.max_chars for text in texts)
    assert [json.loads(body)["input"] for body in inputs.bodies("text", infinity)] == [t["input"] for t in texts]
    images = [json.loads(body) for body in inputs.bodies("image", infinity)]
    assert len(images) == 100 and all(image["modality"] == "image" and image["model"] == "clip" for image in images)
    assert images[0]["input"][0].startswith("data:image/jpeg;base64,/9j/")
    mm_images = [json.loads(body) for body in inputs.bodies("image", mmserve)]
    assert "modality" not in mm_images[0] and [i["input"] for i in mm_images] == [i["input"] for i in images]


def test_a_wrk_runs_log_line_shows_mmserves_mean_batch_per_lane_and_nothing_for_a_peer():
    from benchmarks.harness.alternation import mean_batch_text
    from benchmarks.loadgen.server_metrics import batch_size_view, parse_metrics_text

    def exposition(num_batches: int, num_texts: int) -> str:
        return ("# TYPE mmserve_batch_size histogram\n"
                f'mmserve_batch_size_bucket{{lane="text",le="8.0"}} {num_batches}\n'
                f'mmserve_batch_size_bucket{{lane="text",le="+Inf"}} {num_batches}\n'
                f'mmserve_batch_size_count{{lane="text"}} {num_batches}\n'
                f'mmserve_batch_size_sum{{lane="text"}} {num_texts}\n')

    before, after = parse_metrics_text(exposition(10, 40)), parse_metrics_text(exposition(110, 610))
    assert mean_batch_text(batch_size_view(before, after)) == "; mean batch: text 5.7"  # 570 texts in 100 batches
    assert mean_batch_text(batch_size_view(None, parse_metrics_text("up 1\n"))) == ""
    assert mean_batch_text(None) == ""


def test_every_timed_text_fits_infinitys_cut_so_both_servers_compute_the_same_tokens(tmp_path):
    """Infinity computes at most 20 tokens of a text; a longer one would cost mmserve more for the whole text."""
    from transformers import CLIPTokenizer

    from benchmarks.random_pretrained import write_clip

    tokenizer = CLIPTokenizer.from_pretrained(str(write_clip(tmp_path / "clip")))
    texts = WrkInputs().texts + [TextSource(1).make(TEXT_CHARS.max_chars) for _ in range(32)]
    lengths = [len(tokenizer(text)["input_ids"]) for text in texts]
    assert max(lengths) <= INFINITY_TEXT_TOKENS, max(lengths)
    assert min(lengths) >= 8  # still texts: a serial number and a word or more
