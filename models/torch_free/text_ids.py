"""Token ids of one text and the server's length limit, for any tokenizer library.

``LimitedTokenizer`` holds what every tokenizer the server serves shares:
the encoder's ``max_tokens``, the family's truncation policy and the cut.
Subclasses say how a text becomes ids (``token_ids``) and name their
tokenization (``identity``, hashed into the model's fingerprint): the
engine's wrap the model libraries (``models.tokenizer``,
``models.families.open_clip_tokenizer``), an API process's read the same
files without them (``models.torch_free.json_tokenizer``,
``models.torch_free.siglip_sentencepiece``, ``models.torch_free.clip_bpe``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from models.errors import TextTooLongError


@dataclass(frozen=True)
class TokenizedText:
    """Token ids of one text, ready for the text encoder."""

    token_ids: tuple[int, ...]
    is_truncated: bool
    num_tokens_before_truncation: int


class LimitedTokenizer(ABC):
    """A tokenizer with the encoder's limit; subclasses define ``token_ids`` and ``identity``.

    ``truncates_by_default`` is the family's own policy for a text over the
    limit. Where the reference library always cuts it (SigLIP, whose
    transformers pipeline tokenizes with ``truncation=True, max_length=64``;
    every open_clip tokenizer), mmserve cuts it too, whatever the request's
    ``truncate`` says, and the answer's ``text.truncated`` tells the client;
    elsewhere a too-long text is refused unless the request asks to truncate.
    Safe from several threads at once when ``token_ids`` is.
    """

    max_tokens: int
    truncates_by_default: bool
    pad_token_id: int

    @abstractmethod
    def token_ids(self, text: str) -> list[int]:
        """Every token id of ``text`` with the special tokens, untruncated."""

    @abstractmethod
    def identity(self) -> str:
        """A canonical string naming this tokenization (part of the model's fingerprint)."""

    def encode(self, text: str, *, truncate: bool) -> TokenizedText:
        """Token ids (with special tokens); ``TextTooLongError`` unless ``truncate`` or the family truncates.

        Several decode threads call this at once. A fast tokenizer's truncation
        is a setting on the shared Rust tokenizer, so asking it to truncate
        from one thread changes what another thread gets. Every call therefore
        tokenizes the same way (no truncation) and truncation cuts the ids
        here: the first ``max_tokens - 1`` ids and the closing special token,
        which is what the reference libraries' truncation gives.
        """
        token_ids = self.token_ids(text)
        num_tokens = len(token_ids)
        if num_tokens <= self.max_tokens:
            return TokenizedText(tuple(token_ids), False, num_tokens)
        if not (truncate or self.truncates_by_default):
            raise TextTooLongError(num_tokens, self.max_tokens)
        return cut_to(TokenizedText(tuple(token_ids), False, num_tokens), self.max_tokens)


def cut_to(text: TokenizedText, max_tokens: int) -> TokenizedText:
    """``text`` cut to ``max_tokens`` ids the way the reference libraries cut: the first
    ``max_tokens - 1`` and the closing special token (a joint-token budget cuts this way too)."""
    if len(text.token_ids) <= max_tokens:
        return text
    if max_tokens < 2:
        raise ValueError(f"a limit of {max_tokens} tokens leaves no room for a text and its closing token")
    return TokenizedText((*text.token_ids[: max_tokens - 1], text.token_ids[-1]), True,
                         text.num_tokens_before_truncation)
