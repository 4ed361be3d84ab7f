"""The text encoder: a BERT-family transformers model.

Built from ``TextConfig`` numbers (presets) or loaded with ``AutoModel`` from a
local Hugging Face directory. The pooled embedding is the mean over each
text's real tokens (padding masked out), the sentence-transformers convention,
so the result does not depend on how much a batch was padded. After
``trace_graph`` the whole encoder runs as a TorchScript graph
(``models.graphs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModel, BertConfig, BertModel

from models.loading.config import TextConfig
from models.errors import ModelRepositoryError
from models.cuda_graphs import CapturedForward, GraphBackend, Tensors
from models.graphs import EncoderGraph, TraceOutcome, trace


@dataclass(frozen=True)
class TextOutput:
    tokens: torch.Tensor  # (B, Lt, d_t), padded
    pooled: torch.Tensor  # (B, d_t)


def bert_config(config: TextConfig, vocab_size: int, pad_token_id: int) -> BertConfig:
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings,
        pad_token_id=pad_token_id,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


class TextEncoder(nn.Module):
    """A transformers encoder returning token states and a masked-mean embedding.

    ``fixed_length`` is set for towers that must see every text padded to one
    length (SigLIP was trained on texts padded to 64 tokens and pools the last
    position; OpenCLIP adds a positional table of its full context): the
    batch runner then pads every text to it. Subclasses for pretrained
    families (``models.families.transformers_towers``) override ``encode``.
    ``max_intra_op_threads``: a cap on the torch threads one call should use
    (``None``: torch's own count); a tower too small to split sets it.
    """

    max_intra_op_threads: int | None = None

    def __init__(self, model: nn.Module, *, hidden_size: int | None = None, embedding_dim: int | None = None,
                 max_tokens: int | None = None, fixed_length: int | None = None,
                 vocab_size: int | None = None) -> None:
        super().__init__()
        self.model = model
        config = getattr(model, "config", None)
        self.hidden_size: int = int(hidden_size if hidden_size is not None else config.hidden_size)
        self.embedding_dim: int = int(embedding_dim if embedding_dim is not None else self.hidden_size)
        self.max_tokens: int = int(max_tokens if max_tokens is not None else config.max_position_embeddings)
        self.fixed_length = fixed_length
        self.vocab_size: int = int(vocab_size if vocab_size is not None else config.vocab_size)
        self.graph: EncoderGraph | CapturedForward | None = None  # set by trace_graph or capture_graphs

    @classmethod
    def from_config(cls, config: TextConfig, vocab_size: int, pad_token_id: int) -> "TextEncoder":
        return cls(BertModel(bert_config(config, vocab_size, pad_token_id), add_pooling_layer=False))

    @classmethod
    def from_pretrained(cls, directory: Path) -> "TextEncoder":
        """Load a local Hugging Face directory (``save_pretrained`` output), no network."""
        try:
            # safetensors only: a pytorch_model.bin would be unpickled by torch.load.
            model = AutoModel.from_pretrained(str(directory), local_files_only=True, use_safetensors=True)
        except (OSError, ValueError) as e:
            raise ModelRepositoryError(f"cannot load the text model from {directory}: {e}") from e
        return cls(model)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TextOutput:
        """``input_ids``/``attention_mask``: (B, Lt) int64, right-padded."""
        tokens, pooled = (self.graph or self.encode)(input_ids, attention_mask)
        return TextOutput(tokens=tokens, pooled=pooled)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The eager encoder: token states (B, Lt, d_t) and the masked-mean embedding (B, d_t)."""
        tokens = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(tokens.dtype)  # (B, Lt, 1)
        pooled = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)  # (B, d_t)
        return tokens, pooled

    def trace_graph(self) -> TraceOutcome:
        """Run ``encode`` as a TorchScript graph from now on, if its trace matches eager.

        Traced on 2 texts of 8 tokens, one of them padded (transformers drops
        an all-ones mask in Python, so a trace on unpadded text would record
        the branch that ignores padding); checked on 1 unpadded text and on 3
        texts of 16 tokens with padding. Call it once the model is on its
        device in its dtype.
        """
        parameter = next(self.model.parameters())
        vocab_size = self.vocab_size
        generator = torch.Generator().manual_seed(0)

        def texts(batch_size: int, length: int, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
            input_ids = torch.randint(0, vocab_size, (batch_size, length), generator=generator)  # (B, Lt)
            attention_mask = (torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]).long()  # (B, Lt)
            return input_ids.to(parameter.device), attention_mask.to(parameter.device)

        length = self.fixed_length or min(8, self.max_tokens)
        probe_length = self.fixed_length or min(16, self.max_tokens)
        outcome = trace("text", self, self.encode, texts(2, length, [length, max(1, length - 3)]),
                        [texts(1, length, [length]), texts(3, probe_length, [probe_length, 1, probe_length // 2])],
                        parameter.dtype)
        self.graph = outcome.graph
        return outcome

    @property
    def runs_captured_shapes(self) -> bool:
        """Each shape replays a captured graph: batches must come in the shapes warm-up captured."""
        return isinstance(self.graph, CapturedForward)

    def capture_graphs(self, backend: GraphBackend) -> CapturedForward:
        """Run ``encode`` from a CUDA graph per (batch size, length) from now on (``models.cuda_graphs``).

        Each shape is captured on random token ids with padding in every row
        but a full first one (so the graph holds the masked path, as
        ``trace_graph`` explains), then checked against eager on the call
        that met the shape.
        """
        vocab_size = self.vocab_size

        def example(inputs: Tensors) -> Tensors:
            input_ids, attention_mask = inputs
            batch_size, length = input_ids.shape
            lengths = torch.full((batch_size,), max(1, length // 2))  # (B,)
            lengths[0] = length if batch_size > 1 else max(1, length - 1)
            mask = (torch.arange(length)[None, :] < lengths[:, None]).to(attention_mask.dtype)  # (B, Lt)
            ids = torch.randint(0, vocab_size, (batch_size, length), dtype=input_ids.dtype)  # (B, Lt)
            return ids.to(input_ids.device), mask.to(attention_mask.device)

        captured = CapturedForward("text", self.encode, example, backend)
        self.graph = captured
        return captured
