"""A served tokenizer as the files its own library saves, and the same tokenizer built back from them.

An API process in front of the engine (``--api-workers N``) tokenizes every
text before the engine sees it, so it needs the engine's tokenizer, but not
its weights. The engine packs the tokenizer it loaded into ``TokenizerFiles``
(plain bytes and strings, so a control frame carries it without pickle) and
the API process unpacks it:

    kind                 files                                  built back with
    "transformers"       save_pretrained output                 AutoTokenizer.from_pretrained (local files)
    "open_clip_hf"       the wrapped tokenizer's save_pretrained open_clip's HFTokenizer(dir, clean=...)
    "open_clip_simple"   the BPE merges (open_clip's gzip format) open_clip's SimpleTokenizer(bpe, specials, clean)

``identity`` is the engine's ``TextTokenizer.identity()`` (the string its
fingerprint hashes): the tokenizer built back must name itself the same, or
unpacking fails (``ModelRepositoryError``) rather than tokenize otherwise than
the engine does. The limit (``max_tokens``) and the family's truncation policy
travel as they are.
"""

from __future__ import annotations

import gzip
import tempfile
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoTokenizer

from models.errors import ModelRepositoryError
from models.families.open_clip_tokenizer import OpenClipTokenizer
from models.tokenizer import TextTokenizer

TRANSFORMERS, OPEN_CLIP_HF, OPEN_CLIP_SIMPLE = "transformers", "open_clip_hf", "open_clip_simple"
BPE_FILE = "bpe_merges.txt.gz"  # SimpleTokenizer skips the first line and reads one merge per line after it
_CLEAN_KINDS = {"_clean_lower": "lower", "_clean_whitespace": "whitespace", "_clean_canonicalize": "canonicalize"}


@dataclass(frozen=True)
class TokenizerFiles:
    """One tokenizer as files (name -> bytes) and the few settings its files do not hold.

    Attributes:
        kind: Which library builds it back (the module's table).
        files: What that library saved, by file name (no directories).
        identity: The packed tokenizer's ``identity()``; the unpacked one must give the same.
        max_tokens: The server's text limit (the encoder's and the tokenizer's, whichever is lower).
        truncates_by_default: The family cuts a too-long text whatever the request says.
        clean: open_clip's text cleaning ("lower", "whitespace", "canonicalize"); "" for transformers.
        special_tokens: open_clip SimpleTokenizer's added special tokens (after its own two).
    """

    kind: str
    files: dict[str, bytes]
    identity: str
    max_tokens: int
    truncates_by_default: bool
    clean: str = ""
    special_tokens: tuple[str, ...] = ()


def pack_tokenizer(tokenizer: TextTokenizer) -> TokenizerFiles:
    """``tokenizer`` as files (its library's own ``save_pretrained``, or open_clip's BPE merges)."""
    if type(tokenizer) is TextTokenizer:
        return TokenizerFiles(TRANSFORMERS, _saved_files(tokenizer.tokenizer), tokenizer.identity(),
                              tokenizer.max_tokens, tokenizer.truncates_by_default)
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
    return TokenizerFiles(OPEN_CLIP_HF, _saved_files(wrapped.tokenizer), tokenizer.identity(),
                          tokenizer.max_tokens, True, clean)


def unpack_tokenizer(files: TokenizerFiles) -> TextTokenizer:
    """The tokenizer ``files`` holds; ``ModelRepositoryError`` unless it is the one that was packed."""
    with tempfile.TemporaryDirectory(prefix="mmserve-tokenizer-") as directory:
        for name, data in files.files.items():
            if Path(name).name != name:
                raise ModelRepositoryError(f"tokenizer file name {name!r} is not a plain file name")
            (Path(directory) / name).write_bytes(data)
        try:
            tokenizer = _build(files, directory)
        except (OSError, ValueError) as e:
            raise ModelRepositoryError(f"cannot build the {files.kind} tokenizer back from its files: {e}") from e
    if tokenizer.identity() != files.identity:
        raise ModelRepositoryError(f"the {files.kind} tokenizer built back from its files tokenizes otherwise than "
                                   "the one packed (its identity differs)")
    return tokenizer


def _build(files: TokenizerFiles, directory: str) -> TextTokenizer:
    if files.kind == TRANSFORMERS:
        return TextTokenizer(AutoTokenizer.from_pretrained(directory, local_files_only=True), files.max_tokens,
                             truncates_by_default=files.truncates_by_default)
    if files.kind not in (OPEN_CLIP_HF, OPEN_CLIP_SIMPLE):
        raise ModelRepositoryError(f"unknown tokenizer kind {files.kind!r}")
    import open_clip.tokenizer as oc_tokenizer

    if files.kind == OPEN_CLIP_HF:
        wrapped = oc_tokenizer.HFTokenizer(directory, context_length=files.max_tokens, clean=files.clean,
                                           local_files_only=True)
    else:
        wrapped = oc_tokenizer.SimpleTokenizer(str(Path(directory) / BPE_FILE),
                                               additional_special_tokens=list(files.special_tokens) or None,
                                               context_length=files.max_tokens, clean=files.clean)
    return OpenClipTokenizer(wrapped, files.max_tokens)


def _saved_files(tokenizer: object) -> dict[str, bytes]:
    """What ``save_pretrained`` writes for this transformers tokenizer, by file name."""
    with tempfile.TemporaryDirectory(prefix="mmserve-tokenizer-") as directory:
        tokenizer.save_pretrained(directory)  # type: ignore[attr-defined]
        return {path.name: path.read_bytes() for path in sorted(Path(directory).iterdir()) if path.is_file()}
