"""Benchmarks for mmserve: clients that drive a running server over HTTP.

Nothing here imports the server, router or models: a benchmark must measure
what a real client sees, so it only speaks HTTP to a URL.
"""
