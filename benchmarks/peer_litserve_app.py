"""mmserve's model served by LitServe: the peer the comparison benchmarks drive.

The same seeded preset (same fingerprint), requests checked as mmserve checks
them (``benchmarks.peer_request``), mmserve's resize and tokenizer, and the
keys of ``POST /v1/infer``'s answer plus ``batch_size``, so one load
generator drives both servers. Written as LitServe's documentation asks:
``decode_request`` per request, ``predict`` per batch (every image through
the vision encoder together, every text through the text encoder, the items
with both fused), ``encode_response`` per answer. The batch cap and delay
default to ``MMSERVE_MAX_BATCH_SIZE`` and ``MMSERVE_MAX_QUEUE_DELAY_MS``.

    python -m benchmarks.peer_litserve_app --preset tiny --port 8101
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import litserve as ls
import numpy as np
import torch
from fastapi import HTTPException

from benchmarks.encoder_tracing import trace_all_encoders
from benchmarks.peer_request import PeerLimits, PeerRefusal, checked_request, decode_image, decode_pixels
from models.errors import TextTooLongError
from models.multimodal import ImageSegment, TextSegment
from models.preprocessing import pixels_to_model_input, resize_to_model_input
from models.families.presets import PRESET_NAMES
from models.loading.repository import ModelBundle, build_preset
from models.tokenizer import TokenizedText

INFER_PATH = "/v1/infer"


@dataclass(frozen=True)
class PeerItem:
    """One decoded request: what the model needs and nothing else."""

    tokens: TokenizedText | None
    image: np.ndarray | None  # (S, S, 3) uint8

    @property
    def route(self) -> str:
        if self.image is not None and self.tokens is not None:
            return "fusion"
        return "vision" if self.image is not None else "text"


@dataclass(frozen=True)
class PeerOutput:
    """One item's outputs on the host, ready to render."""

    item: PeerItem
    image_embedding: np.ndarray | None  # (d_v,) float32
    text_embedding: np.ndarray | None  # (d_t,) float32
    fused_embedding: np.ndarray | None  # (d_t,) float32
    score: float | None
    batch_size: int


def _to_host(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float32).numpy()


def _refusal(error: PeerRefusal) -> HTTPException:
    """mmserve's refusal as LitServe's way of answering one: same status, same error body."""
    return HTTPException(status_code=error.status, detail=error.detail())


class MultimodalLitAPI(ls.LitAPI):
    """The multimodal model behind LitServe's batching loop (one inference worker)."""

    def __init__(self, preset: str, seed: int, limits: PeerLimits, *, max_batch_size: int,
                 batch_timeout_s: float, api_path: str = INFER_PATH, is_traced: bool = False) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout_s, api_path=api_path)
        self._is_traced = is_traced
        self._preset = preset
        self._seed = seed
        self._limits = limits
        self._bundle: ModelBundle | None = None

    @property
    def bundle(self) -> ModelBundle:
        if self._bundle is None:
            raise RuntimeError("setup() has not run yet")
        return self._bundle

    def setup(self, device: str) -> None:
        self._bundle = build_preset(self._preset, seed=self._seed, device=device)
        if self._is_traced:  # the encoders as TorchScript graphs, as mmserve serve runs them by default
            trace_all_encoders(self._bundle.model)

    # -- one request in ---------------------------------------------------------

    def decode_request(self, request: dict) -> PeerItem:
        try:
            return self._decode(request)
        except PeerRefusal as e:
            raise _refusal(e) from e

    def _decode(self, request: dict) -> PeerItem:
        parsed = checked_request(request, self._limits)
        bundle = self.bundle
        tokens = None
        if parsed.text is not None:
            try:
                tokens = bundle.tokenizer.encode(parsed.text, truncate=parsed.truncate)
            except TextTooLongError as e:
                raise PeerRefusal(422, "text_too_long", str(e), "text") from e
        image = None
        preprocess = bundle.config.preprocess
        if parsed.raw_pixels is not None:
            image = pixels_to_model_input(decode_pixels(*parsed.raw_pixels, self._limits), preprocess)
        elif parsed.encoded_image is not None:
            image = resize_to_model_input(decode_image(parsed.encoded_image, self._limits), preprocess)
        return PeerItem(tokens=tokens, image=image)

    # -- one batch through the model ------------------------------------------------

    def batch(self, inputs: list[PeerItem]) -> list[PeerItem]:
        return list(inputs)

    def predict(self, x: list[PeerItem] | PeerItem) -> list[PeerOutput] | PeerOutput:
        # With max_batch_size 1 LitServe calls predict with one item and skips batch/unbatch.
        if isinstance(x, PeerItem):
            return self.predict_batch([x])[0]
        return self.predict_batch(x)

    def predict_batch(self, items: Sequence[PeerItem]) -> list[PeerOutput]:
        """Vision for every image, text for every text, fusion where an item has both."""
        model = self.bundle.model
        images: dict[int, ImageSegment] = {}
        texts: dict[int, TextSegment] = {}
        vision_rows = [i for i, item in enumerate(items) if item.image is not None]
        text_rows = [i for i, item in enumerate(items) if item.tokens is not None]
        if vision_rows:
            pixels = torch.from_numpy(np.stack([items[i].image for i in vision_rows]))  # (Bv, S, S, 3) uint8
            images = dict(zip(vision_rows, model.encode_images(pixels)))
        if text_rows:
            token_ids = [items[i].tokens.token_ids for i in text_rows]
            segments = model.encode_texts(token_ids, pad_token_id=self.bundle.tokenizer.pad_token_id)
            texts = dict(zip(text_rows, segments))
        fusion_rows = [i for i in vision_rows if i in texts]
        fused = {}
        if fusion_rows:
            outputs = model.fuse([images[i] for i in fusion_rows], [texts[i] for i in fusion_rows])
            fused = dict(zip(fusion_rows, outputs))
        return [
            PeerOutput(
                item=item,
                image_embedding=_to_host(images[i].pooled) if i in images else None,
                text_embedding=_to_host(texts[i].pooled) if i in texts else None,
                fused_embedding=_to_host(fused[i].fused) if i in fused else None,
                score=float(fused[i].score) if i in fused and fused[i].score is not None else None,
                batch_size=len(items),
            )
            for i, item in enumerate(items)
        ]

    def unbatch(self, output: list[PeerOutput]) -> list[PeerOutput]:
        return list(output)

    # -- one answer out -----------------------------------------------------------

    def encode_response(self, output: PeerOutput) -> dict:
        body: dict = {"route": output.item.route,
                      "model": {**dataclasses.asdict(self.bundle.describe()), "engine": 0}}  # the one engine, as mmserve
        for key in ("image_embedding", "text_embedding", "fused_embedding"):
            if (value := getattr(output, key)) is not None:
                body[key] = value.tolist()
        if output.score is not None:
            body["score"] = output.score
        if (tokens := output.item.tokens) is not None:
            body["text"] = {"num_tokens": len(tokens.token_ids), "truncated": tokens.is_truncated,
                            "num_tokens_before_truncation": tokens.num_tokens_before_truncation}
        body["batch_size"] = output.batch_size
        return body


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.peer_litserve_app",
        description="Serve an mmserve preset with LitServe on POST /v1/infer (the benchmark's peer).",
    )
    parser.add_argument("--preset", choices=PRESET_NAMES, default="tiny")
    parser.add_argument("--seed", type=int, default=0, help="seed of the preset's random weights (default 0)")
    parser.add_argument("--host", default="127.0.0.1", choices=("127.0.0.1", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--max-batch-size", type=int, metavar="N",
                        help="default: MMSERVE_MAX_BATCH_SIZE, as mmserve reads it")
    parser.add_argument("--max-queue-delay-ms", type=float, metavar="MS",
                        help="LitServe's batch_timeout; default: MMSERVE_MAX_QUEUE_DELAY_MS")
    parser.add_argument("--torchscript-encoders", action="store_true",
                        help="run the encoders as TorchScript graphs (mmserve's default); default: eager")
    parser.add_argument("--fast-queue", action="store_true",
                        help="LitServe's ZeroMQ transport, documented for more than 100 requests/s")
    parser.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    limits = PeerLimits.from_environment()  # MMSERVE_* from the environment, as ``mmserve serve`` reads them
    max_batch_size = args.max_batch_size if args.max_batch_size is not None else limits.max_batch_size
    delay_ms = args.max_queue_delay_ms if args.max_queue_delay_ms is not None else limits.max_queue_delay_ms
    api = MultimodalLitAPI(args.preset, args.seed, limits, max_batch_size=max_batch_size,
                           batch_timeout_s=delay_ms / 1000.0, is_traced=args.torchscript_encoders)
    server = ls.LitServer(api, accelerator=args.device, devices=1, workers_per_device=1,
                          timeout=limits.default_timeout_ms / 1000.0, fast_queue=args.fast_queue)
    server.run(host=args.host, port=args.port, log_level=args.log_level, generate_client_file=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
