"""Loaded by every process of a test server (PYTHONPATH): counts image decodes per process.

With ``MMSERVE_TEST_DECODE_LOG`` set, each call of the server's image
decoder appends ``<pid>\\n`` to that file, so a test sees which process
decoded how many images across the supervisor's children.
"""

import os

if os.environ.get("MMSERVE_TEST_DECODE_LOG"):
    import server.ingest.inputs as _inputs

    _real_decode = _inputs.decode_image

    def _counting_decode(*args, **kwargs):
        with open(os.environ["MMSERVE_TEST_DECODE_LOG"], "a") as log:
            log.write(f"{os.getpid()}\n")
        return _real_decode(*args, **kwargs)

    _inputs.decode_image = _counting_decode
