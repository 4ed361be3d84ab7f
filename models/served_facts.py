"""What serving needs to know about the loaded model, without the model: ``ServedModelFacts``.

The HTTP side (protocol answers and checks, the joint-token budget, traces)
reads a handful of facts about the model it fronts: its configuration
(name, preprocessing), the ``model`` object of every answer, the cache keys'
preprocessing id, and a few widths and counts of its towers. A single process
reads them off its loaded bundle (``served_model_facts``); the engine of
``--api-workers N`` sends the same value to each API process, which loads no
weights (``server.workers``), so both paths answer from one code path.

    fact                  read from the loaded model        read by
    num_image_tokens      model.vision.num_tokens           the joint-token budget (router.joint_budget)
    image_embedding_dim   model.vision.embedding_dim        KServe v2 output shapes, OpenAI ``dimensions``
    text_embedding_dim    model.text.embedding_dim          of an image item and of a text item
    max_text_tokens       tokenizer.max_tokens              the joint-token budget's default
    device                model.device                      batch spans' device attribute
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from models.loading.config import ModelConfig
from models.torch_free.description import ModelDescription

if TYPE_CHECKING:
    from models.loading.repository import ModelBundle


@dataclass(frozen=True)
class ServedModelFacts:
    """The loaded model's configuration, description and shape facts (the module's table)."""

    config: ModelConfig
    description: ModelDescription
    preprocess_id: str  # ``config.preprocess.identity()``: part of every image segment's cache key
    num_image_tokens: int
    image_embedding_dim: int
    text_embedding_dim: int
    max_text_tokens: int
    device: str  # "cpu", "cuda:0"

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def fingerprint(self) -> str:
        return self.description.fingerprint


def served_model_facts(bundle: ModelBundle) -> ServedModelFacts:
    """The facts of a loaded bundle, read once at start-up."""
    model = bundle.model
    return ServedModelFacts(
        config=bundle.config, description=bundle.describe(), preprocess_id=bundle.config.preprocess.identity(),
        num_image_tokens=int(model.vision.num_tokens), image_embedding_dim=int(model.vision.embedding_dim),
        text_embedding_dim=int(model.text.embedding_dim), max_text_tokens=int(bundle.tokenizer.max_tokens),
        device=str(model.device),
    )
