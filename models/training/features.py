"""The frozen towers' outputs that the fusion head trains on, computed once.

Training changes only the head, so every distinct image and text goes
through its tower exactly once (batched, under ``inference_mode``) and the
head's epochs then read these tensors, kept on the CPU:

    image_tokens  (N_img, Lv, d_v)   every token of each distinct image (keys and values come from these)
    image_pooled  (N_img, E_v)       the image embedding as served (L2-normalised where the model serves it so)
    text_tokens   (T, d_t)           the real tokens of every distinct text, packed (queries come from these)
    text_offsets  (N_txt + 1,)       text i is text_tokens[text_offsets[i] : text_offsets[i + 1]]
    text_pooled   (N_txt, E_t)       the text embedding as served

Images are read from their files as the server decodes request bytes
(EXIF orientation, ``models.rgb``) and become model input by the model's
own ``models.preprocessing``; texts are tokenized by the model's tokenizer,
cut to its limit as a request with ``truncate`` would be, and padded the way
the serving runner pads them (a fixed-length tower to its length). So the
head learns from what serving computes.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps

from models.errors import TrainingDataError
from models.training.pairs import ImageTextPair
from models.multimodal import MultimodalModel
from models.preprocessing import resize_to_model_input
from models.training.progress import ProgressBar, ProgressFactory, silent_progress
from models.rgb import to_rgb
from models.tokenizer import TextTokenizer

@dataclass(frozen=True)
class TowerFeatures:
    """The towers' outputs for each distinct image and text (module docstring); rows found by key."""

    image_rows: dict[Path, int]
    image_tokens: torch.Tensor  # (N_img, Lv, d_v)
    image_pooled: torch.Tensor  # (N_img, E_v)
    text_rows: dict[str, int]
    text_tokens: torch.Tensor  # (T, d_t)
    text_offsets: torch.Tensor  # (N_txt + 1,) int64
    text_pooled: torch.Tensor  # (N_txt, E_t)

    def packed_text_rows(self, text_indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of ``text_tokens`` for texts ``text_indices`` (B,), in order (T_b,), and their cu_seqlens (B+1,)."""
        starts = self.text_offsets[text_indices]  # (B,)
        lengths = self.text_offsets[text_indices + 1] - starts  # (B,)
        cu_seqlens = torch.zeros(text_indices.numel() + 1, dtype=torch.int32)  # (B+1,)
        cu_seqlens[1:] = torch.cumsum(lengths, dim=0)
        item_of_row = torch.repeat_interleave(torch.arange(text_indices.numel()), lengths)  # (T_b,)
        position = torch.arange(int(lengths.sum())) - (cu_seqlens[:-1].to(torch.long))[item_of_row]  # (T_b,)
        return starts[item_of_row] + position, cu_seqlens


def read_model_input(pair: ImageTextPair, model: MultimodalModel, pairs_path: Path) -> np.ndarray:
    """The pair's image file as the model's (S, S, 3) uint8 input; ``TrainingDataError`` names the line."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(pair.image) as opened:
                opened.load()
                image = to_rgb(ImageOps.exif_transpose(opened))
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as e:
        raise TrainingDataError(f"{pairs_path}:{pair.line_number}: cannot read image {pair.image}: {e}") from e
    return resize_to_model_input(image, model.config.preprocess)  # (S, S, 3)


def _served(model: MultimodalModel, embedding: torch.Tensor) -> torch.Tensor:
    """(B, E) -> (B, E) float32 on the CPU, L2-normalised where the model serves it normalised."""
    embedding = embedding.to("cpu", torch.float32)
    return F.normalize(embedding, dim=-1) if model.normalize_embeddings else embedding


@torch.inference_mode()
def _encode_images(model: MultimodalModel, pairs: Sequence[ImageTextPair], pairs_path: Path, batch_size: int,
                   progress: ProgressBar) -> tuple[dict[Path, int], torch.Tensor, torch.Tensor]:
    first_pair = {pair.image: pair for pair in reversed(pairs)}  # the first line naming each image
    images = sorted(first_pair)
    tokens, pooled = [], []
    for start in range(0, len(images), batch_size):
        chunk = [read_model_input(first_pair[image], model, pairs_path) for image in images[start: start + batch_size]]
        pixels = torch.from_numpy(np.stack(chunk))  # (b, S, S, 3) uint8
        out = model.vision(pixels.to(model.device))
        tokens.append(out.tokens.to("cpu", torch.float32))  # (b, Lv, d_v)
        pooled.append(_served(model, out.pooled))  # (b, E_v)
        progress.update(len(chunk))
    return {image: row for row, image in enumerate(images)}, torch.cat(tokens), torch.cat(pooled)


@torch.inference_mode()
def _encode_texts(model: MultimodalModel, tokenizer: TextTokenizer, texts: Sequence[str], batch_size: int,
                  progress: ProgressBar) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    token_ids = [tokenizer.encode(text, truncate=True).token_ids for text in texts]
    tokens, pooled, lengths = [], [], []
    for start in range(0, len(texts), batch_size):
        chunk = token_ids[start: start + batch_size]
        width = model.text.fixed_length or max(len(ids) for ids in chunk)
        input_ids = torch.full((len(chunk), width), tokenizer.pad_token_id, dtype=torch.long)  # (b, Lt)
        attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)  # (b, Lt)
        for row, ids in enumerate(chunk):
            input_ids[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            attention_mask[row, : len(ids)] = 1
        out = model.text(input_ids.to(model.device), attention_mask.to(model.device))
        states = out.tokens.to("cpu", torch.float32)  # (b, Lt, d_t)
        tokens.extend(states[row, : len(ids)] for row, ids in enumerate(chunk))  # (Lt_i, d_t) each
        lengths.extend(len(ids) for ids in chunk)
        pooled.append(_served(model, out.pooled))  # (b, E_t)
        progress.update(len(chunk))
    offsets = torch.zeros(len(texts) + 1, dtype=torch.long)  # (N_txt + 1,)
    offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.long), dim=0)
    return torch.cat(tokens), offsets, torch.cat(pooled)


def compute_tower_features(model: MultimodalModel, tokenizer: TextTokenizer, pairs: Sequence[ImageTextPair],
                           pairs_path: Path, *, batch_size: int = 32,
                           progress: ProgressFactory = silent_progress) -> TowerFeatures:
    """Run every distinct image and text of ``pairs`` through its frozen tower once."""
    images_bar = progress("encoding images", len({pair.image for pair in pairs}))
    image_rows, image_tokens, image_pooled = _encode_images(model, pairs, pairs_path, batch_size, images_bar)
    images_bar.close()
    texts = sorted({pair.text for pair in pairs})
    texts_bar = progress("encoding texts", len(texts))
    text_tokens, text_offsets, text_pooled = _encode_texts(model, tokenizer, texts, batch_size, texts_bar)
    texts_bar.close()
    return TowerFeatures(image_rows=image_rows, image_tokens=image_tokens, image_pooled=image_pooled,
                         text_rows={text: row for row, text in enumerate(texts)}, text_tokens=text_tokens,
                         text_offsets=text_offsets, text_pooled=text_pooled)
