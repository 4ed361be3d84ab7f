"""The benchmarks' runtime check: what ``--runtime`` should serve, and a server that serves something else stops them."""

import pytest

from benchmarks.served_runtime import (
    MmserveRuntime, RuntimeMismatchError, ServedRuntime, check_served, expected_runtime,
)
from benchmarks.startup import _phases, _row_label


def test_auto_means_onnx_runtime_on_the_cpu_and_torch_on_cuda():
    assert expected_runtime("auto", "cpu") == "onnxruntime"
    assert expected_runtime("auto", "cuda") == "torch"
    assert expected_runtime("torch", "cpu") == "torch"


def test_a_server_that_fell_back_to_torch_fails_the_check_naming_both():
    check_served(ServedRuntime("onnxruntime", "float32", "none", None), "auto", "cpu", None)
    with pytest.raises(RuntimeMismatchError, match="expected onnxruntime/none; the server says torch/none"):
        check_served(ServedRuntime("torch", "float32", "none", None), "auto", "cpu", None)
    with pytest.raises(RuntimeMismatchError, match="expected onnxruntime/int8"):
        check_served(ServedRuntime("onnxruntime", "float32", "none", None), "auto", "cpu", "int8")


def test_labels_and_settings_name_the_runtime_and_quantization():
    assert ServedRuntime("onnxruntime", "float32", "none", None).label() == "onnxruntime float32"
    assert ServedRuntime("onnxruntime", "float32", "int8", 0.99961).label() == "onnxruntime int8 (cosine 0.9996)"
    assert MmserveRuntime("auto", "int8", "cpu").settings({"MAX_BATCH_SIZE": "8"}) == {
        "MAX_BATCH_SIZE": "8", "RUNTIME": "auto", "QUANTIZE": "int8"}
    assert MmserveRuntime("torch", None, "cpu").settings({}) == {"RUNTIME": "torch"}


def test_startup_keeps_the_servers_onnx_and_warm_up_lines_only():
    log = ("2026-12-06 03:40:10,001 INFO server.runtime.runtime_choice: the towers run in ONNX Runtime (read from "
           "the export cache /c in 12.0 s; default intra-op threads each, no spinning)\n"
           "2026-12-06 03:40:11,001 INFO uvicorn.access: 127.0.0.1 - GET /health/ready 503\n"
           "2026-12-06 03:40:30,001 INFO router.worker: image executor: warm-up ran 40 shapes in 19.0 s\n")
    assert [line.split(": ", 1)[1] for line in _phases(log)] == [
        "the towers run in ONNX Runtime (read from the export cache /c in 12.0 s; default intra-op threads each, "
        "no spinning)", "image executor: warm-up ran 40 shapes in 19.0 s"]


def test_startup_names_a_start_by_the_cache_it_finds_not_the_way_it_was_asked():
    assert _row_label("torch", is_filled=False) == "torch"
    assert _row_label("cold", is_filled=False) == _row_label("warm", is_filled=False) == "ORT, cold export cache"
    assert _row_label("warm", is_filled=True) == "ORT, warm export cache"
    assert _row_label("cold", is_filled=True) == "ORT, cache already filled"


def test_startup_files_a_baseline_trees_starts_in_the_table_only():
    from benchmarks.startup import BASELINE, WAYS, Start, format_report

    runs = {("vit-l16", WAYS["warm"]): [Start(30.0, 20.0, ())],
            (f"vit-l16{BASELINE}", WAYS["warm"]): [Start(90.0, 60.0, ())]}
    report, figures = format_report(runs)
    assert f"vit-l16{BASELINE}" in report and "90.0" in report
    assert {(f.name, f.value) for f in figures} == {
        (f"{WAYS['warm']} (target <= 45 s, met)", 30.0), (f"CPU s to ready, {WAYS['warm']}", 20.0)}
