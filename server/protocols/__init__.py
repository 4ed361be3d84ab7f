"""Wire protocols other than the native ``/v1/infer``: what users' existing clients speak.

    kserve_v2_codec    Open Inference Protocol v2 bodies (JSON + binary tensor data) <-> tensors
    kserve_v2_model    the served model as v2 sees it: metadata, input tensors -> rows -> outputs
    openai_embeddings  OpenAI ``/v1/embeddings`` bodies -> rows -> answers
    rows               one protocol request = one or many rows, one router intake call for all
                       (every protocol's, ``/v1/infer`` too, through ``server.request_layer``)

Every protocol turns its items into the same ``ParsedInput`` as ``/v1/infer`` and
hands them to the same router intake, so decoding, limits, cache behaviour and
error codes are shared; only the envelope differs.
"""
