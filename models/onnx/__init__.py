"""The towers run by ONNX Runtime on the CPU (``--runtime onnxruntime``): export, cache, sessions, checks.

    export.py         torch.onnx.export of each tower's served forward (tokens and embedding)
    export_cache.py   exported graphs on disk, keyed and written atomically
    session.py        the InferenceSession a compute thread calls, behind the encoders' ``graph`` seam
    towers.py         puts the two towers on ONNX Runtime: cache or export, session, probe check
"""
