"""The engine's tokenizer packed as ``models.tokenizer_files.TokenizerFiles`` for the API processes.

Engine-side: it reads the loaded transformers or open_clip tokenizer (which
an API process never imports) and writes what the torch-free readers of
``models.tokenizer_files`` need. A tokenizer whose ids those readers would
not reproduce (a Python tokenizer other than SigLIP's, a fast tokenizer
subclass that encodes in Python, open_clip text cleaning of its own) is
refused here, at start-up, rather than served with other ids.
"""

from __future__ import annotations

import gzip
import json

from transformers import SiglipTokenizer

from models.errors import ModelRepositoryError
from models.families.open_clip_tokenizer import OpenClipTokenizer
from models.tokenizer import TextTokenizer, is_stock_fast
from models.tokenizer_files import (
    BPE_FILE, JSON_FILE, OPEN_CLIP_HF, OPEN_CLIP_SIMPLE, SIGLIP_SENTENCEPIECE, SPECIALS_FILE, SPIECE_FILE,
    TOKENIZER_JSON, TokenizerFiles,
)

_CLEAN_KINDS = {"_clean_lower": "lower", "_clean_whitespace": "whitespace", "_clean_canonicalize": "canonicalize"}


def pack_tokenizer(tokenizer: TextTokenizer) -> TokenizerFiles:
    """``tokenizer`` as files its torch-free reader builds back (``models.tokenizer_files``)."""
    if type(tokenizer) is TextTokenizer:
        wrapped = tokenizer.tokenizer
        if is_stock_fast(wrapped):
            return TokenizerFiles(TOKENIZER_JSON, {JSON_FILE: wrapped.backend_tokenizer.to_str().encode()},
                                  tokenizer.identity(), tokenizer.max_tokens, tokenizer.truncates_by_default,
                                  pad_token_id=tokenizer.pad_token_id,
                                  split_special_tokens=bool(getattr(wrapped, "split_special_tokens", False)))
        if type(wrapped) is SiglipTokenizer:
            return _pack_siglip(tokenizer, wrapped)
        raise ModelRepositoryError(f"a {type(wrapped).__name__} cannot be sent to the API processes (they read "
                                   "fast tokenizers' tokenizer.json, SigLIP's SentencePiece and open_clip's BPE)")
    if not isinstance(tokenizer, OpenClipTokenizer):
        raise ModelRepositoryError(f"a {type(tokenizer).__name__} cannot be sent to the API processes")
    wrapped = tokenizer.tokenizer
    clean = _CLEAN_KINDS.get(wrapped.clean_fn.__name__)
    if clean is None:
        raise ModelRepositoryError(f"open_clip text cleaning {wrapped.clean_fn.__name__!r} cannot be sent to the "
                                   "API processes")
    if hasattr(wrapped, "bpe_ranks"):  # SimpleTokenizer
        merges = sorted(wrapped.bpe_ranks, key=wrapped.bpe_ranks.__getitem__)
        text = "\n".join(["#version: mmserve", *(" ".join(merge) for merge in merges)])  # no trailing newline
        num_base = 2 * len(wrapped.byte_encoder) + len(merges)  # bytes, bytes + "</w>", merges, then specials
        specials = tuple(token for token, _ in sorted(wrapped.encoder.items(), key=lambda item: item[1])[num_base:])
        if specials[:2] != ("<start_of_text>", "<end_of_text>"):
            raise ModelRepositoryError(f"open_clip SimpleTokenizer with special tokens {specials[:2]} cannot be sent "
                                       "to the API processes")
        return TokenizerFiles(OPEN_CLIP_SIMPLE, {BPE_FILE: gzip.compress(text.encode(), mtime=0)},
                              tokenizer.identity(), tokenizer.max_tokens, True, clean, specials[2:])
    hf = wrapped.tokenizer
    if not is_stock_fast(hf):
        raise ModelRepositoryError(f"open_clip HFTokenizer over a {type(hf).__name__} cannot be sent to the API "
                                   "processes (only a fast tokenizer's tokenizer.json travels)")
    return TokenizerFiles(OPEN_CLIP_HF, {JSON_FILE: hf.backend_tokenizer.to_str().encode()}, tokenizer.identity(),
                          tokenizer.max_tokens, True, clean, pad_token_id=tokenizer.pad_token_id,
                          split_special_tokens=bool(getattr(hf, "split_special_tokens", False)))


def _pack_siglip(tokenizer: TextTokenizer, wrapped: SiglipTokenizer) -> TokenizerFiles:
    """SigLIP's SentencePiece model and the special tokens its Python side splits a text at."""
    if wrapped.sp_model_kwargs or wrapped.split_special_tokens:
        raise ModelRepositoryError("a SiglipTokenizer with SentencePiece sampling or split special tokens cannot be "
                                   "sent to the API processes")
    specials = []
    for token_id, added in sorted(wrapped.added_tokens_decoder.items()):
        if added.single_word:
            raise ModelRepositoryError(f"SigLIP added token {added.content!r} is single-word, which the API "
                                       "processes do not read")
        specials.append({"content": added.content, "id": int(token_id), "lstrip": bool(added.lstrip),
                         "rstrip": bool(added.rstrip)})
    settings = {"special_tokens": specials, "eos_token": str(wrapped.eos_token), "unk_token": str(wrapped.unk_token),
                "do_lower_case": bool(wrapped.do_lower_case)}
    return TokenizerFiles(SIGLIP_SENTENCEPIECE, {SPIECE_FILE: wrapped.sp_model.serialized_model_proto(),
                                                 SPECIALS_FILE: json.dumps(settings, sort_keys=True).encode()},
                          tokenizer.identity(), tokenizer.max_tokens, tokenizer.truncates_by_default,
                          pad_token_id=tokenizer.pad_token_id)


