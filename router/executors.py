"""Which lanes share a compute thread, and how those threads share the machine.

Lanes share one model, but not necessarily one thread. With a single compute
thread a text request that arrives just after a vision batch started waits
for the whole batch: one ViT batch takes seconds on a CPU and tens of
milliseconds on a GPU, a text batch a fraction of that. So by default the
text lane gets its own executor (thread, and CUDA stream), and the two image
lanes (vision, fusion) share the other, where the scheduler still picks
between them by earliest deadline.

Running side by side, the two compete for the CPU cores (or the GPU's SMs).
The image executor therefore runs at a lower priority: a CPU nice value for
its thread and the OpenMP workers it starts (Linux threads inherit it), and
a normal-priority stream where the text executor gets a high-priority one.
The lower priority only matters while both have work; an idle text lane
leaves the image executor the whole machine.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass

from router.request import Route

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExecutorPlan:
    """One compute thread: its name, its lanes and its priority."""

    name: str
    routes: tuple[Route, ...]
    nice: int = 0  # added to the thread's CPU nice value (Linux); 0 leaves it alone
    high_priority_stream: bool = False  # CUDA: run on a high-priority stream

    def __post_init__(self) -> None:
        if not self.routes:
            raise ValueError(f"executor {self.name!r} serves no lane")
        if self.nice < 0:
            raise ValueError("an executor can only lower its priority (nice >= 0)")


def shared_executor() -> tuple[ExecutorPlan, ...]:
    """Every lane on one compute thread: batches of all lanes run strictly one after another."""
    return (ExecutorPlan("compute", tuple(Route)),)


def executor_plans(*, separate_text: bool, image_nice: int) -> tuple[ExecutorPlan, ...]:
    """The server's executors: text on its own thread unless ``separate_text`` is off."""
    if not separate_text:
        return shared_executor()
    return (
        ExecutorPlan("text", (Route.TEXT,), high_priority_stream=True),
        ExecutorPlan("image", (Route.VISION, Route.FUSION), nice=image_nice),
    )


def validate(plans: tuple[ExecutorPlan, ...]) -> None:
    """Every lane is served by exactly one executor."""
    routes = [route for plan in plans for route in plan.routes]
    if sorted(routes) != sorted(Route):
        raise ValueError(f"each lane needs exactly one executor, got {[r.value for r in routes]}")


def lower_current_thread_priority(nice: int) -> bool:
    """Add ``nice`` to the calling thread's nice value; ``True`` if applied.

    Linux only: there a thread is a task with its own nice value, inherited
    by the threads it creates (the OpenMP workers of its torch calls). On
    other systems ``setpriority`` would change the whole process, so this
    does nothing there.
    """
    if nice <= 0 or not sys.platform.startswith("linux"):
        return False
    thread_id = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, thread_id, os.getpriority(os.PRIO_PROCESS, thread_id) + nice)
    except OSError as e:
        logger.warning("could not lower the priority of thread %d: %s", thread_id, e)
        return False
    return True
