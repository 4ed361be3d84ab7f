"""KServe v2 over gRPC (``--grpc-port``): the same request layer, guards and errors as the HTTP routes."""
