"""Tokenizing from several threads at once: truncation never leaks between calls."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from models.tokenizer import TextTokenizer, build_byte_level_tokenizer


def test_truncation_is_exact_and_thread_safe():
    tokenizer = TextTokenizer(build_byte_level_tokenizer(64), max_tokens=64)
    long_text, short_text = "y" * 300, "a short text"
    expected_long = tokenizer.encode(long_text, truncate=True)
    expected_short = tokenizer.encode(short_text, truncate=False)
    assert len(expected_long.token_ids) == 64 and expected_long.is_truncated
    assert expected_long.num_tokens_before_truncation == 302
    assert expected_long.token_ids[0] == tokenizer.tokenizer.cls_token_id
    assert expected_long.token_ids[-1] == tokenizer.tokenizer.sep_token_id

    def one(i: int):
        if i % 2:
            return tokenizer.encode(long_text, truncate=True)
        return tokenizer.encode(short_text, truncate=False)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(4000)))
    assert all(r == (expected_long if i % 2 else expected_short) for i, r in enumerate(results))
