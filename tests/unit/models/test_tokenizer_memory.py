"""The tokenizer's word cache: off when its words are whole texts, so serving threads do not fill it."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from models.tokenizer import TextTokenizer, build_byte_level_tokenizer, load_tokenizer, turn_off_whole_text_cache

NUM_THREADS = 4
NUM_TEXTS_PER_THREAD = 2000


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _malloc_in_use_bytes() -> int:
    """Bytes the C heap has handed out and not had back (glibc ``mallinfo2``): where a Rust cache lives."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    mallinfo2 = getattr(libc, "mallinfo2", None)
    if not sys.platform.startswith("linux") or mallinfo2 is None:
        pytest.skip("needs glibc's mallinfo2")
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return int(info.uordblks + info.hblkhd)


def _distinct_texts(num_texts: int, offset: int) -> list[str]:
    return [f"request {offset + i}: a distinct caption of a red bicycle by the sea" for i in range(num_texts)]


def test_distinct_texts_from_several_threads_leave_the_heap_as_it_was():
    """With the cache on, each thread would keep every text it saw (~1.3 KiB each, ~10 MiB here)."""
    tokenizer = TextTokenizer(build_byte_level_tokenizer(64), max_tokens=64)
    batches = [_distinct_texts(NUM_TEXTS_PER_THREAD, thread * NUM_TEXTS_PER_THREAD) for thread in range(NUM_THREADS)]

    def encode_all(texts: list[str]) -> int:
        return sum(len(tokenizer.encode(text, truncate=True).token_ids) for text in texts)

    with ThreadPoolExecutor(NUM_THREADS) as pool:
        list(pool.map(encode_all, [_distinct_texts(10, -10)] * NUM_THREADS))  # threads and their arenas exist
        before_bytes = _malloc_in_use_bytes()
        num_tokens = sum(pool.map(encode_all, batches))
        grown_bytes = _malloc_in_use_bytes() - before_bytes
    assert num_tokens > NUM_THREADS * NUM_TEXTS_PER_THREAD * 50
    assert grown_bytes < 2 * 1024**2


def test_the_cache_is_turned_off_again_after_a_round_trip_through_files(tmp_path):
    built = build_byte_level_tokenizer(64)
    built.save_pretrained(tmp_path)
    assert turn_off_whole_text_cache(built)
    assert turn_off_whole_text_cache(load_tokenizer(tmp_path))


def test_a_tokenizer_that_splits_words_keeps_its_cache():
    backend = Tokenizer(models.BPE(vocab={"[UNK]": 0, "a": 1}, merges=[], unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    assert not turn_off_whole_text_cache(PreTrainedTokenizerFast(tokenizer_object=backend))
    backend.pre_tokenizer = None
    assert turn_off_whole_text_cache(PreTrainedTokenizerFast(tokenizer_object=backend))
