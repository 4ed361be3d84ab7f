"""Loaded by every process of a test server (PYTHONPATH): counts work per process.

With ``MMSERVE_TEST_DECODE_LOG`` set, each call of the server's image
decoder appends ``<pid>\\n`` to that file, so a test sees which process
decoded how many images across the supervisor's children. Likewise
``MMSERVE_TEST_TOKENIZE_LOG`` for each text tokenized (``LimitedTokenizer.encode``, which every tokenizer uses;
``MMSERVE_TEST_TOKENIZE_DELAY_S`` makes each call take that much longer, so a
test can find tokenizing in a stage's time) and ``MMSERVE_TEST_PIXELS_LOG``
for each array turned into the model's input (raw uploads, arrays a decoder
returned: ``models.preprocessing.pixels_to_model_input``), and
``MMSERVE_TEST_PEEK_LOG`` for each time an API process asks the engine which images it holds.
``MMSERVE_TEST_TOKENIZER_REFUSED`` makes every API process's start-up fail as one whose
tokenizer cannot be rebuilt as the engine's does. With ``MMSERVE_TEST_MODULES_DIR`` set, a
process sent SIGUSR2 writes the names in its ``sys.modules`` to ``<dir>/<pid>`` (what a live
process has imported by then). While the file named by ``MMSERVE_TEST_API_CRASH_FILE`` exists,
every API process that starts exits at once with status 1 (a crash at start: before any import
of the server's in a new interpreter, right after the fork in one the fork server forks).
"""

import os
import signal
import sys
import time

if os.environ.get("MMSERVE_TEST_API_CRASH_FILE"):
    with open("/proc/self/cmdline", "rb") as _command_line:
        _command = _command_line.read()
    if b"server.workers.api_process" in _command and os.path.exists(os.environ["MMSERVE_TEST_API_CRASH_FILE"]):
        os._exit(1)
    if b"server.workers.api_forkserver" in _command:  # its forks start here, not in a new interpreter
        _fork_server_pid = os.getpid()

        def _crash_at_start():  # noqa: ANN202
            # The fork server forks an intermediate (its child), which forks the API process and exits.
            if os.getppid() != _fork_server_pid and os.path.exists(os.environ["MMSERVE_TEST_API_CRASH_FILE"]):
                os._exit(1)

        os.register_at_fork(after_in_child=_crash_at_start)


def _logging(real, variable):  # noqa: ANN001, ANN202 - wraps any callable
    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        with open(os.environ[variable], "a") as log:
            log.write(f"{os.getpid()}\n")
        return real(*args, **kwargs)

    return counted


if os.environ.get("MMSERVE_TEST_PIXELS_LOG"):  # first: later imports take the function by name
    import models.preprocessing as _preprocessing

    _preprocessing.pixels_to_model_input = _logging(_preprocessing.pixels_to_model_input, "MMSERVE_TEST_PIXELS_LOG")

if os.environ.get("MMSERVE_TEST_TOKENIZE_LOG") or os.environ.get("MMSERVE_TEST_TOKENIZE_DELAY_S"):
    from models.torch_free.text_ids import LimitedTokenizer as _LimitedTokenizer  # no torch in API processes

    _real_encode = _LimitedTokenizer.encode
    _delay_s = float(os.environ.get("MMSERVE_TEST_TOKENIZE_DELAY_S") or 0)

    def _slow_encode(self, text, *, truncate):  # noqa: ANN001, ANN202
        time.sleep(_delay_s)
        return _real_encode(self, text, truncate=truncate)

    _LimitedTokenizer.encode = (_logging(_slow_encode, "MMSERVE_TEST_TOKENIZE_LOG")
                             if os.environ.get("MMSERVE_TEST_TOKENIZE_LOG") else _slow_encode)

if os.environ.get("MMSERVE_TEST_DECODE_LOG"):
    import server.ingest.inputs as _inputs

    _inputs.decode_image = _logging(_inputs.decode_image, "MMSERVE_TEST_DECODE_LOG")

if os.environ.get("MMSERVE_TEST_PEEK_LOG"):  # asked from the API process (the engine runs as __main__)
    from server.workers.engine_connection import EngineConnection as _EngineConnection

    _real_call = _EngineConnection.call
    _logged_call = _logging(_real_call, "MMSERVE_TEST_PEEK_LOG")

    def _call_logging_peeks(self, *message):  # noqa: ANN001, ANN002, ANN202
        return (_logged_call if message[0] == "peek" else _real_call)(self, *message)

    _EngineConnection.call = _call_logging_peeks

if os.environ.get("MMSERVE_TEST_TOKENIZER_REFUSED"):  # only API processes rebuild the engine's tokenizer
    import models.tokenizer_files as _tokenizer_files

    def _refuse(files):  # noqa: ANN001, ANN202
        raise RuntimeError("the engine's tokenizer files build a different tokenizer here")

    _tokenizer_files.unpack_tokenizer = _refuse

if os.environ.get("MMSERVE_TEST_MODULES_DIR"):
    def _write_modules(signum, frame):  # noqa: ANN001, ANN202, ARG001 - a signal handler
        path = os.path.join(os.environ["MMSERVE_TEST_MODULES_DIR"], str(os.getpid()))
        with open(path + ".part", "w") as out:
            out.write("\n".join(sorted(sys.modules)))
        os.replace(path + ".part", path)  # whole, or not there

    signal.signal(signal.SIGUSR2, _write_modules)
