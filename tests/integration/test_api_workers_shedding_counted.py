"""With API processes, every 503 ``overloaded`` refusal is load shedding on ``/metrics``, whichever part refused.

``mmserve_rejected_total`` is what the ``MmserveLoadShedding`` alert watches.
The lanes count their refusals in the engine; the refusals an API process
makes before a request reaches a lane must count there too, in the API
process's registry, which ``/metrics`` merges with the engine's:

- the decode queue past ``MMSERVE_MAX_DECODE_QUEUE`` (a ``decode`` drill holds
  each API process's one decode thread): ``lane="intake", reason="decode_queue_full"``;
- every pixel slot held (the engine is stopped, so it copies nothing out and
  the slots of the first request an API process sends stay held):
  ``lane="intake", reason="pixel_slots_full"``.
"""

from __future__ import annotations

import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from encoded_images import b64, encoded_image
from tests.conftest import run_serve_processes

ARGS = ["--preset", "tiny", "--device", "cpu", "--api-workers", "2"]
ENV = {"MMSERVE_ENABLE_FAULT_INJECTION": "true", "MMSERVE_CACHE_IMAGE_BYTES": "0", "MMSERVE_CACHE_TEXT_BYTES": "0",
       "MMSERVE_DECODE_THREADS": "1", "MMSERVE_MAX_DECODE_QUEUE": "4", "MMSERVE_PIXEL_SLOTS": "4"}


def intake_rejected(url: str, reason: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"Connection": "close"}, timeout=30).text
    values = re.findall(rf'^mmserve_rejected_total\{{lane="intake",reason="{reason}"\}} (\S+)$', text, re.M)
    assert len(values) == 1, f"no single intake {reason} series on /metrics"  # exported from the start, at 0
    return float(values[0])


def four_images(seed: int) -> dict:
    return {"images": [{"b64": b64(encoded_image(seed * 10 + index, (40, 30), "PNG"))} for index in range(4)]}


def engine_pid(supervisor_pid: int) -> int:
    """The engine process: the supervisor's child running ``server.workers.engine_process``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except OSError:
            continue
        if parent == supervisor_pid and b"server.workers.engine_process" in command:
            return int(entry)
    raise AssertionError("no engine process under the supervisor")


def test_decode_queue_and_pixel_slot_refusals_count_as_load_shedding_with_api_processes():
    with run_serve_processes([(ARGS, ENV)], ready_timeout_s=300) as (served,), httpx.Client(
            base_url=served.url, timeout=60, headers={"Connection": "close"}) as client:
        assert intake_rejected(served.url, "decode_queue_full") == 0
        assert intake_rejected(served.url, "pixel_slots_full") == 0

        # Each request's drill now holds its API process's only decode thread for 300 ms; four more wait (the
        # drill's and the image's decodes), the rest are refused.
        stall = {"stage": "decode", "delay_ms": 300, "duration_s": 60}
        assert client.post("/v1/admin/faults", json=stall).status_code == 200
        with ThreadPoolExecutor(24) as pool:
            answers = list(pool.map(lambda i: client.post("/v1/infer", json={"images": [
                {"b64": b64(encoded_image(1000 + i, (40, 30), "PNG"))}]}), range(24)))
        assert client.delete("/v1/admin/faults").status_code == 200
        refused = [answer.json()["error"] for answer in answers if answer.status_code == 503]
        assert all(error["code"] == "overloaded" for error in refused), refused
        # Under this flood the four pixel slots may run out too (the engine copies them out on its loop's time).
        num_decode = sum("MMSERVE_MAX_DECODE_QUEUE" in error["message"] for error in refused)
        num_slots = sum("pixel slots" in error["message"] for error in refused)
        assert num_decode >= 1 and num_decode + num_slots == len(refused), refused
        assert intake_rejected(served.url, "decode_queue_full") == num_decode
        assert intake_rejected(served.url, "pixel_slots_full") == num_slots

        # The engine stopped copies nothing out: an API process's first four-image request holds all its four
        # slots, its next is refused. Six requests over two API processes: at least one is refused.
        engine = engine_pid(served.process.pid)
        os.kill(engine, signal.SIGSTOP)
        try:
            with ThreadPoolExecutor(6) as pool:
                pending = []
                for index in range(6):  # one at a time, each decoded before the next (the decode queue is 4)
                    pending.append(pool.submit(client.post, "/v1/infer", json=four_images(index)))
                    time.sleep(0.5)
                time.sleep(2.0)  # the refusals answer at once; the others wait for the engine
                os.kill(engine, signal.SIGCONT)
                answers = [future.result() for future in pending]
        finally:
            os.kill(engine, signal.SIGCONT)
        refused = [answer for answer in answers if answer.status_code == 503]
        # Each API process that got requests accepted its first and refused the rest: 4 (3 + 3) or 5 (6 + 0).
        assert len(refused) in (4, 5), [(answer.status_code, answer.text[:200]) for answer in answers]
        for answer in refused:
            assert answer.json()["error"]["code"] == "overloaded"
            assert "pixel slots" in answer.json()["error"]["message"]
        assert all(answer.status_code == 200 for answer in answers if answer not in refused)
        assert intake_rejected(served.url, "pixel_slots_full") == num_slots + len(refused)
        assert intake_rejected(served.url, "decode_queue_full") == num_decode  # none of these
