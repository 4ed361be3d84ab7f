"""Model repositories: round trip, shape checks that name the tensor, HF directories."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from transformers import BertConfig, BertModel

from models.errors import ModelRepositoryError
from models.fusion_head_file import save_fusion_head
from models.loading.repository import build_preset, load_repository, write_repository
from models.tokenizer import build_byte_level_tokenizer


def run_model(bundle, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    size = bundle.config.preprocess.input_size
    images = torch.randint(0, 256, (2, size, size, 3), dtype=torch.uint8, generator=generator)
    token_ids = [bundle.tokenizer.encode(t, truncate=False).token_ids for t in ("a cat", "two dogs on a sofa")]
    image_segments = bundle.model.encode_images(images)
    text_segments = bundle.model.encode_texts(token_ids)
    fused = bundle.model.fuse(image_segments, text_segments)
    return (torch.stack([s.pooled for s in image_segments]), torch.stack([s.pooled for s in text_segments]),
            torch.stack([f.fused for f in fused]), torch.stack([f.match_score for f in fused]))


def test_round_trip_gives_identical_outputs_and_fingerprint(tmp_path: Path, tiny_bundle):
    write_repository(tmp_path / "repo", tiny_bundle)
    assert {p.name for p in (tmp_path / "repo").iterdir()} == {"model.yaml", "weights.safetensors", "tokenizer"}
    loaded = load_repository(tmp_path / "repo")
    assert loaded.fingerprint == tiny_bundle.fingerprint
    assert loaded.has_random_weights is False
    for ours, theirs in zip(run_model(tiny_bundle), run_model(loaded)):
        assert torch.equal(ours, theirs)


def test_fingerprint_changes_with_the_weights(tiny_bundle):
    assert build_preset("tiny", seed=1).fingerprint != tiny_bundle.fingerprint
    assert build_preset("tiny", seed=0).fingerprint == tiny_bundle.fingerprint


def test_a_wrong_tensor_shape_is_named(tmp_path: Path, tiny_bundle):
    repo = tmp_path / "repo"
    write_repository(repo, tiny_bundle)
    weights = load_file(str(repo / "weights.safetensors"))
    weights["fusion.q_proj.weight"] = torch.zeros(8, 32)
    save_file(weights, str(repo / "weights.safetensors"))
    with pytest.raises(ModelRepositoryError, match=r"fusion\.q_proj\.weight has shape \(8, 32\).*\(16, 32\)"):
        load_repository(repo)


def test_missing_and_unexpected_tensors_are_named(tmp_path: Path, tiny_bundle):
    repo = tmp_path / "repo"
    write_repository(repo, tiny_bundle)
    weights = load_file(str(repo / "weights.safetensors"))
    del weights["fusion.k_proj.weight"]
    weights["fusion.extra"] = torch.zeros(3)
    save_file(weights, str(repo / "weights.safetensors"))
    with pytest.raises(ModelRepositoryError) as raised:
        load_repository(repo)
    assert "missing tensor fusion.k_proj.weight" in str(raised.value)
    assert "unexpected tensor fusion.extra" in str(raised.value)


def test_missing_files_and_bad_yaml_are_named(tmp_path: Path, tiny_bundle):
    with pytest.raises(ModelRepositoryError, match="no model.yaml"):
        load_repository(tmp_path)
    repo = tmp_path / "repo"
    write_repository(repo, tiny_bundle)
    (repo / "model.yaml").write_text("dtype: [unclosed")
    with pytest.raises(ModelRepositoryError, match="not valid YAML"):
        load_repository(repo)
    config = tiny_bundle.config.to_dict()
    config["dtype"] = "float64"
    (repo / "model.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ModelRepositoryError, match="dtype 'float64'"):
        load_repository(repo)


def test_writing_into_a_non_empty_directory_is_refused(tmp_path: Path, tiny_bundle):
    (tmp_path / "something").write_text("x")
    with pytest.raises(ModelRepositoryError, match="not empty"):
        write_repository(tmp_path, tiny_bundle)


def _save_hf_text_model(directory: Path, hidden_size: int = 48) -> BertModel:
    tokenizer = build_byte_level_tokenizer(64)
    torch.manual_seed(7)
    model = BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=64, max_position_embeddings=64),
                      add_pooling_layer=False)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return model.eval()


def test_a_hugging_face_directory_loads_as_the_text_encoder(tmp_path: Path, tiny_bundle):
    hf_model = _save_hf_text_model(tmp_path / "repo" / "text-model")
    # Build a repository whose text part is the HF directory: vision + fusion come from weights.safetensors.
    config = tiny_bundle.config.to_dict()
    config["text"]["hf_dir"] = "text-model"
    repo = tmp_path / "repo"
    (repo / "model.yaml").write_text(yaml.safe_dump(config))
    from models.loading.config import ModelConfig
    from models.loading.repository import _build  # the same builder load_repository uses
    from models.text import TextEncoder

    torch.manual_seed(0)
    built = _build(ModelConfig.from_dict(config), build_byte_level_tokenizer(64),
                   TextEncoder.from_pretrained(repo / "text-model"))
    save_file({k: v.contiguous() for k, v in built.state_dict().items() if not k.startswith("text.")},
              str(repo / "weights.safetensors"))

    loaded = load_repository(repo)
    assert loaded.model.text.hidden_size == 48
    ids = loaded.tokenizer.encode("hello there", truncate=False).token_ids
    ours = loaded.model.encode_texts([ids])[0].pooled
    with torch.inference_mode():
        hidden = hf_model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    torch.testing.assert_close(ours, hidden.mean(dim=0), rtol=0, atol=1e-5)


def test_hf_dir_may_not_escape_the_repository(tmp_path: Path, tiny_bundle):
    repo = tmp_path / "repo"
    write_repository(repo, tiny_bundle)
    config = tiny_bundle.config.to_dict()
    config["text"]["hf_dir"] = "../elsewhere"
    (repo / "model.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ModelRepositoryError, match="outside the repository"):
        load_repository(repo)


def test_a_pickled_hugging_face_checkpoint_is_refused(tmp_path: Path):
    """Weights are never unpickled: a directory holding only pytorch_model.bin does not load."""
    from models.text import TextEncoder

    directory = tmp_path / "pickled"
    _save_hf_text_model(directory)
    model = BertModel.from_pretrained(str(directory))
    (directory / "model.safetensors").unlink()
    torch.save(model.state_dict(), directory / "pytorch_model.bin")
    with pytest.raises(ModelRepositoryError, match="cannot load the text model"):
        TextEncoder.from_pretrained(directory)


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)  # the test's own process, one thread: no race
    yield
    os.umask(previous)


def test_weight_files_get_the_umasks_mode_not_0600(tmp_path: Path, tiny_bundle, umask_022):
    """A repository or a trained head written by one user (root, in an image) is readable by the server's user."""
    write_repository(tmp_path / "repo", tiny_bundle)
    save_fusion_head(tmp_path / "fusion_head.safetensors", tiny_bundle.model.fusion, towers_fingerprint="x",
                     is_trained=False)
    assert stat.S_IMODE((tmp_path / "repo" / "weights.safetensors").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "fusion_head.safetensors").stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fusion_head.safetensors", "repo"]  # no probe left
