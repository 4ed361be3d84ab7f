"""Which names reach the model: the served name, the string given to --model, and its short form."""

from __future__ import annotations

from pathlib import Path

from models.loading.repository import build_preset
from models.served_facts import served_model_facts
from server.protocols.model_names import served_model_names
from server.runtime.model_loading import with_served_name
from server.settings import Settings


def test_a_path_and_its_directory_name_are_accepted_and_nothing_else(tiny_bundle):
    names = served_model_names(Settings(model="/models/my-clip/"),
                               served_model_facts(with_served_name(tiny_bundle, "my-clip")))
    assert names.served == "my-clip"
    assert names.accepts("/models/my-clip/") and names.accepts("my-clip")
    assert not names.accepts("/models") and not names.accepts("models/my-clip") and not names.accepts("")
    assert names.described() == "'my-clip' (also called '/models/my-clip/')"


def test_a_hub_id_with_a_revision_is_accepted_with_and_without_it(tiny_bundle):
    bundle = with_served_name(tiny_bundle, "google/siglip-base-patch16-224")
    names = served_model_names(Settings(model="google/siglip-base-patch16-224@main"), served_model_facts(bundle))
    for accepted in ("google/siglip-base-patch16-224@main", "google/siglip-base-patch16-224", "siglip-base-patch16-224"):
        assert names.accepts(accepted), accepted
    assert not names.accepts("google/siglip-large-patch16-256")


def test_served_model_name_renames_without_changing_the_fingerprint(tmp_path: Path):
    bundle = build_preset("tiny")
    renamed = with_served_name(bundle, "team/encoder")
    assert renamed.config.name == renamed.describe().name == "team/encoder"
    assert renamed.fingerprint == bundle.fingerprint
    names = served_model_names(Settings(model_repo=tmp_path / "tiny-repo"), served_model_facts(renamed))
    assert names.accepts("team/encoder") and names.accepts(str(tmp_path / "tiny-repo")) and names.accepts("tiny-repo")
    assert not names.accepts("tiny")  # the preset's own name is not the served one any more


def test_a_preset_answers_to_its_name_only(tiny_bundle):
    names = served_model_names(Settings(preset="tiny"), served_model_facts(tiny_bundle))
    assert names.accepts("tiny") and names.aliases == frozenset() and names.described() == "'tiny'"
