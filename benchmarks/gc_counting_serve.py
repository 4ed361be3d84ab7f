"""``mmserve serve`` with its garbage collections counted: ``python -m benchmarks.gc_counting_serve serve ARGS``.

For ``benchmarks.garbage_collection``. Before the server starts, a
``gc.callbacks`` hook counts every collection by generation with the CPU
time it took on the thread that ran it (collections run on whichever thread
allocated, with the GIL held) and the longest one; a daemon thread writes
the totals as JSON to ``$GC_STATS_FILE`` ten times a second, so the
benchmark reads them between runs without signalling the server; a file
``$GC_STATS_FILE.reset`` found there starts the longest collection over
(start-up's full collections would otherwise be the longest of every run).
Nothing else about the server changes.
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import threading
import time
from pathlib import Path

WRITE_INTERVAL_S = 0.1


class CollectionCounter:
    """Collections per generation, their thread CPU seconds, and the longest one's."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.cpu_s = [0.0, 0.0, 0.0]
        self.longest_cpu_s = 0.0
        self._started = threading.local()

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started.cpu_s = time.thread_time()
            return
        spent_s = time.thread_time() - getattr(self._started, "cpu_s", time.thread_time())
        generation = info["generation"]
        self.collections[generation] += 1
        self.cpu_s[generation] += spent_s
        self.longest_cpu_s = max(self.longest_cpu_s, spent_s)

    def totals(self) -> dict:
        return {"collections": list(self.collections), "cpu_s": list(self.cpu_s), "longest_cpu_s": self.longest_cpu_s,
                "threshold": list(gc.get_threshold())}


def write_totals(counter: CollectionCounter, path: Path, stopped: threading.Event) -> None:
    """Write the totals to ``path`` every ``WRITE_INTERVAL_S`` until ``stopped`` (the server: never)."""
    partial = path.with_suffix(".partial")
    reset = path.with_name(path.name + ".reset")
    while True:
        if reset.exists():
            counter.longest_cpu_s = 0.0
            reset.unlink()
        partial.write_text(json.dumps(counter.totals()))
        partial.replace(path)
        if stopped.wait(WRITE_INTERVAL_S):
            return


if __name__ == "__main__":
    counter = CollectionCounter()
    gc.callbacks.append(counter)
    threading.Thread(target=write_totals, args=(counter, Path(os.environ["GC_STATS_FILE"]), threading.Event()),
                     name="gc-stats-writer", daemon=True).start()
    # As ``python -m server.cli ARGS`` runs it, in this process, where the hook sees its collections;
    # a benchmark imports no server module.
    runpy.run_module("server.cli", run_name="__main__", alter_sys=True)
