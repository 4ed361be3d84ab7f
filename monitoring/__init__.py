"""Latency accounting and Prometheus export for mmserve.

This package imports nothing else of mmserve's: whoever needs it receives the
objects through a constructor, so the serving code never reaches for globals.
"""
