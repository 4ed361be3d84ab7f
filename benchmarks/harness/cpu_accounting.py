"""Where the CPU went during a run, from ``/proc``: the servers', this generator's, and everyone else's.

A server's CPU seconds per answered request (every process of its group) is
what each request cost, whatever share of the cores it got; the CPUs other
processes took meanwhile (``/proc/stat``, steal included) show a run slowed
by a neighbour. Linux only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after "(comm)" (state, ppid, pgrp, ...); None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _cpu_s(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def group_cpu_s(group_id: int) -> float:
    """CPU seconds (user + system) used so far by the live processes of process group ``group_id``."""
    every = (_stat_fields(entry) for entry in os.listdir("/proc") if entry.isdigit())
    return sum(_cpu_s(fields) for fields in every if fields is not None and int(fields[2]) == group_id)  # pgrp


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far; 0 if it is gone."""
    fields = _stat_fields(pid)
    return 0.0 if fields is None else _cpu_s(fields)


def main_thread_cpu_s(pid: int) -> float:
    """CPU seconds process ``pid``'s main thread (the thread whose id is the pid) has used so far; 0 if gone."""
    fields = _stat_fields(f"{pid}/task/{pid}")
    return 0.0 if fields is None else _cpu_s(fields)


def process_start_s(pid: int) -> float:
    """When process ``pid`` started, on the CLOCK_BOOTTIME clock (``/proc/PID/stat``'s start time, in ticks)."""
    fields = _stat_fields(pid)
    if fields is None:
        raise ProcessLookupError(pid)
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


MAIN_THREAD = " main thread"  # "engine_process main thread": part of "engine_process", not beside it


def cpu_by_process_kind(root_pid: int, main_thread_of: Sequence[str] = ("engine_process",)) -> dict[str, float]:
    """CPU seconds so far of ``root_pid`` and each child with what it started, summed by what they run.

    A server of several processes (``--api-workers N``: ``supervisor``, the
    root; ``engine_process``; ``api_process`` x N) shows where its CPU goes
    (a server of one: ``one process``);
    what a child starts (a resource tracker, a probe) counts as that child's
    kind. Two readings' difference is a run's.

    For a kind in ``main_thread_of`` the main thread of each such child is
    also read on its own, as ``"<kind> main thread"``, a part of ``<kind>``:
    the engine's main thread runs its event loop (frames, the intake, the
    answers: the work per request), its other threads the batches.
    """
    from benchmarks.harness.process_resources import child_pids, process_label

    children = child_pids(root_pid)
    by_kind: dict[str, float] = {"supervisor" if children else "one process": process_cpu_s(root_pid)}
    for child in children:
        label = process_label(child)
        family = [child]
        for pid in family:  # the child and every process under it
            family.extend(child_pids(pid))
        by_kind[label] = by_kind.get(label, 0.0) + sum(map(process_cpu_s, family))
        if label in main_thread_of:
            by_kind[label + MAIN_THREAD] = by_kind.get(label + MAIN_THREAD, 0.0) + main_thread_cpu_s(child)
    return by_kind


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (steal included: CPU another guest took)."""
    with open("/proc/stat", encoding="ascii") as stat:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in stat.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def generator_cpu_s() -> float:
    """CPU seconds of this process and of its children that have exited and been waited for.

    The load generator is this process, or a program it ran to completion
    (``wrk``): either way it is ours, not a neighbour's.
    """
    times = os.times()
    return time.process_time() + times.children_user + times.children_system


def cpu_ms_per_request(cpu_s: float, num_ok: int) -> float:
    """Milliseconds of CPU per answered request (a run that answered nothing counts as one, not as a zero divide)."""
    return 1000.0 * cpu_s / max(num_ok, 1)


class HasCpu(Protocol):
    """A server whose CPU seconds so far can be read (``ServerProcess``)."""

    def cpu_s(self) -> float: ...


@dataclass(frozen=True)
class CpuSpent:
    """CPU seconds over one run: of the measured server, of ours (generator + every server), of the machine."""

    wall_s: float
    server_s: float
    ours_s: float
    machine_s: float

    @property
    def other_cpus(self) -> float:
        """CPUs busy with neither the servers nor this generator, on average over the run (never below 0)."""
        return max(0.0, self.machine_s - self.ours_s) / self.wall_s

    def server_ms_per_request(self, num_ok: int) -> float:
        return cpu_ms_per_request(self.server_s, num_ok)


class CpuMeter:
    """Reads the clocks when made; ``stop()`` returns what was spent since.

    ``server`` is the one being measured; ``servers`` every server started
    for the comparison (paused ones take nothing, but a neighbour's work must
    not be booked as "other processes"). This process counts as ours: it is
    the load generator; so does a generator it ran as a child and waited for
    (``wrk``) before ``stop()``.
    """

    def __init__(self, server: HasCpu, servers: Sequence[HasCpu] = ()) -> None:
        self._server = server
        self._servers = tuple(servers) or (server,)
        self._started_s = time.perf_counter()
        self._machine_s = machine_busy_s()
        self._ours_s = self._ours_now_s()
        self._server_s = server.cpu_s()

    def _ours_now_s(self) -> float:
        return generator_cpu_s() + sum(server.cpu_s() for server in self._servers)

    def stop(self) -> CpuSpent:
        server_s = self._server.cpu_s() - self._server_s
        ours_s = self._ours_now_s() - self._ours_s
        machine_s = machine_busy_s() - self._machine_s
        return CpuSpent(time.perf_counter() - self._started_s, server_s, ours_s, machine_s)
