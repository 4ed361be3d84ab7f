"""``router.zero_shot.tokenize_texts``: the texts' tokens and keys where they arrive, each text tokenized once.

An API process of ``--api-workers N`` calls it with a keys-only catalog
(no cache): the keys must be the ones the engine's catalog derives.
"""

from __future__ import annotations

import pytest

from models.errors import TextTooLongError
from models.loading.repository import build_preset
from models.tokenizer import TextTokenizer, TokenizedText
from router.errors import IntakeItemError
from router.segments import SegmentCatalog
from router.zero_shot import TokenMemo, tokenize_texts


class _Counted:
    """The real tokenizer, counting its calls per text."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self._tokenizer = tokenizer
        self.calls: list[str] = []

    def encode(self, text: str, *, truncate: bool) -> TokenizedText:
        self.calls.append(text)
        return self._tokenizer.encode(text, truncate=truncate)


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return build_preset("tiny", seed=0).tokenizer


def test_keys_are_the_catalogs_and_a_remembered_text_is_not_tokenized_again(tokenizer):
    counted, memo = _Counted(tokenizer), TokenMemo(16)
    keys_only = SegmentCatalog(None, "fingerprint-a", "size=32")  # type: ignore[arg-type]  # as an API process
    texts = ["a cat", "two dogs", "a cat"]
    first = tokenize_texts(counted, keys_only, memo, texts, False)  # type: ignore[arg-type]
    assert first.tokens == tuple(tokenizer.encode(text, truncate=False) for text in texts)
    assert first.keys == tuple(keys_only.text_key(tokens.token_ids) for tokens in first.tokens)
    assert first.keys[0] == first.keys[2] != first.keys[1]
    assert counted.calls == ["a cat", "two dogs"]  # the repeat came from the memo
    again = tokenize_texts(counted, keys_only, memo, ["two dogs", "a cat"], False)  # type: ignore[arg-type]
    assert again.keys == (first.keys[1], first.keys[0]) and counted.calls == ["a cat", "two dogs"]
    other_model = SegmentCatalog(None, "fingerprint-b", "size=32")  # type: ignore[arg-type]
    assert tokenize_texts(tokenizer, other_model, TokenMemo(4), ["a cat"], False).keys[0] != first.keys[0]


def test_a_refused_text_is_named_by_its_index_and_truncate_cuts_it_instead(tokenizer):
    catalog = SegmentCatalog(None, "fingerprint", "size=32")  # type: ignore[arg-type]
    long_text = "word " * (tokenizer.max_tokens + 10)
    with pytest.raises(IntakeItemError) as refused:
        tokenize_texts(tokenizer, catalog, TokenMemo(4), ["fine", long_text, "also fine"], False)
    assert refused.value.item_index == 1 and isinstance(refused.value.error, TextTooLongError)
    cut = tokenize_texts(tokenizer, catalog, TokenMemo(4), ["fine", long_text], True)
    assert cut.tokens[1].is_truncated and len(cut.tokens[1].token_ids) == tokenizer.max_tokens
