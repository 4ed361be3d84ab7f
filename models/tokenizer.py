"""Text to token ids, with the encoder's length limit enforced.

Presets use a byte-level tokenizer (every UTF-8 byte is one token, plus
``[CLS]``/``[SEP]``) built from the ``tokenizers`` library, so nothing needs to
be downloaded; it is saved with ``save_pretrained`` into the model repository
and loaded back as a fast tokenizer like any Hugging Face tokenizer. A local
Hugging Face text model brings its own tokenizer instead.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from models.errors import ModelRepositoryError
from models.torch_free.model_files import missing_tokenizer_folder
from models.torch_free.json_tokenizer import turn_off_whole_text_cache_of
from models.torch_free.text_ids import LimitedTokenizer
from models.torch_free.text_ids import TokenizedText as TokenizedText  # re-exported: the engine's modules
from models.torch_free.text_ids import cut_to as cut_to  # take them from here

SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BYTE_LEVEL_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256


def build_byte_level_tokenizer(max_tokens: int) -> PreTrainedTokenizerFast:
    """A fast tokenizer with one token per UTF-8 byte; needs no download."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for byte_char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[byte_char] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        model_max_length=max_tokens,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def load_tokenizer(directory: Path) -> PreTrainedTokenizerBase:
    """A tokenizer saved by ``save_pretrained``, read from local files only.

    A folder that does not exist is named as such: transformers would take its
    path for a Hub repo id and complain about the id's form. A folder without
    the tokenizer's files is refused too (``require_vocabulary``).
    """
    if not Path(directory).is_dir():
        raise missing_tokenizer_folder(directory)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelRepositoryError(f"cannot load the tokenizer from {directory}: {e}") from e
    require_vocabulary(tokenizer, directory)
    return tokenizer


def require_vocabulary(tokenizer: PreTrainedTokenizerBase, directory: Path) -> None:
    """Refuse a tokenizer that knows only its special tokens.

    Without tokenizer.json / vocab.txt / vocab.json, transformers still builds
    the class that config.json names (a BERT folder gives a ``BertTokenizer``
    of its 5 special tokens), and every text becomes ``[UNK]``: a server that
    starts and answers wrong for every text.
    """
    special = len(set(tokenizer.all_special_ids))
    if len(tokenizer) <= special:
        raise ModelRepositoryError(
            f"cannot load the tokenizer from {directory}: it has no vocabulary, only its {special} special tokens "
            "(no tokenizer.json, vocab.txt or vocab.json there?); save the tokenizer into that folder with "
            "tokenizer.save_pretrained(DIR)")


def turn_off_whole_text_cache(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Turn off the BPE word cache of a transformers tokenizer when its "words" are whole texts (why:
    ``models.torch_free.json_tokenizer.turn_off_whole_text_cache_of``); returns whether it did."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and turn_off_whole_text_cache_of(backend)


def is_stock_fast(tokenizer: object) -> bool:
    """A fast tokenizer whose Python side encodes as the stock one does: its Rust backend is the whole tokenization."""
    cls = type(tokenizer)
    return (isinstance(tokenizer, PreTrainedTokenizerFast)
            and cls._encode_plus is PreTrainedTokenizerFast._encode_plus
            and cls.__call__ is PreTrainedTokenizerBase.__call__
            and getattr(tokenizer, "backend_tokenizer", None) is not None)


def direct_backend(tokenizer: PreTrainedTokenizerBase) -> Tokenizer | None:
    """The Rust tokenizer to call directly for one text, when that gives what ``tokenizer(text)`` gives.

    ``tokenizer(text, add_special_tokens=True)`` on a fast tokenizer sets the
    backend's truncation and padding to none, then calls its ``encode_batch``
    on a one-text batch: some 30 us of Python and a hop through the Rust
    thread pool, for the ids ``backend.encode(text).ids`` gives. The direct
    call is used only for the stock fast tokenizer (no subclass changing how
    it encodes) whose special-token splitting is as its Python side asks;
    each call still checks that nothing set truncation or padding since.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not is_stock_fast(tokenizer):
        return None
    if backend.encode_special_tokens != bool(getattr(tokenizer, "split_special_tokens", False)):
        return None
    return backend


class TextTokenizer(LimitedTokenizer):
    """Wraps a fast tokenizer with the encoder's ``max_tokens`` limit.

    Called from the server's decode threads, and on the event loop for short
    text-only inputs (a few hundred characters: cheaper than a hop to the
    pool); safe from several threads at once.

    ``truncates_by_default`` is the family's own policy for a text over the
    limit (``models.torch_free.text_ids.LimitedTokenizer``, which holds the
    limit and the cut). Subclasses for other libraries
    (``models.families.open_clip_tokenizer``) override ``token_ids`` and
    ``identity``.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_tokens: int, *,
                 truncates_by_default: bool = False) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.truncates_by_default = truncates_by_default
        self.pad_token_id: int = int(tokenizer.pad_token_id or 0)
        turn_off_whole_text_cache(tokenizer)
        self._backend = direct_backend(tokenizer)

    @classmethod
    def for_encoder(cls, tokenizer: PreTrainedTokenizerBase, encoder_max_tokens: int, *,
                    truncates_by_default: bool = False) -> "TextTokenizer":
        """The tokenizer limited to what both it (``model_max_length``) and the encoder take."""
        model_max_length = int(getattr(tokenizer, "model_max_length", 10**9) or 10**9)
        return cls(tokenizer, min(encoder_max_tokens, model_max_length), truncates_by_default=truncates_by_default)

    def token_ids(self, text: str) -> list[int]:
        """Every token id of ``text`` with the special tokens, untruncated."""
        backend = self._backend
        if backend is not None and backend.truncation is None and backend.padding is None:
            return backend.encode(text, add_special_tokens=True).ids  # what the call below gives (direct_backend)
        return self.tokenizer(text, add_special_tokens=True, verbose=False)["input_ids"]

    def identity(self) -> str:
        """A canonical string naming this tokenization (part of the model's fingerprint)."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return backend.to_str()
        return repr(sorted(self.tokenizer.get_vocab().items()))
