"""``state.monitor`` in an API process: each answered request's latency record goes to the engine's monitor.

One monitor for the whole server, as in one process: the engine's T-Digests
hold every request whichever API process answered it, so drift is judged once,
on all the traffic (not per process on a share of it, with N alarms that
disagree), attribution sees every request's inputs, and ``/v1/monitoring/*``
(answered by the engine, ``server.workers.engine_routes``) and the stage
quantiles of ``/metrics`` are the same whichever API process is asked.

A record is a few numbers (its inputs as their code: ``monitoring.inputs.inputs_of_code``
looks them up in the engine); it rides in the frames the API process writes to
the engine anyway (``server.workers.frames.CorkedFrameWriter``), with no answer.
The request layer calls ``record`` after the answer is complete, as it calls
the single process's monitor.
"""

from __future__ import annotations

from collections.abc import Mapping

from monitoring.inputs import RequestInputs
from server.workers.engine_client import EngineClient


class EngineMonitor:
    """The ``record`` side of ``monitoring.Monitor``, recording in the engine's."""

    def __init__(self, client: EngineClient) -> None:
        self._client = client

    def record(self, route: str, stage_ns: Mapping[str, int], *, batch_size: int | None = None,
               cache_hit: bool | None = None, inputs: RequestInputs | None = None) -> None:
        self._client.send_record(route, stage_ns, batch_size, cache_hit, inputs)
