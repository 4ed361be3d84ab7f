"""Modality routing, lanes, the dynamic batcher and the compute thread.

The router owns the single bridge between the asyncio world of the server and
the thread that owns the model. Requests come in through one call,
``router.intake.RequestIntake`` (tokenize, plan against the cache, decode the
misses, submit, settle the plan), and come back as ``InferenceResult``s or
typed errors. No web framework here.
"""
