"""From a parsed input to a result: the steps every protocol shares.

    prepare_in_pool   tokenize, plan with the cache, decode if still needed (decode pool)
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


async def prepare_in_pool(state: ServerState, parsed: ParsedInput) -> PreparedInput:
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
