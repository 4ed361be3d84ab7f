"""An API process starts serving once an engine's first status poll says it serves, not merely once connected.

Its lifespan's end is when it starts accepting from the socket every API
process shares; connected but not yet polled, the engine counted as not
serving, and a request taken then got 503 ``engine_unavailable`` though the
engine served (seen at start-up in the suite, and it held for every restart
of an API process too).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from server.workers.api_process import wait_for_a_serving_engine
from server.workers.engine_connection import EngineConnection
from server.workers.frames import CorkedFrameWriter, read_messages

STATUS_DELAY_S = 0.3


async def _engine_answering_status_late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An engine whose status answers take ``STATUS_DELAY_S`` (one busy with a batch, say): ready, alive, serving."""
    corked = CorkedFrameWriter(writer)
    try:
        while True:
            for kind, call_id, *_ in await read_messages(reader):
                if kind == "status":
                    await asyncio.sleep(STATUS_DELAY_S)
                    corked.reply("ok", call_id, (True, True, False, {}))
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        corked.close()


def test_the_wait_ends_when_the_engines_first_status_says_it_serves(tmp_path: Path):
    async def scenario() -> tuple[bool, bool, float]:
        socket_path = str(tmp_path / "engine.sock")
        server = await asyncio.start_unix_server(_engine_answering_status_late, path=socket_path)
        engine = EngineConnection(0, socket_path)
        try:
            await engine.connect(timeout_s=5.0)
            serving_once_connected = engine.is_serving
            started = time.monotonic()
            await wait_for_a_serving_engine([engine], timeout_s=5.0)
            return serving_once_connected, engine.is_serving, time.monotonic() - started
        finally:
            await engine.close()
            server.close()

    serving_once_connected, serving_after_wait, waited_s = asyncio.run(scenario())
    assert not serving_once_connected  # what the lifespan used to start serving on
    assert serving_after_wait
    assert waited_s < 2.0  # the first poll's answer, not the timeout


def test_with_no_engine_serving_the_wait_ends_at_its_bound(tmp_path: Path):
    async def scenario() -> tuple[bool, float]:
        engine = EngineConnection(0, str(tmp_path / "nobody-listens.sock"))  # never connected: not serving
        started = time.monotonic()
        await wait_for_a_serving_engine([engine], timeout_s=0.3)
        return engine.is_serving, time.monotonic() - started

    is_serving, waited_s = asyncio.run(scenario())
    assert not is_serving
    assert 0.3 <= waited_s < 2.0
