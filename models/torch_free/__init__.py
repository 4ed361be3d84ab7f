"""Model pieces an API process uses, written without torch, transformers, timm or open_clip.

An API process (``--api-workers N``) tokenizes, applies the joint-token
budget and keys segments, but loads no weights: it must not pay for the
model libraries (hundreds of MiB and seconds of CPU per process). What it
needs of ``models`` lives here, or in the few other modules the import
contract in pyproject.toml lists as API-side (docs/architecture.md has the
table). The engine-side modules (``models.tokenizer``,
``models.tokenizer_packing``, ...) build on these, never the other way.
"""
