"""From a parsed input to a result: the steps every protocol shares.

    prepare_input     tokenize, plan with the cache, decode if still needed (decode pool)
    run_prepared      wait for segments others compute, build the InferenceRequest, submit

``/v1/infer``, the KServe v2 rows and the OpenAI items all go through here, so
limits, cache behaviour and deadlines are the same whichever protocol a client
speaks.
"""

from __future__ import annotations

import asyncio

from router.request import InferenceRequest, InferenceResult, Priority
from server.inputs import ParsedInput, PreparedInput, prepare
from server.state import ServerState


# Tokenizing this many characters takes under 100 us: less than a hop to the pool and back.
INLINE_TEXT_MAX_CHARS = 256


async def prepare_input(state: ServerState, parsed: ParsedInput) -> PreparedInput:
    """``prepare`` in the decode pool; a short text-only input on the event loop itself.

    The pool exists so image decoding never blocks the loop. A short text has
    nothing to decode, and handing it to a pool thread costs the loop more
    (a submit, a wake-up, a callback back) than tokenizing it. Fault drills
    delay the decode stage, so with fault injection on everything goes to the pool.
    """
    is_short_text = (parsed.route == "text" and parsed.text is not None
                     and len(parsed.text) <= INLINE_TEXT_MAX_CHARS)
    if is_short_text and state.faults is None:
        return prepare(parsed, state.bundle, state.router, state.settings)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        state.decode_pool, prepare, parsed, state.bundle, state.router, state.settings, state.faults
    )


async def run_prepared(state: ServerState, request_id: str, parsed: ParsedInput, prepared: PreparedInput,
                       started_ns: int) -> InferenceResult:
    """Compute what the cache did not know; the plan's claims are resolved whatever happens."""
    plan = prepared.plan
    try:
        await plan.await_coalesced()
    except BaseException:
        plan.abandon()
        raise
    request = InferenceRequest(
        request_id=request_id,
        token_ids=prepared.text.token_ids if prepared.text is not None else None,
        image=prepared.image,
        # No timeout_ms: the router applies the lane's default, counted from arrival too.
        deadline_ns=None if parsed.timeout_ms is None else started_ns + parsed.timeout_ms * 1_000_000,
        arrival_ns=started_ns,
        priority=Priority(parsed.priority),
        image_segment=plan.image_value,
        text_segment=plan.text_value,
    )
    return await state.router.submit(request, plan)
