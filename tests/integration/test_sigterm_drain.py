"""SIGTERM under load: readiness goes false at once, nothing accepted is lost, exit code 0."""

from __future__ import annotations

import asyncio
import signal

import httpx


def test_sigterm_during_load_loses_no_accepted_request(serve_process):
    env = {"MMSERVE_MAX_BATCH_SIZE": "2", "MMSERVE_DRAIN_TIMEOUT_S": "30"}
    with serve_process(["--preset", "tiny", "--device", "cpu", "--enable-fault-injection"], env) as served:
        url, process = served.url, served.process
        # Every batch of two now takes >= 150 ms: 12 requests keep the server busy ~1 s.
        httpx.post(f"{url}/v1/admin/faults", json={"stage": "text", "delay_ms": 150, "duration_s": 60})

        async def scenario():
            async with httpx.AsyncClient(base_url=url, timeout=60,
                                         limits=httpx.Limits(max_connections=32)) as client:
                accepted = [asyncio.create_task(client.post("/v1/infer", json={"text": f"accepted {i}"}))
                            for i in range(12)]
                await asyncio.sleep(0.3)  # all twelve are queued or running now
                process.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.05)
                ready_after = await client.get("/health/ready")
                try:
                    late = (await client.post("/v1/infer", json={"text": "too late"})).status_code
                except httpx.TransportError:
                    late = "refused"
                return await asyncio.gather(*accepted), ready_after.status_code, late

        accepted, ready_status, late = asyncio.run(scenario())
        assert [r.status_code for r in accepted] == [200] * 12
        assert ready_status == 503
        assert late in (503, "refused")
        assert process.wait(timeout=60) == 0
