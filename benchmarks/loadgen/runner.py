"""Sends requests on schedule and records what happened to each one.

Open loop (``run_open_loop``): every request has an *intended* send time fixed
in advance (Poisson or a trace); latency is measured from that time, not from
when the request actually left. A server that stalls therefore shows the whole
queue that built up behind the stall, instead of the generator politely
waiting and under-reporting it (coordinated omission). The scheduler only ever
sleeps until the next intended time and spawns a task; it never waits for a
response.

Closed loop (``run_closed_loop``): C workers, each sending its next request as
soon as the previous one answered. This is what many tools do and what hides
stalls; it is here to measure capacity and to show the difference.

The actual send time is when the first byte of the request headers is written
(httpcore's ``send_request_headers.started`` trace event), so time spent
opening a connection counts as the generator's lag, not the server's latency.
Every request in flight has its own connection (``ConnectionSlots``), so the
client never becomes the queue.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from benchmarks.loadgen.connection_slots import ConnectionSlots
from benchmarks.loadgen.payload import INFER_PATH, JSON_HEADERS, BodyBuilder
from benchmarks.loadgen.request_spec import Arrival, Modality
from benchmarks.loadgen.workload import SyntheticWorkload

OUTCOME_OK = "ok"
OUTCOME_CLIENT_TIMEOUT = "client_timeout"
OUTCOME_TRANSPORT_ERROR = "transport_error"
_ROUTE_PATTERN = re.compile(rb'"route"\s*:\s*"([A-Za-z_]+)"')
_HEADERS_STARTED_SUFFIX = ".send_request_headers.started"


@dataclass(frozen=True)
class Sample:
    """One request's fate; times are seconds after the run started.

    ``sent_s`` is ``None`` when the request never reached the wire (e.g. the
    connection was refused). ``outcome`` is ``"ok"``, the HTTP status as text
    (``"503"``), ``"client_timeout"`` or ``"transport_error"``. ``detail``
    says why a request failed, so a rare failure in a long run can be
    explained afterwards: the error answer's code and message, or the exception
    and what caused it (``ReadError <- ConnectionResetError: [Errno 104] ...``).
    """

    modality: Modality
    route: str
    intended_s: float
    sent_s: float | None
    done_s: float
    status: int
    outcome: str
    detail: str = ""

    @property
    def latency_s(self) -> float:
        return self.done_s - self.intended_s

    @property
    def lag_s(self) -> float | None:
        return None if self.sent_s is None else self.sent_s - self.intended_s

    @property
    def is_ok(self) -> bool:
        return self.outcome == OUTCOME_OK


@dataclass(frozen=True)
class RunResult:
    """Every sample of a run, and the run's clock origin (``time.perf_counter`` seconds)."""

    samples: tuple[Sample, ...]
    started_at_s: float
    schedule_window_s: float


class _SendTimeProbe:
    """httpcore trace callback that remembers when the request headers started going out."""

    __slots__ = ("sent_at_s",)

    def __init__(self) -> None:
        self.sent_at_s: float | None = None

    async def __call__(self, event_name: str, info: dict[str, Any]) -> None:
        if self.sent_at_s is None and event_name.endswith(_HEADERS_STARTED_SUFFIX):
            self.sent_at_s = time.perf_counter()


class Sender:
    """Sends one request to ``path``, classifies the answer and reports a ``Sample``."""

    def __init__(
        self,
        slots: ConnectionSlots,
        started_at_s: float,
        timeout_s: float,
        on_sample: Callable[[Sample], None],
        path: str = INFER_PATH,
    ) -> None:
        self._path = path
        self._slots = slots
        self._started_at_s = started_at_s
        self._timeout_s = timeout_s
        self._on_sample = on_sample

    async def send(self, modality: Modality, body: bytes, intended_at_s: float) -> None:
        probe = _SendTimeProbe()
        status = 0
        route = modality.value
        detail = ""
        client = self._slots.acquire()
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await client.post(
                    self._path, content=body, headers=JSON_HEADERS, extensions={"trace": probe}
                )
            status = response.status_code
            if 200 <= status < 300:
                outcome = OUTCOME_OK
                match = _ROUTE_PATTERN.search(response.content)
                if match is not None:
                    route = match.group(1).decode("ascii")
            else:
                outcome = str(status)
                detail = error_code_of(response.content)
        except (TimeoutError, httpx.TimeoutException) as error:
            outcome = OUTCOME_CLIENT_TIMEOUT
            detail = exception_chain(error)
        except (httpx.HTTPError, OSError) as error:
            outcome = OUTCOME_TRANSPORT_ERROR
            detail = exception_chain(error)
        finally:
            self._slots.release(client)
        done_at_s = time.perf_counter()
        origin_s = self._started_at_s
        self._on_sample(
            Sample(
                modality=modality,
                route=route,
                intended_s=intended_at_s - origin_s,
                sent_s=None if probe.sent_at_s is None else probe.sent_at_s - origin_s,
                done_s=done_at_s - origin_s,
                status=status,
                outcome=outcome,
                detail=detail,
            )
        )


def error_code_of(body: bytes) -> str:
    """``code: message`` of an error answer (``{"error": {"code", "message"}}``), or ``""`` for any other body."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return ""
    if not isinstance(error, dict) or "code" not in error:
        return ""
    return f"{error['code']}: {error.get('message', '')}".rstrip(": ")


def exception_chain(error: BaseException) -> str:
    """An exception and the ones that caused it, outermost first: ``ReadError <- ConnectionResetError: ...``."""
    links = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        message = str(current)
        links.append(f"{type(current).__name__}: {message}" if message else type(current).__name__)
        current = current.__cause__ or current.__context__
    return " <- ".join(links)


def _recorder(on_sample: Callable[[Sample], None]) -> tuple[list[Sample], Callable[[Sample], None]]:
    """The list a run returns its samples in, and the callback that fills it and passes each sample on."""
    samples: list[Sample] = []

    def record(sample: Sample) -> None:
        samples.append(sample)
        on_sample(sample)

    return samples, record


async def run_open_loop(
    slots: ConnectionSlots,
    arrivals: Iterable[Arrival],
    builder: BodyBuilder,
    schedule_window_s: float,
    timeout_s: float,
    on_sample: Callable[[Sample], None] = lambda sample: None,
) -> RunResult:
    """Send every arrival at its intended time, never waiting for answers; then drain."""
    samples, record = _recorder(on_sample)
    started_at_s = time.perf_counter()
    sender = Sender(slots, started_at_s, timeout_s, record, builder.path)
    in_flight: set[asyncio.Task[None]] = set()
    for arrival in arrivals:
        body = builder.build(arrival.spec)  # built before the wait, so it costs no lag
        intended_at_s = started_at_s + arrival.intended_offset_s
        delay_s = intended_at_s - time.perf_counter()
        # Behind schedule: still yield once, so already-spawned requests can go out.
        await asyncio.sleep(delay_s if delay_s > 0.0 else 0.0)
        task = asyncio.create_task(sender.send(arrival.spec.modality, body, intended_at_s))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    if in_flight:
        await asyncio.gather(*in_flight)
    return RunResult(tuple(samples), started_at_s, schedule_window_s)


async def run_closed_loop(
    slots: ConnectionSlots,
    workload: SyntheticWorkload,
    builder: BodyBuilder,
    concurrency: int,
    duration_s: float,
    timeout_s: float,
    on_sample: Callable[[Sample], None] = lambda sample: None,
) -> RunResult:
    """``concurrency`` workers, each sending back to back until ``duration_s`` has passed."""
    samples, record = _recorder(on_sample)
    started_at_s = time.perf_counter()
    stop_at_s = started_at_s + duration_s
    sender = Sender(slots, started_at_s, timeout_s, record, builder.path)

    async def worker() -> None:
        while time.perf_counter() < stop_at_s:
            spec = workload.next_spec()
            body = builder.build(spec)
            await sender.send(spec.modality, body, time.perf_counter())

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return RunResult(tuple(samples), started_at_s, duration_s)
