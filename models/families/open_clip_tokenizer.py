"""open_clip's tokenizers behind the interface the server tokenizes through (``TextTokenizer``).

open_clip tokenizes a batch into a (B, context_length) tensor, padded with
zeros (``SimpleTokenizer``) or the Hugging Face tokenizer's pad id
(``HFTokenizer``), always cutting a text to the context. The server wants
one text's ids without padding and decides the cut itself, so this adapter
asks open_clip's tokenizer for the ids through its own public pieces:

    SimpleTokenizer   [sot_token_id] + encode(text) + [eot_token_id]     (encode cleans the text)
    HFTokenizer       tokenizer(clean_fn(text))["input_ids"]            (the wrapped transformers tokenizer)

and ``TextTokenizer`` cuts an over-long text as open_clip does (the first
``context_length - 1`` ids, then the closing token). open_clip always
truncates, so this family truncates by default. Tokenizers whose output is
not those ids (a reduction mask, the "clips" mode, a stripped separator)
are refused at load rather than served with other ids.
"""

from __future__ import annotations

import hashlib
from typing import Any

from models.errors import ModelRepositoryError
from models.tokenizer import TextTokenizer, turn_off_whole_text_cache

# SimpleTokenizer memoizes the BPE of every word it has seen, without bound;
# past this many words the memo is started afresh (from its special tokens).
MAX_MEMOIZED_WORDS = 50_000


class OpenClipTokenizer(TextTokenizer):
    """An open_clip ``SimpleTokenizer`` or ``HFTokenizer`` with the server's ``encode``."""

    def __init__(self, tokenizer: Any, max_tokens: int) -> None:
        import open_clip.tokenizer as oc_tokenizer

        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.truncates_by_default = True
        if isinstance(tokenizer, oc_tokenizer.SimpleTokenizer):
            if tokenizer.reduction_fn is not None:
                raise ModelRepositoryError("the open_clip tokenizer reduces texts with a mask, which mmserve "
                                           "does not serve")
            self.pad_token_id = 0  # SimpleTokenizer pads with zeros
            self._is_simple = True
        elif isinstance(tokenizer, oc_tokenizer.HFTokenizer):
            if tokenizer.tokenizer_mode or tokenizer.strip_sep_token:
                raise ModelRepositoryError(
                    f"the open_clip HFTokenizer runs in mode {tokenizer.tokenizer_mode!r} (strip_sep_token="
                    f"{tokenizer.strip_sep_token}), which mmserve does not serve")
            self.pad_token_id = int(tokenizer.tokenizer.pad_token_id or 0)
            self._is_simple = False
            turn_off_whole_text_cache(tokenizer.tokenizer)
        else:
            raise ModelRepositoryError(f"open_clip tokenizer {type(tokenizer).__name__} is not served by mmserve")

    def token_ids(self, text: str) -> list[int]:
        tokenizer = self.tokenizer
        if not self._is_simple:
            return tokenizer.tokenizer(tokenizer.clean_fn(text), verbose=False)["input_ids"]
        if len(tokenizer.cache) > MAX_MEMOIZED_WORDS:
            # A dict swap is atomic: a thread inside bpe() still writes to the old memo, harmlessly.
            specials = [tokenizer.decoder[i] for i in tokenizer.all_special_ids]
            tokenizer.cache = {token: token for token in specials}
        return [tokenizer.sot_token_id, *tokenizer.encode(text), tokenizer.eot_token_id]

    def identity(self) -> str:
        tokenizer = self.tokenizer
        if not self._is_simple:
            return f"open_clip.HFTokenizer|{tokenizer.clean_fn.__name__}|" + TextTokenizer(
                tokenizer.tokenizer, self.max_tokens).identity()
        digest = hashlib.blake2b(digest_size=32)
        digest.update(repr(sorted(tokenizer.encoder.items())).encode())
        digest.update(repr(sorted(tokenizer.bpe_ranks.items())).encode())
        return f"open_clip.SimpleTokenizer|{tokenizer.clean_fn.__name__}|{digest.hexdigest()}"
