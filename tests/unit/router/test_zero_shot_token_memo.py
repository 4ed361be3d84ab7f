"""``router.zero_shot.TokenMemo``: bounded, least recently used out, keyed by text and truncation."""

from __future__ import annotations

from cache import token_ids_key
from models.tokenizer import TokenizedText
from router.zero_shot import TokenMemo


def _entry(ids: tuple[int, ...]):
    return TokenizedText(ids, False, len(ids)), token_ids_key("fp", "token-ids", ids)


def test_the_least_recently_used_text_goes_first_and_a_get_refreshes():
    memo = TokenMemo(max_entries=2)
    memo.put("cat", False, _entry((1, 2)))
    memo.put("dog", False, _entry((1, 3)))
    assert memo.get("cat", False) == _entry((1, 2))  # cat is now the most recent
    memo.put("car", False, _entry((1, 4)))
    assert memo.get("dog", False) is None and len(memo) == 2
    assert memo.get("cat", False) is not None and memo.get("car", False) is not None


def test_truncation_is_part_of_the_key():
    memo = TokenMemo(max_entries=4)
    memo.put("a long text", True, _entry((1, 9)))
    assert memo.get("a long text", False) is None
    assert memo.get("a long text", True) == _entry((1, 9))
