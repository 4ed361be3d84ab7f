"""Typed errors of the models package.

The server maps these to HTTP answers; nothing here knows about HTTP.
"""

from __future__ import annotations


class ModelError(Exception):
    """Base class for everything the models package raises on purpose."""


class ModelRepositoryError(ModelError):
    """A model repository is missing, malformed or does not match its config.

    The message always names the offending file, key or tensor so an operator
    can fix the repository without reading code.
    """


class DeviceSettingError(ModelError):
    """A device, dtype or decode device this machine cannot run (``--dtype float16`` without CUDA).

    Raised at start-up, before any weight is read; the message names the
    setting, why it cannot run here and what to use instead.
    """


class UnknownPresetError(ModelError):
    """A preset name that is not one of ``models.families.presets.PRESET_NAMES``."""


class TextTooLongError(ModelError):
    """A text has more tokens than the text encoder's position table allows."""

    def __init__(self, num_tokens: int, max_tokens: int) -> None:
        super().__init__(
            f"text is {num_tokens} tokens long; the model accepts at most {max_tokens} "
            "(send \"truncate\": true to cut it to the limit)"
        )
        self.num_tokens = num_tokens
        self.max_tokens = max_tokens


class TrainingDataError(ModelError):
    """The pairs file of ``mmserve train-fusion`` cannot be trained on.

    The message names the file and, where one line is at fault, its line
    number (``pairs.jsonl:12: ...``), as compilers do, so it can be fixed in
    an editor.
    """


class OnnxExportError(ModelError):
    """A tower could not be exported to ONNX, or its graph does not compute what torch computes.

    ``--runtime auto`` then serves torch and logs this message; ``--runtime
    onnxruntime`` stops with it.
    """


class QuantizationError(ModelError):
    """``--quantize int8`` cannot be served as asked: not under this runtime, or its embeddings fall below
    ``quantize_min_cosine`` of float32's. The server stops with the message; it never serves int8 silently
    worse, nor float32 when int8 was asked for."""
