"""The towers as ONNX graphs: export, the on-disk cache of exported graphs, ONNX Runtime sessions, int8."""
