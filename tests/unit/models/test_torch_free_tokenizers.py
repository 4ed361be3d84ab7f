"""The API processes' torch-free tokenizers give each model library's own ids, on texts chosen to differ.

Each reader in ``models.torch_free`` is built from what the engine packs
(``models.tokenizer_packing``) and compared, text by text, with the
library's tokenizer the engine serves: transformers' fast tokenizers
(CLIP's byte-level BPE, a WordPiece BERT, the presets' byte-level one),
transformers' ``SiglipTokenizer`` over a SentencePiece model trained here,
and open_clip's ``SimpleTokenizer`` (its bundled CLIP BPE) with each of its
cleanings. The texts mix scripts, emoji, case, punctuation, HTML entities,
mojibake ftfy repairs, special tokens written in the text, and lengths
past every limit.
"""

from __future__ import annotations

import open_clip.tokenizer as oc_tokenizer  # a test dependency (mmserve[openclip])
import pytest
from transformers import AutoTokenizer

from benchmarks.random_pretrained import write_bert, write_clip, write_siglip
from models.families.open_clip_tokenizer import OpenClipTokenizer
from models.tokenizer import TextTokenizer
from models.tokenizer_files import unpack_tokenizer
from models.tokenizer_packing import pack_tokenizer
from models.torch_free.clip_bpe import ClipBpeTokenizer
from models.torch_free.json_tokenizer import JsonTokenizer
from models.torch_free.siglip_sentencepiece import SiglipSentencePieceTokenizer

TEXTS = (
    "a photo of a cat",
    "A PHOTO OF A CAT",
    "两只狗在草地上玩耍",
    "東京タワーの夜景 🗼✨",
    "emoji only 😀😃😄🐈‍⬛👩🏽‍🚀",
    "  Mixed CASE, punctuation!!  and\t\n spaces ",
    "Don't stop: it's 3.14 -- (really) [sic] {ok} #1 @home $5 100% a_b",
    "caf\u00e9 vs cafe\u0301 and \u00c3\u00a9 mojibake",
    "Tom &amp;amp; Jerry &lt;3 &#39;quoted&#39;",
    "</s> inside <unk> text </s>",
    "<start_of_text> and <end_of_text> written out",
    "▁underline ▁ marks",
    "",
    "   ",
    "x",
    "word " * 120,
    "一只猫坐在窗台上" * 40,
)


@pytest.fixture(scope="module")
def directories(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    return {"clip": write_clip(root / "clip"), "bert": write_bert(root / "bert"),
            "siglip": write_siglip(root / "siglip", max_text_tokens=64)}


def _engine(directory, max_tokens: int, truncates: bool) -> TextTokenizer:
    return TextTokenizer(AutoTokenizer.from_pretrained(str(directory), local_files_only=True), max_tokens,
                         truncates_by_default=truncates)


def _assert_same_ids(engine, api, texts=TEXTS) -> None:
    assert api.identity() == engine.identity()
    assert (api.max_tokens, api.truncates_by_default, api.pad_token_id) == (
        engine.max_tokens, engine.truncates_by_default, engine.pad_token_id)
    for text in texts:
        assert api.token_ids(text) == engine.token_ids(text), text
        assert api.encode(text, truncate=True) == engine.encode(text, truncate=True), text


@pytest.mark.parametrize("name", ["clip", "bert"])
def test_a_fast_tokenizer_is_read_from_its_json_alone(directories, name):
    engine = _engine(directories[name], 77, False)
    api = unpack_tokenizer(pack_tokenizer(engine))
    assert isinstance(api, JsonTokenizer)
    _assert_same_ids(engine, api)


def test_the_presets_byte_level_tokenizer_is_read_from_its_json(tiny_bundle):
    api = unpack_tokenizer(pack_tokenizer(tiny_bundle.tokenizer))
    assert isinstance(api, JsonTokenizer)
    _assert_same_ids(tiny_bundle.tokenizer, api)


def test_siglip_is_read_with_sentencepiece(directories):
    engine = _engine(directories["siglip"], 64, True)
    api = unpack_tokenizer(pack_tokenizer(engine))
    assert isinstance(api, SiglipSentencePieceTokenizer)
    _assert_same_ids(engine, api)
    # the reference pipeline pads to 64 and cuts there: the ids before the padding are ours
    reference = engine.tokenizer(list(TEXTS), padding="max_length", max_length=64, truncation=True)["input_ids"]
    for text, padded in zip(TEXTS, reference):
        ids = api.encode(text, truncate=True).token_ids
        assert list(ids) + [engine.pad_token_id] * (64 - len(ids)) == padded, text


@pytest.mark.parametrize("clean", ["lower", "whitespace", "canonicalize"])
def test_open_clips_simple_tokenizer_is_read_from_its_merges(clean):
    engine = OpenClipTokenizer(oc_tokenizer.SimpleTokenizer(clean=clean, additional_special_tokens=["<mask>"]), 77)
    api = unpack_tokenizer(pack_tokenizer(engine))
    assert isinstance(api, ClipBpeTokenizer)
    _assert_same_ids(engine, api, (*TEXTS, "a <mask> on the mat", "A <MASK> in capitals"))
    padded = engine.tokenizer(list(TEXTS)).tolist()  # open_clip's own batch: cut to 77, padded with 0
    for text, row in zip(TEXTS, padded):
        ids = api.encode(text, truncate=True).token_ids
        assert list(ids) + [0] * (77 - len(ids)) == row, text


@pytest.mark.parametrize("clean", ["lower", "canonicalize"])
def test_an_open_clip_hf_tokenizer_is_read_from_its_json(directories, clean):
    engine = OpenClipTokenizer(oc_tokenizer.HFTokenizer(str(directories["clip"]), context_length=77, clean=clean), 77)
    api = unpack_tokenizer(pack_tokenizer(engine))
    assert isinstance(api, JsonTokenizer)
    _assert_same_ids(engine, api)
