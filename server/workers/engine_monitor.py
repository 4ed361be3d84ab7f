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

In the engine, ``RecordsIntoMonitor`` takes the records in. Its first record
marks the monitor ready (the baseline is learned from then): the server is
ready once any of its engines is, and with several engines the monitor's
engine may still be warming up while another already serves. Waiting for the
monitor engine's own warm-up would leave records of served traffic outside
any baseline, and ``POST /v1/monitoring/baseline`` answering 409 "not ready"
while ``/health/ready`` answers 200.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from monitoring.inputs import RequestInputs, inputs_of_code
from server.workers.engine_client import EngineClient

if TYPE_CHECKING:
    from monitoring.monitor import Monitor


class EngineMonitor:
    """The ``record`` side of ``monitoring.Monitor``, recording in the engine's."""

    def __init__(self, client: EngineClient) -> None:
        self._client = client

    def record(self, route: str, stage_ns: Mapping[str, int], *, batch_size: int | None = None,
               cache_hit: bool | None = None, inputs: RequestInputs | None = None) -> None:
        self._client.send_record(route, stage_ns, batch_size, cache_hit, inputs)


class RecordsIntoMonitor:
    """The engine's side: each API process's record into the one monitor, the first marking it ready."""

    def __init__(self, monitor: Monitor) -> None:
        self._monitor = monitor
        self._is_marked_ready = False  # mark_ready() is idempotent but takes the monitor's lock: once is enough

    def record(self, route: str, stage_ns: Mapping[str, int], batch_size: int | None, cache_hit: bool | None,
               inputs_code: int | None) -> None:
        if not self._is_marked_ready:
            self._monitor.mark_ready()  # an answered request: the server is ready (the module's docstring)
            self._is_marked_ready = True
        self._monitor.record(route, stage_ns, batch_size=batch_size, cache_hit=cache_hit,
                             inputs=None if inputs_code is None else inputs_of_code(inputs_code))
