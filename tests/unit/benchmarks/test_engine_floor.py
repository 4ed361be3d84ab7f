"""benchmarks/engine_floor.py: the bare batcher really runs the text tower, the clients pace right, the table adds up."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.engine_floor import text_answer
from benchmarks.engine_floor_batcher import batcher_settings, serve
from benchmarks.engine_floor_client import calls_due
from benchmarks.engine_floor_processes import batch_size_sum_count
from benchmarks.engine_floor_table import (
    BATCHER, FIGURE_ROW, FLOOR, MMSERVE, Run, headline_figures, pooled, pooled_by_key, table_rows, target_line,
)
from server.runtime.model_loading import load_model
from server.workers.frames import CorkedFrameWriter, read_messages

TEXTS = ("a red bicycle", "a sunny wall by the sea, leaning", "x")


async def _batcher_answers(socket_path: str, token_ids: list[tuple[int, ...]]) -> dict[int, tuple]:
    started = asyncio.Event()
    server = asyncio.ensure_future(serve(socket_path, 0.0, 0.0, started))
    try:
        await asyncio.wait_for(started.wait(), 30.0)
        reader, writer = await asyncio.open_unix_connection(socket_path)
        corked = CorkedFrameWriter(writer)
        for call_id, ids in enumerate(token_ids):  # one turn: one frame of three calls
            corked.write(("text", call_id, ids))
        corked.write(("status", 10))
        answers: dict[int, tuple] = {}
        while len(answers) < len(token_ids) + 1:
            for kind, call_id, *fields in await asyncio.wait_for(read_messages(reader), 10.0):
                answers[call_id] = (kind, *fields)
        corked.write(("batches", 11))
        answers[11] = (await asyncio.wait_for(read_messages(reader), 10.0))[0][2]
        corked.close()
        return answers
    finally:
        server.cancel()


def test_the_batcher_answers_each_text_with_the_models_own_embedding_of_its_token_ids() -> None:
    bundle = load_model(batcher_settings(0.0, 0.0))  # the same seeded weights the batcher loads
    token_ids = [bundle.tokenizer.encode(text, truncate=False).token_ids for text in TEXTS]
    with tempfile.TemporaryDirectory() as directory:
        answers = asyncio.run(_batcher_answers(str(Path(directory) / "batcher.sock"), token_ids))
    with torch.inference_mode():
        expected = [bundle.model.encode_texts([ids])[0].pooled.float().numpy() for ids in token_ids]  # (E,) each
    for call_id, embedding in enumerate(expected):
        kind, answered = answers[call_id]
        assert kind == "ok"
        assert answered.shape == embedding.shape == (32,)
        np.testing.assert_allclose(answered, embedding, rtol=1e-5, atol=1e-6)
    assert not np.allclose(expected[0], expected[1])  # different texts: a mixed-up answer would show
    assert answers[10] == ("ok", (True, True, False, {}))
    num_batches, num_texts = answers[11]
    assert num_texts == len(TEXTS) and 1 <= num_batches <= len(TEXTS)


def test_calls_due_is_an_open_loop_schedule_from_the_first_call_at_zero() -> None:
    assert calls_due(-0.1, 850.0, 2.0) == 0
    assert calls_due(0.0, 850.0, 2.0) == 1
    assert calls_due(0.004, 850.0, 2.0) == 4  # calls at 0, 1.18, 2.35 and 3.53 ms
    assert calls_due(1.0, 850.0, 2.0) == 851
    assert calls_due(2.0, 850.0, 2.0) == calls_due(60.0, 850.0, 2.0) == 1700  # exactly rate x seconds, no more
    per_tick = [calls_due(0.004 * (tick + 1), 850.0, 2.0) - calls_due(0.004 * tick, 850.0, 2.0) for tick in range(100)]
    assert set(per_tick) == {3, 4}  # 3.4 per 4 ms tick


def _run(name: str, tick_ms: float | None, cpu_s: float, num_answered: int, batches: float | None = None,
         batched: float | None = None, failed: int = 0) -> Run:
    return Run(name, tick_ms, cpu_s, 10.0, num_answered, failed, batches, batched)


def test_runs_pool_per_engine_and_tick_and_the_table_divides_by_the_floor() -> None:
    floor = pooled([_run(FLOOR, None, 0.5, 5000), _run(FLOOR, None, 0.5, 5000)])
    assert floor.cpu_ms_per_request == pytest.approx(0.1) and floor.answered_per_s == pytest.approx(500.0)
    runs = pooled_by_key([_run(MMSERVE, 4.0, 2.0, 8000, 1000, 8000), _run(BATCHER, 4.0, 1.0, 8000, 2000, 8000),
                          _run(MMSERVE, 4.0, 2.8, 8000, 1000, 8000, failed=2), _run(MMSERVE, 1.0, 3.2, 8000, 4000, 8000)])
    assert [(run.name, run.tick_ms) for run in runs] == [(MMSERVE, 4.0), (BATCHER, 4.0), (MMSERVE, 1.0)]
    rows = table_rows(floor, runs)
    assert rows[1] == [FLOOR, "-", "500", "0.100", "1.00", "-", "0"]
    assert rows[2] == [MMSERVE, "4", "800", "0.300", "3.00", "8.00", "2"]  # 4.8 s / 16000, 16000 / 2000
    assert rows[3] == [BATCHER, "4", "800", "0.125", "1.25", "4.00", "0"]
    assert target_line(floor) == "target 0.6 x floor = 0.060 ms"
    figures = headline_figures(floor, runs)  # the largest tick only
    assert [(f.row, f.name, f.value) for f in figures] == [
        (FIGURE_ROW, "HTTP floor CPU ms/req", 0.1, ),
        (FIGURE_ROW, f"{MMSERVE} CPU per text, tick 4 ms, x floor", 3.0),
        (FIGURE_ROW, f"{BATCHER} CPU per text, tick 4 ms, x floor", 1.25),
    ]
    with pytest.raises(ValueError):
        pooled([_run(MMSERVE, 4.0, 1.0, 1), _run(BATCHER, 4.0, 1.0, 1)])


def test_the_engines_batches_are_read_from_its_text_lane_histogram_only() -> None:
    exposition = "\n".join([
        'mmserve_batch_size_bucket{le="4.0",lane="text"} 3.0',
        'mmserve_batch_size_count{lane="text"} 322.0',
        'mmserve_batch_size_sum{lane="text"} 1700.0',
        'mmserve_batch_size_count{lane="vision"} 7.0',
        'mmserve_batch_size_sum{lane="vision"} 9.0',
    ])
    assert batch_size_sum_count(exposition, "text") == (322.0, 1700.0)


def test_the_floor_answers_with_a_text_answer_of_mmserves_shape() -> None:
    import json

    answer = json.loads(text_answer(np.arange(32, dtype=np.float32), 11))
    assert answer["object"] == "list" and answer["usage"] == {"prompt_tokens": 11, "total_tokens": 11}
    assert answer["data"][0]["embedding"] == [float(value) for value in range(32)]
