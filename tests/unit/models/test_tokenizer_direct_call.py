"""The direct Rust call for one text gives exactly what the transformers call gives, for every family here."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from benchmarks.random_pretrained import SENTENCES, write_bert, write_clip, write_siglip
from models.tokenizer import TextTokenizer, build_byte_level_tokenizer, direct_backend

TEXTS = (*SENTENCES, "", "  spaced   out  ", "UPPER and lower", "a [CLS] inside, [SEP] and <|endoftext|> </s>",
         "emoji 🚲 and accents: café, naïve", "x" * 500, "tab\tnew\nline")


def transformers_ids(tokenizer: TextTokenizer, text: str) -> list[int]:
    return tokenizer.tokenizer(text, add_special_tokens=True, verbose=False)["input_ids"]


@pytest.fixture(scope="module", params=["byte_level", "clip", "siglip", "bert"])
def tokenizer(request, tmp_path_factory) -> TextTokenizer:
    if request.param == "byte_level":
        return TextTokenizer(build_byte_level_tokenizer(64), max_tokens=64)
    writer = {"clip": write_clip, "siglip": write_siglip, "bert": write_bert}[request.param]
    directory = writer(tmp_path_factory.mktemp(request.param))
    return TextTokenizer(AutoTokenizer.from_pretrained(str(directory), local_files_only=True), max_tokens=64)


def test_the_direct_call_gives_the_transformers_ids(tokenizer):
    for text in TEXTS:
        assert tokenizer.token_ids(text) == transformers_ids(tokenizer, text), text


def test_the_stock_fast_tokenizer_takes_the_direct_call():
    assert direct_backend(build_byte_level_tokenizer(64)) is not None


def test_truncation_set_on_the_shared_backend_falls_back_to_the_transformers_call():
    tokenizer = TextTokenizer(build_byte_level_tokenizer(64), max_tokens=64)
    long_text = "y" * 300
    full = tokenizer.token_ids(long_text)
    assert len(full) == 302
    tokenizer.tokenizer.backend_tokenizer.enable_truncation(max_length=10)  # as another caller might leave it
    assert tokenizer.token_ids(long_text) == full  # the transformers call resets it: still untruncated
