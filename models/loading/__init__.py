"""Loading: where a model's files are (a directory or the local Hub cache), what ``model.yaml``
says (``ModelConfig``), and the model repository format with its fingerprint.
"""
