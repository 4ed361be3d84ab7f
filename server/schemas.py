"""Pydantic models of the HTTP API (the edge only; inside, frozen dataclasses)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class EncodedImage(BaseModel):
    """An encoded image file (PNG, JPEG, WebP, GIF, TIFF, BMP...) in base64."""

    model_config = ConfigDict(extra="forbid")
    b64: str = Field(min_length=1, description="Base64 of the encoded image file.")


class RawPixels(BaseModel):
    """Raw uint8 RGB pixels, row-major [H, W, 3], in base64."""

    model_config = ConfigDict(extra="forbid")
    shape: list[int] = Field(min_length=3, max_length=3, description="[H, W, 3]")
    b64: str = Field(min_length=1, description="Base64 of H*W*3 bytes.")


class RawImage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    uint8: RawPixels


class InferRequest(BaseModel):
    """Body of ``POST /v1/infer`` (JSON); at least one of ``text`` and ``image``."""

    model_config = ConfigDict(extra="forbid")
    text: str | None = Field(None, description="Text to embed (and to fuse with the image).")
    image: EncodedImage | RawImage | None = Field(None, description="An encoded image or raw pixels.")
    priority: Literal["high", "normal", "low"] = "normal"
    timeout_ms: int | None = Field(None, ge=1, le=3_600_000, description="Deadline from arrival.")
    truncate: bool = Field(False, description="Cut a too-long text to the model's limit instead of 422.")
    use_cache: bool = Field(True, description="false: neither read nor write the segment cache.")


class ModelInfo(BaseModel):
    name: str
    fingerprint: str
    family: str = Field(description="Which library defines the towers: mmserve (presets), siglip, clip, open_clip.")
    score: str | None = Field(
        description="What the answer's `score` is: siglip_sigmoid (a probability), clip_logit (a logit), or null "
                    "when the model has no calibrated image-text score (no `score` is sent).")
    normalized_embeddings: bool = Field(description="Whether the embeddings are L2-normalised.")
    fusion_head: Literal["trained", "untrained"] = Field(
        description="An untrained fusion head sends no `match_score`; `fused_embedding` is then not meaningful.")


class TextInfo(BaseModel):
    num_tokens: int = Field(description="Tokens the model saw (after truncation).")
    truncated: bool
    num_tokens_before_truncation: int


class InferResponse(BaseModel):
    """Answer of ``POST /v1/infer``: the outputs of the request's route."""

    id: str
    route: Literal["text", "vision", "fusion"]
    model: ModelInfo
    image_embedding: list[float] | None = None
    text_embedding: list[float] | None = None
    fused_embedding: list[float] | None = None
    score: float | None = Field(None, description="The model's own calibrated score (see model.score).")
    match_score: float | None = Field(None, description="The trained fusion head's match probability.")
    text: TextInfo | None = None
    cache: dict[str, str] = Field(default_factory=dict)
    timings_ms: dict[str, float]
