"""SigLIP's SentencePiece tokenizer with the ``sentencepiece`` library alone (transformers' ``SiglipTokenizer``).

transformers' ``SiglipTokenizer`` (a Python tokenizer over a SentencePiece
model) turns one text into ids in these steps, which this module repeats:

    1. "▁" + text (any "▁" in the text read as a space)
    2. split at its special tokens ("</s>", "<unk>", ...; longest first), each
       kept whole and, where the token strips, the spaces beside it removed
    3. each other piece: lowercased (``do_lower_case``), ASCII punctuation
       removed, runs of whitespace made one space, stripped; then
       ``sp.encode("<unk>" + piece)`` without the pieces "<unk>" alone gives
    4. a leading "▁" dropped when a special token follows it
    5. pieces to ids (special tokens by their own table), and "</s>" appended
       unless the ids already end with it

The engine packs what its tokenizer holds beyond the model file (the special
tokens and their ids, ``do_lower_case``); ``identity()`` is what the
engine's ``TextTokenizer.identity()`` gives for a tokenizer without a Rust
backend: the sorted vocabulary, SentencePiece's pieces with the special
tokens over them.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

import sentencepiece

from models.torch_free.text_ids import LimitedTokenizer

SPIECE_UNDERLINE = "▁"
_NO_PUNCTUATION = str.maketrans("", "", string.punctuation)


@dataclass(frozen=True)
class SpecialToken:
    """One of the tokenizer's added tokens: its id and whether it eats the spaces beside it."""

    content: str
    token_id: int
    is_lstrip: bool
    is_rstrip: bool


@dataclass(frozen=True)
class SiglipSettings:
    """What a ``SiglipTokenizer`` holds beyond its SentencePiece model."""

    special_tokens: tuple[SpecialToken, ...]
    eos_token: str
    unk_token: str
    is_lower_case: bool


class SiglipSentencePieceTokenizer(LimitedTokenizer):
    """SigLIP's tokenization (module docstring) with the server's limit; SigLIP truncates by default."""

    def __init__(self, model_proto: bytes, settings: SiglipSettings, max_tokens: int, *,
                 truncates_by_default: bool, pad_token_id: int) -> None:
        self.max_tokens = max_tokens
        self.truncates_by_default = truncates_by_default
        self.pad_token_id = pad_token_id
        self._sp = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
        self._settings = settings
        self._specials = {token.content: token for token in settings.special_tokens}
        self._eos_id = self._specials[settings.eos_token].token_id
        self._unk_length = len(self._sp.encode(settings.unk_token, out_type=str))
        by_length = sorted(self._specials, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, by_length)) + ")") if by_length else None

    def _canonical(self, text: str) -> str:
        if self._settings.is_lower_case:
            text = text.lower()
        text = text.translate(_NO_PUNCTUATION)
        return re.sub(r"\s+", " ", text).strip()

    def _pieces(self, text: str) -> list[str]:
        text = self._canonical(text)
        pieces = self._sp.encode(self._settings.unk_token + text, out_type=str)
        return pieces[self._unk_length:] if len(pieces) >= self._unk_length else pieces

    def _tokens(self, text: str) -> list[str]:
        parts = self._split.split(text) if self._split is not None else [text]
        for i, part in enumerate(parts):
            special = self._specials.get(part) if i % 2 == 1 else None
            if special is None:
                continue
            if special.is_rstrip and i + 1 < len(parts) and parts[i + 1]:
                parts[i + 1] = parts[i + 1].lstrip()
            if special.is_lstrip and i > 0 and parts[i - 1]:
                parts[i - 1] = parts[i - 1].rstrip()
        tokens: list[str] = []
        for i, part in enumerate(parts):
            if not part:
                continue
            tokens.extend([part] if i % 2 == 1 else self._pieces(part))
        return tokens

    def token_ids(self, text: str) -> list[int]:
        tokens = self._tokens(SPIECE_UNDERLINE + text.replace(SPIECE_UNDERLINE, " "))
        if len(tokens) > 1 and tokens[0] == SPIECE_UNDERLINE and tokens[1] in self._specials:
            tokens = tokens[1:]
        specials = self._specials
        ids = [specials[token].token_id if token in specials else self._sp.piece_to_id(token) for token in tokens]
        if not ids or ids[-1] != self._eos_id:
            ids.append(self._eos_id)
        return ids

    def identity(self) -> str:
        vocab = {self._sp.id_to_piece(i): i for i in range(self._sp.get_piece_size())}
        vocab.update({token.content: token.token_id for token in self._settings.special_tokens})
        return repr(sorted(vocab.items()))
