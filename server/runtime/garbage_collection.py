"""Keep Python's cyclic garbage collector off the latency tail and off the CPU bill.

A loaded server tracks about half a million objects (torch, transformers,
timm, FastAPI and the model), nearly all of them alive until exit. A full
collection walks every one of them: 100-250 ms on the 2-core machine the
benchmarks run on, during which the event loop and every compute thread
stand still, so each one lands on the tail of every request in flight.

``gc.freeze()`` moves everything that exists at start-up into a permanent
generation the collector never walks; later collections only see what
requests create. It costs nothing per request. Objects frozen stay alive
until exit, which is what start-up objects do anyway.

What requests create is then the other cost. Python collects its youngest
generation each time 700 more container objects exist than at its last
collection, and requests in flight hold a few thousand (scopes, bodies,
futures, answers): under wrk's 64 connections one process ran about a
hundred young and ten middle collections a second, each on whichever thread
allocated, with the GIL held. They have little to find: a request's objects
are freed by reference counting once it is answered (at 10,000 not one
collection ran in the same load). So the young threshold is 10,000
(``gc_young_threshold``): cycles a request does leave are still collected,
once that many container objects are pending. BENCHMARKS.md's history ("garbage_collection.py") has both measured.
"""

from __future__ import annotations

import gc

def settle_collector_for_requests(young_threshold: int) -> int:
    """Once start-up is done (the model loaded, the app built): freeze what exists and collect the young
    generation after ``young_threshold`` allocations; returns how many objects are frozen."""
    num_frozen = freeze_start_up_objects()
    collect_young_objects_after(young_threshold)
    return num_frozen


def freeze_start_up_objects() -> int:
    """Exempt every object alive now from future collections; returns how many are frozen."""
    gc.freeze()
    return gc.get_freeze_count()


def collect_young_objects_after(threshold: int) -> None:
    """Collect the youngest generation once ``threshold`` more container objects exist than at the last
    collection; the older generations' thresholds are left as they are."""
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(threshold, middle, oldest)
