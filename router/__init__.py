"""Modality routing, lanes, the dynamic batcher and the compute thread.

The router owns the single bridge between the asyncio world of the server and
the thread that owns the model: requests go in as ``InferenceRequest``s and
come back as ``InferenceResult``s or typed errors. No web framework here.
"""
