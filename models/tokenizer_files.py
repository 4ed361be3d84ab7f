"""A served tokenizer as files, and the same tokenizer built back from them without the model libraries.

An API process in front of the engine (``--api-workers N``) tokenizes every
text before the engine sees it, so it needs the engine's tokenizer, but not
its weights, nor transformers or open_clip (each imports torch). The engine
packs the tokenizer it loaded into ``TokenizerFiles`` (plain bytes and
strings, so a control frame carries it without pickle;
``models.tokenizer_packing``) and the API process unpacks it here, with
torch-free readers of the same files:

    kind                    files                               built back with
    "tokenizer_json"        the fast tokenizer's Rust backend   tokenizers.Tokenizer.from_str
                            (tokenizer.json)                    (models.torch_free.json_tokenizer)
    "siglip_sentencepiece"  spiece.model + its special tokens   sentencepiece
                            (special_tokens.json)               (models.torch_free.siglip_sentencepiece)
    "open_clip_hf"          the wrapped tokenizer.json          tokenizers + open_clip's cleaning
    "open_clip_simple"      the BPE merges (open_clip's gzip)   models.torch_free.clip_bpe

``identity`` is the engine's ``TextTokenizer.identity()`` (the string its
fingerprint hashes): the tokenizer built back must name itself the same, or
unpacking fails (``ModelRepositoryError``) rather than tokenize otherwise than
the engine does. The limit (``max_tokens``), the family's truncation policy
and the pad id travel as they are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from models.errors import ModelRepositoryError
from models.torch_free.text_ids import LimitedTokenizer

TOKENIZER_JSON, SIGLIP_SENTENCEPIECE = "tokenizer_json", "siglip_sentencepiece"
OPEN_CLIP_HF, OPEN_CLIP_SIMPLE = "open_clip_hf", "open_clip_simple"
JSON_FILE = "tokenizer.json"
SPIECE_FILE, SPECIALS_FILE = "spiece.model", "special_tokens.json"
BPE_FILE = "bpe_merges.txt.gz"  # SimpleTokenizer skips the first line and reads one merge per line after it


@dataclass(frozen=True)
class TokenizerFiles:
    """One tokenizer as files (name -> bytes) and the few settings its files do not hold.

    Attributes:
        kind: Which reader builds it back (the module's table).
        files: What that reader reads, by file name (no directories).
        identity: The packed tokenizer's ``identity()``; the unpacked one must give the same.
        max_tokens: The server's text limit (the encoder's and the tokenizer's, whichever is lower).
        truncates_by_default: The family cuts a too-long text whatever the request says.
        clean: open_clip's text cleaning ("lower", "whitespace", "canonicalize"); "" otherwise.
        special_tokens: open_clip SimpleTokenizer's added special tokens (after its own two).
        pad_token_id: The id the engine pads with.
        split_special_tokens: A fast tokenizer reads special tokens in a text as plain text.
    """

    kind: str
    files: dict[str, bytes]
    identity: str
    max_tokens: int
    truncates_by_default: bool
    clean: str = ""
    special_tokens: tuple[str, ...] = ()
    pad_token_id: int = 0
    split_special_tokens: bool = False


def unpack_tokenizer(files: TokenizerFiles) -> LimitedTokenizer:
    """The tokenizer ``files`` holds; ``ModelRepositoryError`` unless it is the one that was packed."""
    for name in files.files:
        if Path(name).name != name:
            raise ModelRepositoryError(f"tokenizer file name {name!r} is not a plain file name")
    try:
        tokenizer = _build(files)
    except ModelRepositoryError:
        raise
    except Exception as e:  # noqa: BLE001 - the readers' own errors (tokenizers raises a bare Exception)
        raise ModelRepositoryError(f"cannot build the {files.kind} tokenizer back from its files: {e}") from e
    if tokenizer.identity() != files.identity:
        raise ModelRepositoryError(f"the {files.kind} tokenizer built back from its files tokenizes otherwise than "
                                   "the one packed (its identity differs)")
    return tokenizer


def _file(files: TokenizerFiles, name: str) -> bytes:
    if name not in files.files:
        raise ModelRepositoryError(f"the {files.kind} tokenizer arrived without its file {name!r}")
    return files.files[name]


def _build(files: TokenizerFiles) -> LimitedTokenizer:
    """The kind's reader, imported only when its kind arrives: an API process that died is started again,
    and tokenizers, sentencepiece and ftfy each take a noticeable part of its start to import."""
    if files.kind == TOKENIZER_JSON:
        from models.torch_free.json_tokenizer import JsonTokenizer

        return JsonTokenizer(_file(files, JSON_FILE).decode(), files.max_tokens,
                             truncates_by_default=files.truncates_by_default, pad_token_id=files.pad_token_id,
                             encode_special_tokens=files.split_special_tokens)
    if files.kind == SIGLIP_SENTENCEPIECE:
        from models.torch_free.siglip_sentencepiece import SiglipSentencePieceTokenizer, SiglipSettings, SpecialToken

        settings = json.loads(_file(files, SPECIALS_FILE))
        siglip = SiglipSettings(
            special_tokens=tuple(SpecialToken(t["content"], int(t["id"]), bool(t["lstrip"]), bool(t["rstrip"]))
                                 for t in settings["special_tokens"]),
            eos_token=settings["eos_token"], unk_token=settings["unk_token"],
            is_lower_case=bool(settings["do_lower_case"]))
        return SiglipSentencePieceTokenizer(_file(files, SPIECE_FILE), siglip, files.max_tokens,
                                            truncates_by_default=files.truncates_by_default,
                                            pad_token_id=files.pad_token_id)
    from models.torch_free.clip_bpe import CLEAN_FUNCTIONS, CLEAN_NAMES, ClipBpeTokenizer
    from models.torch_free.json_tokenizer import JsonTokenizer

    if files.clean not in CLEAN_FUNCTIONS:
        raise ModelRepositoryError(f"unknown open_clip text cleaning {files.clean!r}")
    if files.kind == OPEN_CLIP_HF:
        return JsonTokenizer(_file(files, JSON_FILE).decode(), files.max_tokens, truncates_by_default=True,
                             pad_token_id=files.pad_token_id, encode_special_tokens=files.split_special_tokens,
                             clean=CLEAN_FUNCTIONS[files.clean],
                             identity_prefix=f"open_clip.HFTokenizer|{CLEAN_NAMES[files.clean]}|")
    if files.kind == OPEN_CLIP_SIMPLE:
        return ClipBpeTokenizer(_file(files, BPE_FILE), files.max_tokens, clean=files.clean,
                                additional_special_tokens=files.special_tokens)
    raise ModelRepositoryError(f"unknown tokenizer kind {files.kind!r}")
