"""``--dtype``: what ``auto`` serves on this machine, what is refused, and that the dtype keys the cache."""

from __future__ import annotations

import pytest
import torch

from cache.keys import token_ids_key
from models.errors import DeviceSettingError
from models.loading.repository import build_preset
from models.precision import dtype_name, resolve_dtype, torch_dtype


def test_auto_is_float32_on_the_cpu_and_explicit_choices_stay():
    assert resolve_dtype("auto", "cpu") == "float32"
    assert resolve_dtype("float32", "cpu") == "float32"
    assert resolve_dtype("bfloat16", "cpu") == "bfloat16"


def test_float16_on_the_cpu_is_refused_saying_what_to_use():
    with pytest.raises(DeviceSettingError) as refused:
        resolve_dtype("float16", "cpu")
    message = str(refused.value)
    assert "--dtype float16" in message and "MMSERVE_DTYPE" in message and "CUDA" in message
    assert "float32" in message and "bfloat16" in message


def test_an_unknown_dtype_is_named():
    with pytest.raises(DeviceSettingError, match="'float8'"):
        resolve_dtype("float8", "cpu")


def test_names_and_torch_dtypes_round_trip():
    for name in ("float32", "bfloat16", "float16"):
        assert dtype_name(torch_dtype(name)) == name


def test_a_preset_in_bfloat16_computes_in_it_and_answers_float32():
    bundle = build_preset("tiny", dtype="bfloat16")
    assert {p.dtype for p in bundle.model.parameters()} == {torch.bfloat16}
    assert bundle.describe().dtype == "bfloat16" and bundle.config.dtype == "bfloat16"
    images = bundle.model.encode_images(torch.zeros((2, 32, 32, 3), dtype=torch.uint8))
    texts = bundle.model.encode_texts([[5, 6, 7], [8]], pad_token_id=0)
    assert images[0].pooled.dtype == texts[0].pooled.dtype == torch.float32
    assert images[0].k.dtype == torch.bfloat16  # K/V/Q stay in the model's dtype (half the cache bytes)
    fused = bundle.model.fuse(images, texts)
    assert fused[0].match_score.dtype == torch.float32


def test_different_dtypes_give_different_fingerprints_and_cache_keys():
    fingerprints = {dtype: build_preset("tiny", dtype=dtype).fingerprint for dtype in ("float32", "bfloat16", "float16")}
    assert len(set(fingerprints.values())) == 3
    assert build_preset("tiny").fingerprint == fingerprints["float32"]  # float32 is the preset's own
    keys = {token_ids_key(fingerprint, "text", [1, 2, 3]) for fingerprint in fingerprints.values()}
    assert len(keys) == 3
