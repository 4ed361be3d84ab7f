"""HTTP routes, one module per concern.

An inference route describes its protocol as a ``server.request_layer.Endpoint``
(parse, check, render, render an error) and hands the request to
``server.request_layer.serve``, which owns its id, clock, trace, metrics and
monitoring record.
"""
