"""A batch's outcomes reach their event loop with one wake-up, each future settled as before."""

from __future__ import annotations

import asyncio
import threading

from router.errors import DeadlineExceededError
from router.lanes import Pending
from router.request import InferenceRequest, InferenceResult, Route
from router.worker import settle_all


def _pending(loop: asyncio.AbstractEventLoop, name: str) -> Pending:
    return Pending(InferenceRequest(request_id=name, token_ids=(1, 2)), enqueued_ns=0, future=loop.create_future(),
                   loop=loop)


def test_a_batch_is_settled_from_another_thread_with_one_wake_up():
    loop = asyncio.new_event_loop()
    wake_ups = []
    call_soon_threadsafe = loop.call_soon_threadsafe

    def counted(*args, **kwargs):  # the loop's own method, counted
        wake_ups.append(args[0])
        return call_soon_threadsafe(*args, **kwargs)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    try:
        batch = [_pending(loop, name) for name in "abcd"]
        batch[2].future.cancel()  # its client went away meanwhile: left as it is
        error = DeadlineExceededError("late")
        outcomes = [InferenceResult(Route.TEXT), error, InferenceResult(Route.TEXT), InferenceResult(Route.TEXT)]

        async def wait_for_all() -> list:
            thread = threading.Thread(target=settle_all, args=(list(zip(batch, outcomes)),))
            thread.start()
            thread.join()
            return await asyncio.gather(*(p.future for p in batch), return_exceptions=True)

        settled = loop.run_until_complete(wait_for_all())
    finally:
        loop.close()
    assert len(wake_ups) == 1
    assert settled[0] is outcomes[0] and settled[1] is error and settled[3] is outcomes[3]
    assert isinstance(settled[2], asyncio.CancelledError)


def test_outcomes_for_a_closed_loop_are_dropped_quietly():
    loop = asyncio.new_event_loop()
    pending = _pending(loop, "a")
    loop.close()
    settle_all([(pending, InferenceResult(Route.TEXT))])  # no exception: nobody is left to answer
    assert not pending.future.done()
    settle_all([])  # an empty batch (only expired items, none of them) wakes nobody
