"""The vision encoder: an image tower fed uint8 images (timm ViT for the presets).

Input stays uint8 until it is on the model's device (4x fewer bytes through
batching and the host-to-device copy than float32); normalisation happens on
the device in one pass (``kernels.preprocess_uint8``). The encoder returns
every token (class token + patches) for the cross-modal attention, and the
image embedding its library defines (timm's pre-logits for the presets;
``models.families.transformers_towers`` for SigLIP, CLIP and OpenCLIP). After ``trace_graph`` the ViT
part runs as a TorchScript graph (``models.graphs``) on the CPU, or from
CUDA graphs captured per batch size (``capture_graphs``, ``models.cuda_graphs``)
on a GPU; normalisation stays outside it, a Triton kernel on GPU.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import timm
import torch
from torch import nn

from kernels import preprocess_uint8
from models.loading.config import PreprocessConfig, VisionConfig
from models.cuda_graphs import CapturedForward, GraphBackend, Tensors
from models.device import KeepsWeightsPlacement
from models.graphs import EncoderGraph, TraceOutcome, trace


@dataclass(frozen=True)
class VisionOutput:
    tokens: torch.Tensor  # (B, Lv, d_v), Lv = 1 + num_patches
    pooled: torch.Tensor  # (B, d_v)


class UInt8VisionEncoder(KeepsWeightsPlacement, abc.ABC):
    """An image tower fed uint8 images: normalisation on device, then ``features``.

    Subclasses hold the tower and say what it gives: ``features`` maps
    normalised pixels to every token (the cross-modal layer's keys and values)
    and the image embedding the tower's own library defines.
    ``max_intra_op_threads``: a cap on the torch threads one call should use
    (``None``: torch's own count); a tower too small to split sets it.
    """

    max_intra_op_threads: int | None = None

    def __init__(self, preprocess: PreprocessConfig, embed_dim: int, embedding_dim: int, num_tokens: int) -> None:
        super().__init__()
        self.input_size = preprocess.input_size
        self.mean = tuple(preprocess.mean)
        self.std = tuple(preprocess.std)
        self.embed_dim = embed_dim  # width of each token
        self.embedding_dim = embedding_dim  # width of the image embedding
        self.num_tokens = num_tokens
        self.graph: EncoderGraph | CapturedForward | None = None  # set by trace_graph or capture_graphs

    def forward(self, images: torch.Tensor) -> VisionOutput:
        """``images``: (B, S, S, 3) uint8 on the model's device."""
        dtype = self.parameter_dtype()
        pixels = preprocess_uint8(images, self.mean, self.std, dtype)  # (B, 3, S, S)
        tokens, pooled = (self.graph or self.features)(pixels)
        return VisionOutput(tokens=tokens, pooled=pooled)

    def parameter_dtype(self) -> torch.dtype:
        return self.weights_placement()[1]

    @abc.abstractmethod
    def features(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised ``pixels`` (B, 3, S, S) -> every token (B, Lv, d_v) and the embedding (B, E_v)."""

    def trace_graph(self) -> TraceOutcome:
        """Run ``features`` as a TorchScript graph from now on, if its trace matches eager.

        Call it once the model is on its device in its dtype: the graph is
        traced there, on a batch of 2, and checked on batches of 1 and 3.
        """
        weight = next(self.parameters())
        generator = torch.Generator().manual_seed(0)

        def pixels(batch_size: int) -> tuple[torch.Tensor]:
            shape = (batch_size, 3, self.input_size, self.input_size)
            return (torch.rand(shape, generator=generator).mul(2).sub(1).to(weight.device, weight.dtype),)

        outcome = trace("vision", self, self.features, pixels(2), [pixels(1), pixels(3)], weight.dtype)
        self.graph = outcome.graph
        return outcome

    @property
    def runs_captured_shapes(self) -> bool:
        """Each batch size replays a captured graph: batches must come in the sizes warm-up captured."""
        return isinstance(self.graph, CapturedForward)

    def capture_graphs(self, backend: GraphBackend) -> CapturedForward:
        """Run ``features`` from a CUDA graph per batch size from now on (``models.cuda_graphs``)."""

        def example(inputs: Tensors) -> Tensors:
            (pixels,) = inputs
            return (torch.rand_like(pixels).mul(2).sub(1),)  # (B, 3, S, S), the normalised range

        captured = CapturedForward("vision", self.features, example, backend)
        self.graph = captured
        return captured


class VisionEncoder(UInt8VisionEncoder):
    """timm ViT without its classifier head: the presets' image tower, and a timm checkpoint's (``from_timm_dir``).

    The embedding is timm's pre-logits (``forward_head(..., pre_logits=True)``:
    the pooled feature the classifier would read), the tokens are
    ``forward_features``' output, both from the one forward.
    """

    def __init__(self, config: VisionConfig, preprocess: PreprocessConfig,
                 backbone: nn.Module | None = None) -> None:
        if backbone is None:
            backbone = timm.create_model(config.architecture, pretrained=False, num_classes=0, **config.timm_kwargs)
        image_size = backbone.patch_embed.img_size
        if tuple(image_size) != (preprocess.input_size, preprocess.input_size):
            raise ValueError(
                f"vision backbone expects {tuple(image_size)} input but preprocessing "
                f"produces {preprocess.input_size}x{preprocess.input_size}"
            )
        super().__init__(preprocess, backbone.num_features, backbone.num_features,
                         backbone.patch_embed.num_patches + backbone.num_prefix_tokens)
        self.backbone = backbone

    def features(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The eager ViT: every token and the pooled embedding (timm's pre-logits)."""
        tokens = self.backbone.forward_features(pixels)  # (B, Lv, d_v)
        pooled = self.backbone.forward_head(tokens, pre_logits=True)  # (B, d_v)
        return tokens, pooled
