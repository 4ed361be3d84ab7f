"""``MMSERVE_RATE_LIMIT`` with ``--api-workers 2`` holds for the server: one bucket's worth of 200s, not two.

Every request comes on a connection of its own, so both API processes accept
a share (up to two more storms when one accepted nearly all); each process's
own counts (its ``/metrics`` snapshot in the run directory) show that each saw
more requests than the burst, so buckets held per process would have granted
at least twice the burst.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import signal
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from server.workers.handoff import RATE_BUCKETS_VARIABLE, RUN_DIRECTORY_VARIABLE
from server.workers.metrics_snapshots import fresh_snapshots
from tests.conftest import run_serve_process

KEY = "inference-key-Rt5m2Kq8"
PER_S, BURST = 1.0, 10
NUM_CLIENTS, REQUESTS_PER_CLIENT = 32, 3


def api_process_ids(supervisor_pid: int) -> list[int]:
    children = Path(f"/proc/{supervisor_pid}/task/{supervisor_pid}/children").read_text().split()
    return [int(pid) for pid in children
            if b"server.workers.api_process" in Path(f"/proc/{pid}/cmdline").read_bytes()]


def environment_of(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in entries if b"=" in entry)


def counted(exposition: str, counter: str, **labels: str) -> float:
    """The sum of ``counter``'s series whose labels include ``labels``."""
    return sum(sample.value for family in text_string_to_metric_families(exposition) for sample in family.samples
               if sample.name == counter and labels.items() <= sample.labels.items())


async def storm(url: str) -> tuple[list[httpx.Response], float, float]:
    """NUM_CLIENTS clients at once, each request on a new connection (accepted by either process).

    The answers, and when the storm started and ended (``time.monotonic``).
    """
    headers = {"Authorization": f"Bearer {KEY}", "Connection": "close"}
    async with httpx.AsyncClient(base_url=url, timeout=60, headers=headers) as client:
        started = time.monotonic()

        async def one_client(index: int) -> list[httpx.Response]:
            return [await client.post("/v1/infer", json={"text": f"client {index} request {i}"})
                    for i in range(REQUESTS_PER_CLIENT)]

        answers = await asyncio.gather(*(one_client(index) for index in range(NUM_CLIENTS)))
        return [answer for per_client in answers for answer in per_client], started, time.monotonic()


def test_the_rate_limit_holds_for_the_server_across_api_processes():
    env = {"MMSERVE_API_KEYS": KEY, "MMSERVE_RATE_LIMIT": f"{PER_S:g}/s,burst={BURST}"}
    with run_serve_process(["--preset", "tiny", "--device", "cpu", "--api-workers", "2"], env) as served:
        api_pids = api_process_ids(served.process.pid)
        assert len(api_pids) == 2
        environments = [environment_of(pid) for pid in api_pids]
        table = environments[0][RATE_BUCKETS_VARIABLE]
        assert table == environments[1][RATE_BUCKETS_VARIABLE] and Path(table).exists()

        key_id = hashlib.sha256(KEY.encode()).hexdigest()[:12]

        def counts_per_process() -> list[tuple[float, float]]:
            """(200s, refusals) each API process has answered so far, from its own snapshot."""
            snapshots = fresh_snapshots(environments[0][RUN_DIRECTORY_VARIABLE])  # every process's counts, now
            return [(counted(snapshots[pid]["text"], "mmserve_requests_total", code="200"),
                     counted(snapshots[pid]["text"], "mmserve_rate_limited_total", key_id=key_id))
                    for pid in api_pids]

        # Another storm only if one process accepted nearly every connection (one listening socket: the
        # first to accept wins, see work_logs.send_until_both_api_processes_worked).
        answers, first_started = [], None
        for _ in range(3):
            storm_answers, started, ended = asyncio.run(storm(served.url))
            answers, first_started = answers + storm_answers, first_started or started
            per_process = counts_per_process()
            if all(ok + limited > BURST for ok, limited in per_process):
                break
        elapsed_s = ended - first_started  # the bucket refilled between storms too
        statuses = [answer.status_code for answer in answers]
        assert set(statuses) <= {200, 429}, statuses
        num_ok, num_limited = statuses.count(200), statuses.count(429)
        # One bucket: the burst at once, then one token each 1/PER_S s, and (all asking at once) no fewer.
        assert BURST <= num_ok <= BURST + math.floor(PER_S * elapsed_s) + 1, (num_ok, elapsed_s)
        assert num_limited == len(answers) - num_ok
        for answer in answers:
            if answer.status_code == 429:
                assert answer.json()["error"]["code"] == "rate_limited"
                assert 1 <= int(answer.headers["Retry-After"]) <= math.ceil(1 / PER_S)

        assert sum(ok for ok, _ in per_process) == num_ok and sum(limited for _, limited in per_process) == num_limited
        # Each process saw more than the burst: buckets per process would have granted >= 2 x BURST.
        assert all(ok + limited > BURST for ok, limited in per_process), per_process
        assert num_ok < 2 * BURST

        # /metrics, whichever process answers, sums both processes' refusals.
        metrics = httpx.get(f"{served.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
        exported = re.search(rf'^mmserve_rate_limited_total\{{key_id="{key_id}"\}} (\S+)$', metrics, re.M)
        assert exported is not None and float(exported.group(1)) == num_limited

        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=120) == 0
        assert not Path(table).exists()  # the supervisor removed the table when the server stopped
