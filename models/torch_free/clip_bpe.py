"""open_clip's ``SimpleTokenizer`` (OpenAI CLIP's byte-level BPE) read from its merges, without open_clip.

open_clip imports torch at its first line, so an API process cannot use it;
the tokenizer itself is a few dozen lines of Python over the BPE merges,
repeated here from open_clip 3.x (``open_clip/tokenizer.py``, MIT, from
OpenAI's CLIP):

    clean the text (ftfy, HTML unescaped twice, then "lower": whitespace runs
    to one space and lowercased | "whitespace": the same, case kept |
    "canonicalize": also "_" to space and ASCII punctuation removed)
    -> split by open_clip's pattern (its special tokens first, unescaped, as
       open_clip joins them) -> each word's UTF-8 bytes as printable
       characters -> BPE by merge rank -> ids: bytes, bytes + "</w>",
       merges, then the special tokens
    ids: [<start_of_text>] + those + [<end_of_text>]

``identity()`` hashes the same tables the engine's
``models.families.open_clip_tokenizer.OpenClipTokenizer`` hashes.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import string
from collections.abc import Callable
from functools import lru_cache

from models.torch_free.text_ids import LimitedTokenizer

NUM_MERGES_READ = 49152 - 256 - 2  # open_clip reads at most this many merge lines after the first
MAX_MEMOIZED_WORDS = 50_000  # the BPE memo of words seen starts afresh past this many
_NO_PUNCTUATION = str.maketrans("", "", string.punctuation)


@lru_cache
def bytes_to_unicode() -> dict[int, str]:
    """Each byte as a printable character (CLIP's table: printable Latin-1 as itself, the rest from U+0100)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes = printable[:]
    num_extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + num_extra)
            num_extra += 1
    return dict(zip(printable, map(chr, codes)))


def _basic_clean(text: str) -> str:
    import ftfy  # imported by the first text (ClipBpeTokenizer imports it at construction): an API process
    # serving another family never pays for it

    return html.unescape(html.unescape(ftfy.fix_text(text))).strip()


def _whitespace_clean(text: str) -> str:
    return " ".join(text.split()).strip()


def _clean_lower(text: str) -> str:
    return _whitespace_clean(_basic_clean(text)).lower()


def _clean_whitespace(text: str) -> str:
    return _whitespace_clean(_basic_clean(text))


def _clean_canonicalize(text: str) -> str:
    text = _basic_clean(text).replace("_", " ").translate(_NO_PUNCTUATION).lower()
    return " ".join(text.split()).strip()


CLEAN_FUNCTIONS: dict[str, Callable[[str], str]] = {
    "lower": _clean_lower, "whitespace": _clean_whitespace, "canonicalize": _clean_canonicalize}
CLEAN_NAMES = {"lower": "_clean_lower", "whitespace": "_clean_whitespace", "canonicalize": "_clean_canonicalize"}


class ClipBpeTokenizer(LimitedTokenizer):
    """open_clip's ``SimpleTokenizer`` from its gzip merges file; always truncates, pads with 0."""

    def __init__(self, merges_gz: bytes, max_tokens: int, *, clean: str,
                 additional_special_tokens: tuple[str, ...] = ()) -> None:
        if clean not in CLEAN_FUNCTIONS:
            raise ValueError(f"unknown open_clip text cleaning {clean!r}")
        import ftfy  # noqa: F401 - imported here, not by the first text (see _basic_clean)
        import regex
        self.max_tokens = max_tokens
        self.truncates_by_default = True
        self.pad_token_id = 0
        lines = gzip.decompress(merges_gz).decode("utf-8").split("\n")[1:NUM_MERGES_READ + 1]
        merges = [tuple(line.split()) for line in lines]
        self._byte_encoder = bytes_to_unicode()
        vocab = list(self._byte_encoder.values())
        vocab += [v + "</w>" for v in vocab]
        vocab += ["".join(merge) for merge in merges]
        self._special_tokens = ["<start_of_text>", "<end_of_text>", *additional_special_tokens]
        vocab += self._special_tokens
        self._encoder = dict(zip(vocab, range(len(vocab))))
        self._bpe_ranks = dict(zip(merges, range(len(merges))))
        self._clean_name = clean
        self._clean = CLEAN_FUNCTIONS[clean]
        self._memo = {token: token for token in self._special_tokens}
        special = "|".join(self._special_tokens)  # unescaped, as open_clip builds it
        self._pattern = regex.compile(special + r"""|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
                                      regex.IGNORECASE)
        self._sot_id, self._eot_id = self._encoder["<start_of_text>"], self._encoder["<end_of_text>"]

    def _bpe(self, token: str) -> str:
        memo = self._memo
        if token in memo:
            return memo[token]
        word: tuple[str, ...] = (*token[:-1], token[-1] + "</w>")
        pairs = set(zip(word, word[1:]))
        if not pairs:
            return token + "</w>"
        ranks = self._bpe_ranks
        while True:
            bigram = min(pairs, key=lambda pair: ranks.get(pair, float("inf")))
            if bigram not in ranks:
                break
            first, second = bigram
            merged: list[str] = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    merged.extend(word[i:])
                    break
                merged.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = tuple(merged)
            if len(word) == 1:
                break
            pairs = set(zip(word, word[1:]))
        result = " ".join(word)
        if len(memo) > MAX_MEMOIZED_WORDS:
            self._memo = {t: t for t in self._special_tokens}  # a dict swap: atomic for other threads
        self._memo[token] = result
        return result

    def token_ids(self, text: str) -> list[int]:
        ids = [self._sot_id]
        encoder, byte_encoder = self._encoder, self._byte_encoder
        for word in self._pattern.findall(self._clean(text)):
            chars = "".join(byte_encoder[b] for b in word.encode("utf-8"))
            ids.extend(encoder[piece] for piece in self._bpe(chars).split(" "))
        ids.append(self._eot_id)
        return ids

    def identity(self) -> str:
        digest = hashlib.blake2b(digest_size=32)
        digest.update(repr(sorted(self._encoder.items())).encode())
        digest.update(repr(sorted(self._bpe_ranks.items())).encode())
        return f"open_clip.SimpleTokenizer|{CLEAN_NAMES[self._clean_name]}|{digest.hexdigest()}"
