"""The model: vision encoder, text encoder, cross-modal fusion, presets and repositories.

Tensors in, tensors out. Nothing here knows about requests, queues, HTTP or
the cache; the router batches and the server decodes.
"""
