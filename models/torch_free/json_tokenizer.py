"""A Hugging Face fast tokenizer rebuilt from its ``tokenizer.json`` with the ``tokenizers`` library alone.

A transformers fast tokenizer encodes one text by handing it to its Rust
backend (``tokenizer(text)["input_ids"]`` is ``backend.encode(text,
add_special_tokens=True).ids`` while the backend neither truncates nor
pads: ``models.tokenizer.direct_backend``). The backend is all of the
tokenization; its JSON (``backend.to_str()``) is what the engine sends, and
also the tokenizer's identity. So an API process rebuilds it with
``tokenizers.Tokenizer.from_str`` and gets the same ids without importing
transformers (which imports torch).
"""

from __future__ import annotations

from tokenizers import Tokenizer, models, pre_tokenizers

from models.torch_free.text_ids import LimitedTokenizer


class JsonTokenizer(LimitedTokenizer):
    """The ``tokenizers`` backend a fast tokenizer serialised, with the server's limit.

    ``clean`` runs on each text first (open_clip's ``HFTokenizer`` cleans
    before it calls its transformers tokenizer); ``identity_prefix`` is put
    before the JSON in ``identity()``, as the engine's wrapper names it.
    """

    def __init__(self, tokenizer_json: str, max_tokens: int, *, truncates_by_default: bool, pad_token_id: int,
                 encode_special_tokens: bool = False, clean=None, identity_prefix: str = "") -> None:  # noqa: ANN001
        self.max_tokens = max_tokens
        self.truncates_by_default = truncates_by_default
        self.pad_token_id = pad_token_id
        backend = Tokenizer.from_str(tokenizer_json)
        self._identity = identity_prefix + backend.to_str()  # before the settings below, as the engine's names it
        backend.no_truncation()  # the limit and the cut are the server's (LimitedTokenizer.encode)
        backend.no_padding()
        backend.encode_special_tokens = encode_special_tokens
        turn_off_whole_text_cache_of(backend)
        self._backend = backend
        self._clean = clean

    def token_ids(self, text: str) -> list[int]:
        if self._clean is not None:
            text = self._clean(text)
        return self._backend.encode(text, add_special_tokens=True).ids

    def identity(self) -> str:
        return self._identity


def turn_off_whole_text_cache_of(backend: Tokenizer) -> bool:
    """Turn off a BPE backend's word cache when its "words" are whole texts; returns whether it did.

    A BPE model memoizes the tokens of each word its pre-tokenizer yields, up to
    10,000 words in each thread that tokenizes (``tokenizers`` 0.23 keeps one
    cache per thread). When the pre-tokenizer does not split (none, or
    byte-level without its regex, as in the presets), the word is the whole
    text. Texts rarely repeat, so each decode thread and the event loop would
    fill a cache of its own with texts never asked again (about 1.3 KiB each
    for a short text, some 70 MB for a server) while a hit saves little: the
    presets' tokenizer has no merges. ``save_pretrained`` does not keep the
    setting, so it is applied to every tokenizer the server wraps.
    """
    if not isinstance(backend.model, models.BPE):
        return False
    pre_tokenizer = backend.pre_tokenizer
    is_whole_text = pre_tokenizer is None or (
        isinstance(pre_tokenizer, pre_tokenizers.ByteLevel) and not pre_tokenizer.use_regex)
    resize_cache = getattr(backend.model, "_resize_cache", None)  # private in tokenizers; old releases lack it
    if not is_whole_text or resize_cache is None:
        return False
    resize_cache(0)
    return True
