"""One load client of ``benchmarks.engine_floor``: what an API process sends an engine for text requests.

    python -m benchmarks.engine_floor_client --socket PATH --engine mmserve|batcher --rate R --seconds S
        --tick-ms T --text TEXT [--describe-socket MMSERVE_ENGINE_SOCKET]

Once connected and the engine ready, it prints ``ready`` and reads the start
(Unix seconds) from its standard input, so every client starts together. Open
loop from then: every ``--tick-ms`` the calls due by then
(``calls_due``) leave together, in one frame (one loop turn's worth, as an API
process's ``CorkedFrameWriter`` sends them). The connection is the API
process's own (``server.workers.engine_connection.EngineConnection``: it polls
``status`` every 0.2 s). Against mmserve's engine each call is what an API
process sends for a text ``/v1/embeddings`` request: ``("run", id,
[IntakeItem], arrival_ns, block, slots)`` with the text's token ids (tokenized
once with the engine's own tokenizer, from its ``describe`` answer) and this
process's pixel-slot block, then, once answered, its ``("record", ...)``.
Against the bare batcher: ``("text", id, token_ids)``.

Then prints one JSON line: calls sent, answered, failed, and the first answers
that were not ``ok`` (each failure is counted, never dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Sequence

from server.workers.engine_connection import EngineConnection

CONNECT_TIMEOUT_S = 60.0
DRAIN_S = 3.0  # how long answers still due are waited for after the last call
NUM_ERRORS_SHOWN = 5


def calls_due(elapsed_s: float, rate_per_s: float, duration_s: float) -> int:
    """Calls an open loop at ``rate_per_s`` has sent ``elapsed_s`` into a run of ``duration_s`` (the first at 0)."""
    if elapsed_s < 0:
        return 0
    return min(math.floor(min(elapsed_s, duration_s) * rate_per_s) + 1, math.ceil(duration_s * rate_per_s))


class TextCalls:
    """How one text call is sent, and what its answer is worth, against one kind of engine."""

    def __init__(self, engine: EngineConnection, kind: str, text: str) -> None:
        self._engine = engine
        self._kind = kind
        self._text = text
        self._item = None
        self._token_ids: tuple[int, ...] = ()
        self._slots = None
        self._inputs_code: int | None = None

    async def prepare(self, describe_socket: str) -> None:
        """The text's token ids from mmserve's engine's own tokenizer (its ``describe`` answer, as an API process
        builds its tokenizer), and for mmserve the item, its inputs code and a pixel-slot block."""
        from models.tokenizer_files import unpack_tokenizer
        from monitoring.inputs import RequestInputs
        from router.intake import IntakeItem
        from server.workers.engine_connection import describe_engine
        from server.workers.handoff import supervisor_pid
        from server.workers.pixel_slots import PixelSlots

        _, _, (facts, files) = await describe_engine(describe_socket, CONNECT_TIMEOUT_S)
        tokens = unpack_tokenizer(files).encode(self._text, truncate=False)
        self._token_ids = tokens.token_ids
        if self._kind == "batcher":
            return
        self._item = IntakeItem(request_id="engine-floor", text=None, protocol="openai", tokens=tokens)
        side = facts.config.preprocess.input_size
        self._slots = PixelSlots((side, side, 3), 4, supervisor_pid=supervisor_pid())
        self._inputs_code = RequestInputs.of(largest_image_pixels=None, image_encoding=None,
                                             num_text_tokens=len(tokens.token_ids), num_images=0,
                                             priority="normal", protocol="openai").code

    def send(self) -> asyncio.Future:
        if self._kind == "batcher":
            return self._engine.send("text", self._token_ids)[1]
        return self._engine.send("run", [self._item], time.perf_counter_ns(), self._slots.name, [[]])[1]

    def answered(self, fields: list, sent_ns: int) -> None:
        """After an ``ok``: the API process's latency record of the answered request (mmserve only)."""
        if self._kind == "batcher":
            return
        outcome = fields[0][0]
        now_ns = time.perf_counter_ns()
        stage_ns = {"decode": outcome.decode_ns, **outcome.result.stage_ns, "respond": 0, "total": now_ns - sent_ns}
        self._engine.write("record", "text", stage_ns, outcome.result.batch_size, None, self._inputs_code)

    def close(self) -> None:
        if self._slots is not None:
            self._slots.close()


async def run_load(args: argparse.Namespace) -> dict:
    engine = EngineConnection(0, args.socket)
    await engine.connect(CONNECT_TIMEOUT_S)
    calls = TextCalls(engine, args.engine, args.text)
    await calls.prepare(args.describe_socket or args.socket)
    while not engine.is_serving:
        await asyncio.sleep(0.05)
    counts = {"sent": 0, "answered": 0, "failed": 0}
    errors: list[str] = []
    pending: set[asyncio.Task] = set()

    async def one_call() -> None:
        sent_ns = time.perf_counter_ns()
        try:
            kind, fields = await calls.send()
        except Exception as e:  # noqa: BLE001 - counted and shown
            kind, fields = "exception", [repr(e)]
        if kind == "ok":
            counts["answered"] += 1
            calls.answered(fields, sent_ns)
        else:
            counts["failed"] += 1
            if len(errors) < NUM_ERRORS_SHOWN:
                errors.append(f"{kind}: {fields!r}"[:300])

    print("ready", flush=True)  # the benchmark answers with the start time, once every client is ready
    start_unix_s = float(await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline))
    await asyncio.sleep(max(0.0, start_unix_s - time.time()))
    started_s = time.monotonic()
    while counts["sent"] < calls_due(args.seconds, args.rate, args.seconds):
        due = calls_due(time.monotonic() - started_s, args.rate, args.seconds)
        for _ in range(due - counts["sent"]):  # one loop turn: one frame (CorkedFrameWriter)
            task = asyncio.ensure_future(one_call())
            pending.add(task)
            task.add_done_callback(pending.discard)
        counts["sent"] = max(due, counts["sent"])
        await asyncio.sleep(args.tick_ms / 1000.0)
    if pending:
        await asyncio.wait(set(pending), timeout=DRAIN_S)
    counts["unanswered"] = len(pending)
    calls.close()
    await engine.close()
    return {**counts, "errors": errors, "pid": os.getpid()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--engine", choices=("mmserve", "batcher"), required=True)
    parser.add_argument("--rate", type=float, required=True, help="calls per second")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--tick-ms", type=float, required=True)
    parser.add_argument("--text", required=True)
    parser.add_argument("--describe-socket", default=None,
                        help="mmserve's engine, whose tokenizer gives the token ids (default: --socket)")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(run_load(args))), flush=True)


if __name__ == "__main__":
    main()
