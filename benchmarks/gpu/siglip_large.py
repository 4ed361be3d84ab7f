"""A random SigLIP at the shape of ``google/siglip-large-patch16-256``, and the inputs the GPU benchmark feeds it.

The figures depend on the shape, not the weights (which cannot be downloaded
there): transformers builds the model from the checkpoint's config values
(``SiglipShape``) directly on the GPU, and ``save_pretrained`` writes it with
a real SentencePiece tokenizer and the checkpoint's processor settings
(256 px bicubic, mean = std = 0.5), so ``mmserve serve --model DIR`` loads it
as it would the Hub snapshot.
"""

from __future__ import annotations

import io
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SIGLIP_LARGE_ID = "google/siglip-large-patch16-256"


@dataclass(frozen=True)
class SiglipShape:
    image_size: int = 256
    patch_size: int = 16
    hidden_size: int = 1024
    intermediate_size: int = 4096
    num_layers: int = 24
    num_heads: int = 16
    vocab_size: int = 32000
    max_positions: int = 64


def write_random_siglip(directory: Path, shape: SiglipShape = SiglipShape(), seed: int = 0,
                        device: str = "cuda") -> Path:
    """``save_pretrained`` output of a random SigLIP of ``shape`` (built on ``device``), with its tokenizer."""
    import torch
    import transformers
    from transformers import SiglipConfig, SiglipModel, SiglipTextConfig, SiglipTokenizer, SiglipVisionConfig

    from benchmarks.random_pretrained import sentencepiece_model

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    spiece = directory / "spiece.model"
    spiece.write_bytes(sentencepiece_model(vocab_size=256, repeats=8))
    tokenizer = SiglipTokenizer(vocab_file=str(spiece), model_max_length=shape.max_positions)
    text = SiglipTextConfig(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
                            intermediate_size=shape.intermediate_size, num_hidden_layers=shape.num_layers,
                            num_attention_heads=shape.num_heads, max_position_embeddings=shape.max_positions,
                            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    vision = SiglipVisionConfig(image_size=shape.image_size, patch_size=shape.patch_size,
                                hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
                                num_hidden_layers=shape.num_layers, num_attention_heads=shape.num_heads)
    torch.manual_seed(seed)
    with torch.device(device):
        model = SiglipModel(SiglipConfig(text_config=text.to_dict(), vision_config=vision.to_dict())).eval()
    with torch.no_grad():
        model.logit_scale.fill_(float(np.log(10.0)))
        model.logit_bias.fill_(-10.0)  # SigLIP's initial values
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    # The Pillow processor where this transformers has it (what the tests' models use), else the default one.
    processor_class = getattr(transformers, "SiglipImageProcessorPil", None) or transformers.SiglipImageProcessor
    processor_class(size={"height": shape.image_size, "width": shape.image_size}).save_pretrained(str(directory))
    return directory


def model_directory(model_dir: Path | None) -> Path:
    """``model_dir`` (``--model-dir``), or a random SigLIP of this shape written to a new temporary directory."""
    return model_dir or write_random_siglip(Path(tempfile.mkdtemp(prefix="siglip-large-")) / "siglip-large")


def random_images(num_images: int, size: int, seed: int = 0) -> np.ndarray:
    """(N, S, S, 3) uint8 of smooth random fields: distinct per image, and JPEG-compressible like photographs."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (num_images, 8, 8, 3)).astype(np.float32)  # (N, 8, 8, 3)
    y = np.linspace(0, 7, size)
    i0 = np.floor(y).astype(int).clip(0, 6)
    t = (y - i0)[None, :, None, None]  # (1, S, 1, 1)
    rows = coarse[:, i0] * (1 - t) + coarse[:, i0 + 1] * t  # (N, S, 8, 3)
    t = (y - i0)[None, None, :, None]  # (1, 1, S, 1)
    fields = rows[:, :, i0] * (1 - t) + rows[:, :, i0 + 1] * t  # (N, S, S, 3)
    noise = rng.normal(0, 6, fields.shape)
    return (fields + noise).clip(0, 255).astype(np.uint8)


def jpeg_bytes(images: np.ndarray, quality: int = 90) -> list[bytes]:
    """Each (S, S, 3) uint8 image as a baseline JPEG."""
    from PIL import Image

    encoded = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
        encoded.append(buffer.getvalue())
    return encoded
