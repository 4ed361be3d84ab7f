"""Programs that talk to running mmserve replicas over HTTP (``mmserve quantiles``).

A client is not part of the server: it imports no serving package, only what
reads the data replicas publish (``monitoring``), and reaches the server over
the network like any other client.
"""
