"""The bare batcher: the least a Python engine process can do per text request, for ``benchmarks.engine_floor``.

    python -m benchmarks.engine_floor_batcher --socket PATH [--text-ms 0.5] [--vision-ms 1]

It listens on a Unix socket and speaks the product's frames
(``server.workers.frames``: ``read_messages``, ``CorkedFrameWriter``):

    ("text", id, token_ids)   -> ("ok", id, float32 embedding)     one text through the model's text tower
    ("status", id)            -> ("ok", id, (True, True, False, {}))  ready, alive, not draining (as the engine's)
    ("batches", id)           -> ("ok", id, (batches run, texts run))

The event loop appends each text to one lane (a deque and a
``threading.Condition``); one compute thread takes up to ``MAX_BATCH`` at once,
runs the synthetic preset's text tower exactly as the engine builds it
(``server.runtime.model_loading.load_model``, the same settings) through
``MultimodalModel.encode_texts`` padded to the batch's longest text (what
``router.runner`` does on the CPU), and hands the whole batch back to the
loop with one ``call_soon_threadsafe``; each connection's answers of that
batch leave in one frame. No admission, deadlines, cache, records or metrics:
that is the point (the floor an engine's per-request work sits on).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import threading
from collections.abc import Callable, Sequence

import numpy as np
import torch

from server.workers.frames import CorkedFrameWriter, read_messages

MAX_BATCH = 32  # the text lane's default max_batch_size

Reply = Callable[..., None]


def batcher_settings(text_ms: float, vision_ms: float) -> object:
    """The engine's settings for the synthetic preset with these tower times, segment cache off."""
    from server.settings import Settings

    return Settings(preset="synthetic", synthetic_text_ms=text_ms, synthetic_vision_ms=vision_ms,
                    cache_text_bytes=0, cache_image_bytes=0)


class TextLane:
    """Texts waiting for the compute thread; batches of up to ``MAX_BATCH`` texts go back to the loop whole."""

    def __init__(self, encode: Callable[[Sequence[Sequence[int]]], np.ndarray],
                 loop: asyncio.AbstractEventLoop, max_batch: int = MAX_BATCH) -> None:
        self._encode = encode  # token ids of B texts -> (B, E) float32 embeddings
        self._loop = loop
        self._max_batch = max_batch
        self._waiting: collections.deque[tuple[Reply, int, Sequence[int]]] = collections.deque()
        self._ready = threading.Condition()
        self.num_batches = 0
        self.num_texts = 0
        self._thread = threading.Thread(target=self._compute, name="batcher-compute", daemon=True)

    def start(self, on_thread_start: Callable[[], object] = lambda: None) -> None:
        self._on_thread_start = on_thread_start
        self._thread.start()

    def put(self, reply: Reply, call_id: int, token_ids: Sequence[int]) -> None:
        """On the loop's thread: one text for the next batch."""
        with self._ready:
            self._waiting.append((reply, call_id, token_ids))
            self._ready.notify()

    def _compute(self) -> None:
        self._on_thread_start()
        while True:
            with self._ready:
                while not self._waiting:
                    self._ready.wait()
                batch = [self._waiting.popleft() for _ in range(min(self._max_batch, len(self._waiting)))]
            embeddings = self._encode([token_ids for _, _, token_ids in batch])  # (B, E)
            self._loop.call_soon_threadsafe(self._answer, batch, embeddings)

    def _answer(self, batch: list[tuple[Reply, int, Sequence[int]]], embeddings: np.ndarray) -> None:
        """On the loop's thread: every answer of the batch written now, so each connection's leave in one frame."""
        self.num_batches += 1
        self.num_texts += len(batch)
        for (reply, call_id, _), embedding in zip(batch, embeddings):
            reply("ok", call_id, embedding)


def text_encoder(bundle: object) -> Callable[[Sequence[Sequence[int]]], np.ndarray]:
    """The served model's text embedding of a batch of token ids, padded to its longest (as on the CPU)."""
    model, pad_token_id = bundle.model, bundle.tokenizer.pad_token_id  # type: ignore[attr-defined]

    def encode(token_ids: Sequence[Sequence[int]]) -> np.ndarray:
        with torch.inference_mode():
            segments = model.encode_texts(token_ids, pad_token_id=pad_token_id)
            return torch.stack([segment.pooled for segment in segments]).float().cpu().numpy()  # (B, E)

    return encode


def compute_thread_start(bundle: object) -> Callable[[], None]:
    """What the engine's compute thread does first: the model's torch-thread cap (``Runner.limit_compute_threads``)."""
    cap = bundle.model.max_intra_op_threads  # type: ignore[attr-defined]

    def start() -> None:
        if cap is not None and cap < torch.get_num_threads():
            torch.set_num_threads(cap)

    return start


async def handle_connection(lane: TextLane, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    corked = CorkedFrameWriter(writer)
    reply = corked.reply

    try:
        while True:
            try:
                messages = await read_messages(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            for message in messages:
                kind, call_id = message[0], message[1]
                if kind == "text":
                    lane.put(reply, call_id, message[2])
                elif kind == "status":
                    reply("ok", call_id, (True, True, False, {}))
                elif kind == "batches":
                    reply("ok", call_id, (lane.num_batches, lane.num_texts))
                else:
                    reply("error", call_id, None, (400, "unknown_call", f"the batcher answers no {kind!r}", None, None))
    finally:
        corked.close()


async def serve(socket_path: str, text_ms: float, vision_ms: float, started: asyncio.Event | None = None) -> None:
    from server.runtime.model_loading import load_model

    bundle = await asyncio.to_thread(load_model, batcher_settings(text_ms, vision_ms))
    lane = TextLane(text_encoder(bundle), asyncio.get_running_loop())
    lane.start(compute_thread_start(bundle))
    server = await asyncio.start_unix_server(lambda r, w: handle_connection(lane, r, w), path=socket_path)
    if started is not None:
        started.set()
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--text-ms", type=float, default=0.5)
    parser.add_argument("--vision-ms", type=float, default=1.0)
    args = parser.parse_args(argv)
    try:
        import uvloop  # the engine's loop where installed (server.workers.engine_process)
        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve(args.socket, args.text_ms, args.vision_ms))


if __name__ == "__main__":
    main()
