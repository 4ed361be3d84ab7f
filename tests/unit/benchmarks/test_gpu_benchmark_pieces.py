"""The GPU benchmark's CPU-checkable pieces: the KServe body it sends, the wrk summary it reads, its images.

The body is decoded by the server's own codec, so what wrk sends is a request
the server accepts; the served smoke test runs the whole path (mmserve serve
on the CPU, wrk, the summary) for two seconds on a tiny SigLIP.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from benchmarks.gpu.served import (
    Server, WrkResult, kserve_uint8_body, metric_sum, metric_value, parse_wrk, post_image_embeddings, run_wrk,
    scrape, start_server,
)
from benchmarks.gpu.siglip_large import jpeg_bytes, random_images
from benchmarks.random_pretrained import write_siglip
from server.protocols.kserve_v2_codec import decode_infer_request
from tests.conftest import find_wrk_binary

pytestmark = pytest.mark.long  # minutes together: started first (tests/conftest.py)


@pytest.fixture(scope="module")
def siglip_dir(tmp_path_factory) -> Path:
    """One tiny SigLIP for the module's servers (each only reads it)."""
    return write_siglip(tmp_path_factory.mktemp("gpu-pieces") / "tiny-siglip")


@pytest.fixture(scope="module")
def siglip_server(siglip_dir: Path) -> Iterator[Server]:
    """``mmserve serve`` of the tiny SigLIP on the CPU as the benchmark starts it, shared by the tests that only
    send it requests (wrk's run, the decode check: it counts decoded images as a difference across its call)."""
    server = start_server(siglip_dir, {"MMSERVE_VISION_MAX_BATCH_SIZE": "4"}, ready_timeout_s=120, device="cpu")
    try:
        yield server
    finally:
        server.stop()


def test_the_uint8_body_is_a_request_the_server_decodes_to_the_same_pixels():
    images = random_images(3, 16, seed=1)
    body = kserve_uint8_body(images)
    request = decode_infer_request(body.body, str(body.header_length))
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tuple(tensor.shape)) == ("image_uint8", "UINT8", (3, 16, 16, 3))
    np.testing.assert_array_equal(tensor.data, images)
    assert [o.name for o in request.outputs] == ["image_embedding"] and request.outputs[0].is_binary
    with pytest.raises(ValueError):
        kserve_uint8_body(images.astype(np.float32))


def test_the_wrk_summary_gives_images_per_second():
    line = "Running...\nMMSERVE_WRK requests=600 non2xx=2 socket_errors=1 duration_us=15000000 p50_us=4200 p99_us=9100\n"
    result = parse_wrk(line)
    assert result == WrkResult(600, 2, 1, 15.0, 4.2, 9.1)
    assert result.images_per_s(rows_per_request=8) == pytest.approx(320.0)
    with pytest.raises(ValueError, match="no wrk summary"):
        parse_wrk("connection refused")


def test_metric_sum_adds_every_label_set_and_tells_absent_from_zero():
    exposition = ('# HELP mmserve_cold_compiles_total x\nmmserve_cold_compiles_total{kind="shape"} 0.0\n'
                  'mmserve_cold_compiles_total{kind="triton_kernel"} 2.0\nmmserve_cold_compiles_totalx 5\n')
    assert metric_sum(exposition, "mmserve_cold_compiles_total") == 2.0
    assert metric_sum(exposition, "mmserve_device_memory_bytes") is None


def test_images_are_distinct_and_jpegs_decode():
    images = random_images(4, 64, seed=2)
    assert images.shape == (4, 64, 64, 3) and images.dtype == np.uint8
    assert len({image.tobytes() for image in images}) == 4
    assert all(data[:3] == b"\xff\xd8\xff" for data in jpeg_bytes(images))


def test_the_served_path_runs_end_to_end_on_a_tiny_model(siglip_dir: Path, siglip_server: Server):
    wrk = find_wrk_binary()
    body = kserve_uint8_body(random_images(2, 32, seed=3))
    result = run_wrk(wrk, siglip_server.url, str(siglip_dir), body, connections=2, duration_s=2, threads=1)
    exposition = scrape(siglip_server.url)
    assert result.num_requests > 0 and result.num_non_2xx == 0 and result.num_socket_errors == 0
    assert metric_sum(exposition, "mmserve_cold_compiles_total") in (None, 0.0)
    assert metric_sum(exposition, "mmserve_device_memory_bytes") is None  # the CPU has no device series


def test_metric_value_reads_one_labelled_series():
    exposition = ('mmserve_device_decode_images_total{outcome="decoded"} 8.0\n'
                  'mmserve_device_decode_images_total{outcome="left_to_cpu"} 1.0\n')
    assert metric_value(exposition, 'mmserve_device_decode_images_total{outcome="decoded"}') == 8.0
    assert metric_value(exposition, 'mmserve_device_decode_images_total{outcome="left_to_cpu"}') == 1.0
    assert metric_value(exposition, 'mmserve_device_decode_images_total{outcome="other"}') is None


def test_the_served_decode_check_fails_a_server_that_did_not_decode_on_the_device(siglip_dir: Path,
                                                                                   siglip_server: Server):
    """A CPU-decoding tiny SigLIP: the embeddings match the in-process Pillow reference, the device count does not.

    So on the GPU the check passes only when the server's own intake took the
    nvJPEG path and answered within the bound.
    """
    import torch

    from benchmarks.gpu.report import Report
    from benchmarks.gpu.real_model import MIN_COSINE_DECODE, DecodeReference, served_decode
    from models.families.pretrained import load_pretrained
    from models.jpeg_decode import cpu_decode_to_input

    model_dir = siglip_dir
    bundle = load_pretrained(str(model_dir), device="cpu", dtype="float32")
    encoded = jpeg_bytes(random_images(3, 48, seed=4))
    pixels = torch.from_numpy(np.stack([cpu_decode_to_input(data, bundle.config.preprocess) for data in encoded]))
    with torch.no_grad():
        reference = torch.stack([s.pooled for s in bundle.model.encode_images(pixels)]).float().numpy()
    served = post_image_embeddings(siglip_server.url, str(model_dir), encoded)
    report = Report()
    served_decode(report, siglip_server.url, str(model_dir), DecodeReference(encoded, reference))
    assert served.shape == reference.shape
    cosines = (served * reference).sum(1) / np.linalg.norm(served, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosines.min() >= MIN_COSINE_DECODE
    notes = [row.note for row in report.rows]
    assert notes[0].startswith("PASS") and notes[1].startswith("FAIL 0.000000 >= 3")
    assert report.num_failed_checks == 1


def test_the_several_device_part_runs_only_where_more_than_one_gpu_is_visible():
    from benchmarks.gpu.engines import engine_runs, skipped_line

    assert engine_runs(0) == [] and engine_runs(1) == []
    assert skipped_line(1) == ("several-device part skipped: this box has one GPU; it runs where more than one GPU "
                               "is visible")
    two = engine_runs(2)
    assert [(run.extra_args, run.num_engines) for run in two] == [((), 1), (("--devices", "cuda:0,cuda:1"), 2)]
    eight = engine_runs(8)
    assert eight[:2] == two and (eight[2].extra_args, eight[2].num_engines) == (("--engines", "auto"), 8)


def test_the_several_device_part_counts_batches_by_engine():
    from benchmarks.gpu.engines import batches_by_engine

    exposition = ('# TYPE mmserve_batch_size histogram\n'
                  'mmserve_batch_size_bucket{engine="0",lane="vision",le="1.0"} 2.0\n'
                  'mmserve_batch_size_count{engine="0",lane="vision"} 4.0\n'
                  'mmserve_batch_size_count{engine="1",lane="vision"} 3.0\n'
                  'mmserve_batch_size_count{engine="1",lane="text"} 1.0\n'
                  'mmserve_batch_size_count{lane="fusion"} 0.0\n')
    assert batches_by_engine(exposition) == {"-": 0.0, "0": 4.0, "1": 4.0}


def test_the_several_device_part_says_when_there_is_no_cuda(capsys, monkeypatch):
    import torch

    from benchmarks.gpu.engines import main
    from benchmarks.gpu.report import EXIT_NO_CUDA

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # whatever this machine has
    assert main([]) == EXIT_NO_CUDA
    assert "CUDA is not available" in capsys.readouterr().err


def test_the_several_device_part_serves_and_checks_two_engines_on_the_cpu(siglip_dir: Path):
    """The GPU script's own path (start, wait for every engine, wrk, the checks) with ``--devices cpu,cpu``."""
    from benchmarks.gpu.engines import EngineRun, parse_args, serve_each
    from benchmarks.gpu.report import Deadline, Report

    find_wrk_binary()
    model_dir = siglip_dir
    args = parse_args(["--batch-size", "4", "--rows-per-request", "2", "--connections", "2", "--duration-s", "2",
                       "--image-side", "32", "--dtype", "float32"])
    report = Report()
    runs = [EngineRun("1 engine", (), 1), EngineRun("2 CPU engines", ("--devices", "cpu,cpu"), 2)]
    serve_each(report, args, model_dir, runs, Deadline(600), device="cpu")
    assert report.num_failed_checks == 0, [row.note for row in report.rows]
    served = [row for row in report.rows if row.section == "engines"]
    assert [row.case for row in served] == ["1 engine", "2 CPU engines"]
    assert served[0].speedup == 1.0 and served[1].speedup > 0 and "4 in flight" in served[1].note
    (two_engines,) = [row.note for row in report.rows if row.case == "2 CPU engines every engine computed"]
    assert two_engines.startswith("PASS batches by engine {'0': ") and "'1': " in two_engines


def test_the_several_device_part_counts_the_engines_models_says_serve():
    from benchmarks.gpu.engines import serving_engines

    answer = {"data": [{"id": "m", "mmserve": {"engines": [{"engine": 0, "serving": True},
                                                             {"engine": 1, "serving": False}]}}]}
    assert serving_engines(answer) == 1
    assert serving_engines({"data": [{"id": "m"}]}) == 0
