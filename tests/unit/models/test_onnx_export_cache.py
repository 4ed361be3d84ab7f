"""The export cache: a broken or foreign entry is found and replaced, a graph that disagrees with torch never serves,
and a model whose towers will not export says why.

Real exports of the tiny preset into per-test cache directories (not the run's shared one: these tests break them).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import time
from pathlib import Path

import pytest
import torch

from models.errors import OnnxExportError
from models.loading.repository import build_preset
from models.onnx import export_cache
from models.onnx.export_cache import MANIFEST_FILE, ExportCache, ExportKey
from models.onnx.session import OnnxForward
from models.onnx.towers import OnnxPlan, export_key, probe_mismatch, serve_towers_from_onnx
from models.vision import VisionEncoder


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """The tiny preset's graphs, exported once for this module; tests copy the cache before breaking it."""
    root = tmp_path_factory.mktemp("export-cache")
    bundle = build_preset("tiny", seed=0)
    towers = serve_towers_from_onnx(bundle.model, bundle.fingerprint, OnnxPlan(cache_dir=root))
    assert towers.is_exported and towers.directory.parent == root
    return root


def _copy(exported: Path, tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    shutil.copytree(exported, root)
    return root


def test_an_entry_is_read_back_without_exporting(exported: Path, tmp_path: Path):
    root = _copy(exported, tmp_path)
    bundle = build_preset("tiny", seed=0)
    towers = serve_towers_from_onnx(bundle.model, bundle.fingerprint, OnnxPlan(cache_dir=root))
    assert not towers.is_exported
    assert bundle.model.runtime == "onnxruntime" and isinstance(bundle.model.vision.graph, OnnxForward)
    assert bundle.model.max_intra_op_threads == 1  # torch only normalises and fuses beside the sessions


def test_a_corrupt_graph_is_detected_removed_and_exported_again(exported: Path, tmp_path: Path, caplog):
    root = _copy(exported, tmp_path)
    bundle = build_preset("tiny", seed=0)
    key = export_key(bundle.fingerprint)
    weights = ExportCache(root).entry_dir(key) / "vision.onnx.data"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the weights: still loads, computes something else
    weights.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="models.onnx.export_cache"):
        towers = serve_towers_from_onnx(bundle.model, bundle.fingerprint, OnnxPlan(cache_dir=root))
    assert "vision.onnx.data does not have the digest the manifest names" in caplog.text
    assert towers.is_exported and bundle.model.runtime == "onnxruntime"
    assert ExportCache(root).lookup(key).directory == towers.directory  # whole again


def test_a_half_written_entry_is_never_read(exported: Path, tmp_path: Path):
    root = _copy(exported, tmp_path)
    bundle = build_preset("tiny", seed=0)
    entry = ExportCache(root).entry_dir(export_key(bundle.fingerprint))
    (entry / MANIFEST_FILE).unlink()  # a copy cut short before its manifest
    found = ExportCache(root).lookup(export_key(bundle.fingerprint))
    assert found.directory is None and "no readable manifest.json" in found.reason
    assert not entry.exists()


def test_a_stale_graph_with_a_consistent_manifest_fails_the_probe_check_and_is_exported_again(
        exported: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture):
    root = _copy(exported, tmp_path)
    other = build_preset("tiny", seed=1)  # other weights, same shapes: the tiny graphs load and run for it
    key = export_key(other.fingerprint)
    stale = ExportCache(root).entry_dir(key)
    shutil.copytree(ExportCache(root).entry_dir(export_key(build_preset("tiny", seed=0).fingerprint)), stale)
    manifest = json.loads((stale / MANIFEST_FILE).read_text())
    manifest["key"]["fingerprint"] = other.fingerprint  # as if written for this model: only the check can tell
    (stale / MANIFEST_FILE).write_text(json.dumps(manifest))
    with caplog.at_level("WARNING", logger="models.onnx.towers"):
        towers = serve_towers_from_onnx(other.model, other.fingerprint, OnnxPlan(cache_dir=root))
    assert towers.is_exported and other.model.runtime == "onnxruntime", "exported again in the same start"
    assert [record.message for record in caplog.records
            if "do not compute what torch computes" in record.message and "exporting them again" in record.message]
    assert probe_mismatch(other.model, other.model.vision.graph, other.model.text.graph) is None


def test_a_graph_onnx_runtime_cannot_run_on_the_probes_is_a_mismatch_not_a_crash():
    bundle = build_preset("tiny", seed=0)

    def refuses(*inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input: pixels")

    mismatch = probe_mismatch(bundle.model, refuses, refuses)  # type: ignore[arg-type]
    assert mismatch is not None and mismatch.startswith("ONNX Runtime cannot run the vision graph")
    assert "INVALID_ARGUMENT" in mismatch


class _BranchingVision(VisionEncoder):
    """A ViT whose forward branches in Python on a pixel's value: torch runs it, no graph can hold it."""

    def features(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, pooled = super().features(pixels)
        if float(pixels[0, 0, 0, 0]) > 2.0:  # never true for normalised pixels; the exporter cannot know
            pooled = -pooled
        return tokens, pooled


def unexportable_tiny():
    """The tiny preset with ``_BranchingVision`` as its image tower (same weights)."""
    bundle = build_preset("tiny", seed=0)
    model = bundle.model
    branching = _BranchingVision(model.config.vision, model.config.preprocess, model.vision.backbone)
    model.vision = branching
    return bundle


def test_a_tower_that_cannot_export_raises_the_reason_and_leaves_torch_serving(tmp_path: Path):
    bundle = unexportable_tiny()
    with pytest.raises(OnnxExportError, match="torch.onnx.export failed for the vision tower"):
        serve_towers_from_onnx(bundle.model, bundle.fingerprint, OnnxPlan(cache_dir=tmp_path / "cache"))
    assert bundle.model.runtime == "torch" and bundle.model.vision.graph is None
    assert not any(path.name.startswith(".tmp-") for path in (tmp_path / "cache").iterdir())  # nothing left


def test_processes_exporting_one_key_take_turns_so_it_is_exported_once(tmp_path: Path):
    """``exporting`` is an ``flock``: a second holder (here a thread with its own open file, as another engine
    process has) waits until the first published the entry, then finds it instead of exporting again."""
    import threading

    cache = ExportCache(tmp_path / "cache")
    key = ExportKey(fingerprint="fp", runtime="onnxruntime", exporter="torch 2", onnxruntime="1", opset=18,
                    quantization="none")
    exports: list[str] = []

    def start(name: str) -> None:
        with cache.exporting(key):
            if cache.lookup(key).directory is None:
                exports.append(name)
                cache.store(key, lambda directory: (directory / "vision.onnx").write_bytes(b"graph"))

    with cache.exporting(key):
        second = threading.Thread(target=start, args=("second",))
        second.start()
        second.join(0.3)
        assert second.is_alive(), "the second waits while the first holds the key"
        exports.append("first")
        cache.store(key, lambda directory: (directory / "vision.onnx").write_bytes(b"graph"))
    second.join(10)
    assert exports == ["first"]


_KEY = ExportKey(fingerprint="fp", runtime="onnxruntime", exporter="torch 2", onnxruntime="1", opset=18,
                 quantization="none")


def _write_graph(directory: Path) -> None:
    (directory / "vision.onnx").write_bytes(b"graph")


@pytest.mark.parametrize("where", ["a regular file", "under a regular file"])
def test_a_cache_directory_the_os_refuses_raises_one_line_naming_the_setting(tmp_path: Path, where: str):
    """A file where the directory should be: root cannot write there either (ENOTDIR / EEXIST), unlike a chmod."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    root = blocker if where == "a regular file" else blocker / "onnx"
    with pytest.raises(OnnxExportError) as raised:
        ExportCache(root).store(_KEY, _write_graph)
    message = str(raised.value)
    assert str(root) in message and "--export-cache-dir" in message and "\n" not in message
    assert ("File exists" if where == "a regular file" else "Not a directory") in message
    with pytest.raises(OnnxExportError, match="--export-cache-dir"):  # /proc: read-only to root as well
        ExportCache(Path("/proc/mmserve-export-cache")).store(_KEY, _write_graph)


@pytest.mark.parametrize("where", ["a regular file", "under a regular file", "/proc"])
def test_check_writable_refuses_what_store_would_in_the_same_words(tmp_path: Path, where: str):
    """The check ``mmserve serve --runtime onnxruntime`` makes before loading: the refusal ``store`` makes later."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    root = {"a regular file": blocker, "under a regular file": blocker / "onnx",
            "/proc": Path("/proc/mmserve-export-cache")}[where]
    with pytest.raises(OnnxExportError) as checked:
        ExportCache(root).check_writable()
    with pytest.raises(OnnxExportError) as stored:
        ExportCache(root).store(_KEY, _write_graph)
    assert str(checked.value) == str(stored.value)


def test_check_writable_creates_the_cache_and_leaves_nothing_in_it(tmp_path: Path):
    root = tmp_path / "a" / "b" / "onnx"
    ExportCache(root).check_writable()
    assert root.is_dir() and not any(root.iterdir())


def test_a_published_entry_has_the_modes_the_umask_gives_not_0700(tmp_path: Path):
    """Filled by root at image build, read by the server's user: the entry and its files as mkdir and open make them,
    even a file its writer made with mkstemp (0600, as the int8 quantizer does)."""
    import tempfile

    def write(directory: Path) -> None:
        _write_graph(directory)
        handle, name = tempfile.mkstemp(dir=directory)
        os.close(handle)
        os.replace(name, directory / "text.onnx")

    previous = os.umask(0o022)
    try:
        entry = ExportCache(tmp_path / "cache").store(_KEY, write)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(entry.stat().st_mode) == 0o755
    assert {path.name: stat.S_IMODE(path.stat().st_mode) for path in entry.iterdir()} == {
        "vision.onnx": 0o644, "text.onnx": 0o644, MANIFEST_FILE: 0o644}


def test_an_entry_this_user_cannot_read_is_reported_and_left_in_place(tmp_path: Path, monkeypatch):
    """Another user's 0700 entry: a PermissionError (simulated: the suite runs as root) is one line, not a removal."""
    cache = ExportCache(tmp_path / "cache")
    entry = cache.store(_KEY, _write_graph)

    def refused(path: Path) -> str:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(export_cache, "_file_digest", refused)
    with pytest.raises(OnnxExportError, match=r"cannot read .*\(Permission denied\).*--export-cache-dir"):
        cache.lookup(_KEY)
    assert entry.is_dir()


def test_an_unusable_entry_this_user_cannot_remove_is_reported_in_one_line(tmp_path: Path, monkeypatch):
    cache = ExportCache(tmp_path / "cache")
    entry = cache.store(_KEY, _write_graph)
    (entry / "vision.onnx").write_bytes(b"other")  # fails its digest: to be removed

    def refused(src, dst) -> None:
        raise PermissionError(13, "Permission denied", str(src))

    monkeypatch.setattr(export_cache.os, "replace", refused)
    with pytest.raises(OnnxExportError, match=r"cannot remove the unusable entry .*\(Permission denied\)"):
        cache.lookup(_KEY)


@pytest.mark.parametrize("manifest", ["[]", "null", '{"files": {"vision.onnx": {}}}', '{"files": []}'])
def test_a_manifest_that_is_json_but_no_manifest_is_an_unusable_entry_not_a_crash(tmp_path: Path, manifest: str):
    cache = ExportCache(tmp_path / "cache")
    key = export_key("f" * 64)
    entry = cache.entry_dir(key)
    entry.mkdir(parents=True)
    (entry / "vision.onnx").write_bytes(b"graph")
    (entry / MANIFEST_FILE).write_text(manifest.replace("{}", '{"size_bytes": 5}'))
    found = cache.lookup(key)
    assert found.directory is None and "is not a manifest" in found.reason
    assert not entry.exists()  # removed, so the caller exports again


def test_exporting_yields_the_seconds_spent_waiting_for_another_holder(tmp_path: Path):
    """A start that waited on another's export says so (``server.runtime.runtime_choice``'s start-up line)."""
    from concurrent.futures import ThreadPoolExecutor

    cache = ExportCache(tmp_path / "cache")
    key = ExportKey(fingerprint="fp", runtime="onnxruntime", exporter="torch 2", onnxruntime="1", opset=18,
                    quantization="none")

    def second() -> float:
        with cache.exporting(key) as waited_s:
            return waited_s

    with ThreadPoolExecutor(1) as pool:
        with cache.exporting(key) as first_waited_s:
            waiting = pool.submit(second)  # its own open file, as another engine process has
            time.sleep(0.5)
        assert first_waited_s == 0.0
        assert 0.2 <= waiting.result(timeout=10) < 10
    with cache.exporting(key) as free_waited_s:
        assert free_waited_s == 0.0
