"""Image and text towers of pretrained image–text models, computed by their own library.

Each tower calls the method its library defines for the embedding, so the
embedding is the reference's by construction, and takes the token states the
cross-modal layer needs from the same forward pass:

    family   image embedding                     text embedding
    siglip   SiglipModel.get_image_features      SiglipModel.get_text_features
    clip     CLIPModel.get_image_features        CLIPModel.get_text_features

In transformers 5 both methods return the tower's ``BaseModelOutputWithPooling``:
``pooler_output`` is the embedding (after the projection, for CLIP) and
``last_hidden_state`` the tokens.

Both towers hold the one pretrained model (its image and text weights live in
one module). ``nn.Module`` registers it under each tower; ``parameters()``
lists a shared weight once, and the fingerprint skips tensors it has hashed.
"""

from __future__ import annotations

import torch
from torch import nn

from models.loading.config import PreprocessConfig
from models.text import TextEncoder
from models.vision import UInt8VisionEncoder


class TransformersVisionEncoder(UInt8VisionEncoder):
    """The image side of a transformers ``SiglipModel`` / ``CLIPModel``."""

    def __init__(self, model: nn.Module, preprocess: PreprocessConfig) -> None:
        image_size = int(model.config.vision_config.image_size)
        if image_size != preprocess.input_size:
            raise ValueError(f"the vision tower expects {image_size} px input but its image "
                             f"processor produces {preprocess.input_size} px")
        tokens, embedding = _probe(model.get_image_features,
                                   pixel_values=torch.zeros(1, 3, image_size, image_size))
        super().__init__(preprocess, embed_dim=tokens.shape[-1], embedding_dim=embedding.shape[-1],
                         num_tokens=tokens.shape[1])
        self.model = model

    def features(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model.get_image_features(pixel_values=pixels)
        return out.last_hidden_state, out.pooler_output  # (B, Lv, d_v), (B, E_v)


class TransformersTextEncoder(TextEncoder):
    """The text side of a transformers ``SiglipModel`` / ``CLIPModel``.

    SigLIP pools the last position and was trained on texts padded to its
    full length (``padding="max_length"``, as its model card says), so its
    texts are always padded to ``max_position_embeddings``; CLIP pools the
    end-of-text token under a causal mask, so its padding is free.
    """

    def __init__(self, model: nn.Module) -> None:
        text_config = model.config.text_config
        is_siglip = model.config.model_type == "siglip"
        tokens, embedding = _probe(model.get_text_features, input_ids=torch.zeros(1, 1, dtype=torch.long),
                                   attention_mask=torch.ones(1, 1, dtype=torch.long))
        super().__init__(model, hidden_size=tokens.shape[-1], embedding_dim=embedding.shape[-1],
                         max_tokens=text_config.max_position_embeddings,
                         fixed_length=text_config.max_position_embeddings if is_siglip else None,
                         vocab_size=text_config.vocab_size)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state, out.pooler_output  # (B, Lt, d_t), (B, E_t)


def _probe(method, **inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One tiny forward (on the CPU, at load) to read the token and embedding widths the library gives."""
    with torch.inference_mode():
        out = method(**inputs)
    return out.last_hidden_state, out.pooler_output
