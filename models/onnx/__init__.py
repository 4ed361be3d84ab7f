"""The towers as ONNX graphs run by ONNX Runtime on the CPU (``--runtime onnxruntime``).

    export.py         torch.onnx.export of each tower's served forward (tokens and embedding)
    export_cache.py   exported graphs on disk, keyed and written atomically
    session.py        the InferenceSession a compute thread calls, behind the encoders' ``graph`` seam
    towers.py         puts the two towers on ONNX Runtime: cache or export, session, probe check
    quantize.py       int8 matrix multiplies (``--quantize int8``) and the cosine it is judged by
"""
