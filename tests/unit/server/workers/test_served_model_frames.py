"""The engine's describe answer (``ServedModelFacts`` + ``TokenizerFiles``) through the frame codec, and back to work.

An API process holds nothing of the model but this answer: the facts must
arrive equal to the engine's, and the tokenizer built from the files must
tokenize as the engine's does (its ids, its limit, its refusals).
"""

from __future__ import annotations

import dataclasses

import open_clip.tokenizer as oc_tokenizer  # a test dependency (mmserve[openclip])
import pytest

from benchmarks.random_pretrained import write_clip, write_siglip
from models.errors import ModelRepositoryError, TextTooLongError
from models.families.open_clip_tokenizer import OpenClipTokenizer
from models.families.pretrained import load_pretrained
from models.served_facts import ServedModelFacts, served_model_facts
from models.tokenizer_files import TokenizerFiles, unpack_tokenizer
from models.tokenizer_packing import pack_tokenizer
from router.joint_budget import JointTokenBudget
from server.workers.frame_codec import FrameDecodeError, decode, encode

TEXTS = ("a photo of a cat", "两只狗在草地上玩耍", "  Mixed CASE, punctuation!!  and  spaces ", "")


@pytest.fixture(scope="module")
def clip_bundle(tmp_path_factory):
    return load_pretrained(str(write_clip(tmp_path_factory.mktemp("clip") / "tiny-clip")))


@pytest.fixture(scope="module")
def siglip_bundle(tmp_path_factory):
    return load_pretrained(str(write_siglip(tmp_path_factory.mktemp("siglip") / "tiny-siglip")))


def _describe_answer_round_trip(bundle) -> tuple[ServedModelFacts, TokenizerFiles]:
    message = ("ok", 4, (served_model_facts(bundle), pack_tokenizer(bundle.tokenizer)))
    kind, call_id, (facts, files) = decode(encode(message))
    assert (kind, call_id) == ("ok", 4)
    return facts, files


@pytest.mark.parametrize("name", ["tiny_bundle", "clip_bundle", "siglip_bundle"])
def test_the_facts_arrive_equal_to_the_engines(name, request):
    bundle = request.getfixturevalue(name)
    facts, _ = _describe_answer_round_trip(bundle)
    sent = served_model_facts(bundle)
    assert facts == sent and type(facts.config.preprocess.mean) is tuple
    assert (facts.name, facts.fingerprint, facts.preprocess_id) == (
        bundle.config.name, bundle.fingerprint, bundle.config.preprocess.identity())
    assert (facts.num_image_tokens, facts.text_embedding_dim, facts.image_embedding_dim) == (
        bundle.model.vision.num_tokens, bundle.model.text.embedding_dim, bundle.model.vision.embedding_dim)
    assert JointTokenBudget.for_model(facts, max_images_per_request=2) == JointTokenBudget(
        bundle.model.vision.num_tokens, 2, 2 * bundle.model.vision.num_tokens + bundle.tokenizer.max_tokens)


@pytest.mark.parametrize("name", ["tiny_bundle", "clip_bundle", "siglip_bundle"])
def test_the_tokenizer_built_from_the_files_tokenizes_as_the_engines(name, request):
    bundle = request.getfixturevalue(name)
    engine = bundle.tokenizer
    _, files = _describe_answer_round_trip(bundle)
    api = unpack_tokenizer(files)
    assert (api.max_tokens, api.truncates_by_default, api.pad_token_id, api.identity()) == (
        engine.max_tokens, engine.truncates_by_default, engine.pad_token_id, engine.identity())
    for text in TEXTS:
        assert api.encode(text, truncate=False) == engine.encode(text, truncate=False)
    long_text = "一只猫坐在窗台上" * 40
    assert api.encode(long_text, truncate=True) == engine.encode(long_text, truncate=True)
    if not engine.truncates_by_default:
        with pytest.raises(TextTooLongError) as theirs:
            engine.encode(long_text, truncate=False)
        with pytest.raises(TextTooLongError) as ours:
            api.encode(long_text, truncate=False)
        assert str(ours.value) == str(theirs.value)


def test_an_open_clip_simple_tokenizer_with_its_own_special_token_travels():
    engine = OpenClipTokenizer(oc_tokenizer.SimpleTokenizer(additional_special_tokens=["<mask>"],
                                                            clean="whitespace"), 77)
    files = decode(encode(pack_tokenizer(engine)))
    api = unpack_tokenizer(files)
    assert api.identity() == engine.identity()
    for text in (*TEXTS, "a <mask> on the mat"):
        assert api.token_ids(text) == engine.token_ids(text)


def test_an_open_clip_hf_tokenizer_travels(tmp_path, clip_bundle):
    clip_bundle.tokenizer.tokenizer.save_pretrained(str(tmp_path))
    engine = OpenClipTokenizer(oc_tokenizer.HFTokenizer(str(tmp_path), context_length=77, clean="lower"), 77)
    api = unpack_tokenizer(decode(encode(pack_tokenizer(engine))))
    assert api.identity() == engine.identity()
    for text in TEXTS:
        assert api.token_ids(text) == engine.token_ids(text)


def test_files_that_build_another_tokenizer_are_refused(tiny_bundle, clip_bundle):
    files = dataclasses.replace(pack_tokenizer(clip_bundle.tokenizer),
                                identity=pack_tokenizer(tiny_bundle.tokenizer).identity)
    with pytest.raises(ModelRepositoryError, match="identity differs"):
        unpack_tokenizer(files)


def test_a_file_name_with_a_directory_is_refused(tiny_bundle):
    packed = pack_tokenizer(tiny_bundle.tokenizer)
    files = dataclasses.replace(packed, files={"../tokenizer.json": next(iter(packed.files.values()))})
    with pytest.raises(ModelRepositoryError, match="plain file name"):
        unpack_tokenizer(files)


def test_facts_missing_a_field_do_not_decode(tiny_bundle):
    facts = served_model_facts(tiny_bundle)
    payload = encode(facts).replace(b"\xa6device", b"\xa6devics")  # the field named otherwise on the wire
    with pytest.raises(FrameDecodeError, match="ServedModelFacts arrived with fields"):
        decode(payload)
