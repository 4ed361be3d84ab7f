"""The ``mmserve`` command line.

    mmserve serve [--preset vit-l16|vit-b16|tiny|synthetic | --model-repo DIR | --model DIR_OR_HUB_ID] [--host H] [--port P]
                  [--api-workers N] [--device auto|cpu|cuda] [--dtype auto|float32|bfloat16|float16]
                  [--decode-device cpu|cuda] [--jpeg-draft] [--served-model-name NAME] [--config FILE]
                  [--runtime auto|torch|onnxruntime] [--quantize int8] [--compute-threads N]
                  [--export-cache-dir DIR]
    mmserve init-model-repo DIR --preset NAME [--seed N]
    mmserve export [--preset NAME | --model-repo DIR | --model DIR_OR_HUB_ID] [--runtime auto|onnxruntime]
                   [--quantize int8] [--export-cache-dir DIR]    (fills the exported-graph cache ahead of time)
    mmserve train-fusion --model DIR_OR_HUB_ID --pairs FILE.jsonl --out DIR [--epochs N] [--lr LR] [--seed N]
                         [--keep-untrained-result]     (exit 3: the head learned nothing)
    mmserve bench URL ...           (the load generator; see `mmserve bench --help`)
    mmserve quantiles URL [URL ...] [--source window|lifetime]   (fleet-wide latency quantiles)
    mmserve hash-key < KEY          (the sha256: line standing for a key in a key file)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from models.families.presets import DEFAULT_PRESET, PRESET_NAMES
from server.train_fusion_command import train_fusion_parser

_EPILOG = """\
examples:
  mmserve serve                                  # default preset (vit-l16), random weights, port 8000
  mmserve serve --preset tiny --port 8080        # a tiny model that starts in seconds
  mmserve init-model-repo ./my-model --preset vit-b16
  mmserve serve --model-repo ./my-model
  mmserve serve --model google/siglip-large-patch16-256   # from the local Hugging Face cache
  mmserve serve --model ./my-clip                          # a save_pretrained directory
  mmserve train-fusion --model ./my-clip --pairs pairs.jsonl --out ./head   # train the fusion head
  mmserve serve --model ./my-clip --fusion-head ./head/fusion_head.safetensors
  curl -s localhost:8000/v1/infer -H 'content-type: application/json' -d '{"text": "a red bicycle"}'

Every setting can also come from the environment as MMSERVE_<NAME> (e.g. MMSERVE_MAX_BATCH_SIZE=16)
or from a YAML file given with --config; flags win over the environment, which wins over the file.
"""


def _serve_parser(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser(
        "serve", help="start the HTTP server",
        description="Start the mmserve HTTP server (POST /v1/infer, /health/*, /metrics, /docs).",
    )
    source = serve.add_mutually_exclusive_group()
    source.add_argument("--preset", choices=PRESET_NAMES,
                        help=f"model preset with seeded random weights (default {DEFAULT_PRESET})")
    source.add_argument("--model-repo", type=Path, metavar="DIR",
                        help="serve the model repository in DIR (see init-model-repo)")
    source.add_argument("--model", metavar="DIR_OR_HUB_ID",
                        help="serve a pretrained SigLIP or CLIP model: a local directory, or a Hugging Face Hub id "
                             "found in the local Hub cache (HF_HOME / HF_HUB_CACHE; HF_HUB_OFFLINE=1 never downloads)")
    serve.add_argument("--fusion-head", type=Path, metavar="FILE",
                       help="a trained fusion head (default: fusion_head.safetensors beside the model)")
    serve.add_argument("--seed", type=int, help="seed of a preset's random weights (default 0)")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default 8000)")
    serve.add_argument("--grpc-port", type=int, help="also serve KServe v2 over gRPC here (Triton's: 8001; default off)")
    serve.add_argument("--api-workers", type=int, metavar="N",  # the range: Settings' one-line refusal
                       help="API processes sharing the port in front of the engines; 1 with one engine: one process "
                            "(default: 1 on a CPU device or 2 CPUs, else min(CPUs - 1, 3))")
    serve.add_argument("--engines", type=_engine_count, metavar="N|auto",
                       help="engine processes behind the API processes, each with its own model and cache; a "
                            "request goes to the one that owns its first cacheable segment (default 1; auto: one "
                            "per visible GPU)")
    serve.add_argument("--devices", metavar="cuda:0,cuda:1",
                       help="one engine per listed device (sets --engines)")
    serve.add_argument("--engine-dispatch", choices=("affinity", "round_robin"),
                       help="how requests are spread over several engines (default affinity: by cache key)")
    serve.add_argument("--device", choices=("auto", "cpu", "cuda"), help="default auto")
    serve.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"),
                       help="what the model computes in (default auto: bfloat16 on CUDA, float32 on the CPU)")
    serve.add_argument("--decode-device", choices=("cpu", "cuda"),
                       help="where JPEGs are decoded (default cpu; cuda: nvJPEG, needs a CUDA device)")
    serve.add_argument("--jpeg-draft", action="store_true", default=None,
                       help="decode large JPEGs reduced in the DCT, down to the model's input size (faster, pixels "
                            "within about one level; default off: the exact decode)")
    _runtime_arguments(serve)
    serve.add_argument("--served-model-name", metavar="NAME",
                       help="the model's name in answers (default: the Hub id or directory name of --model; "
                            "a model repository's name in its model.yaml, which init-model-repo sets to the "
                            "directory's name)")
    serve.add_argument("--config", type=Path, metavar="FILE", help="YAML file of settings")
    serve.add_argument("--enable-fault-injection", action="store_true", default=None,
                       help="turn on POST /v1/admin/faults for alert drills (off by default)")
    serve.add_argument("--allow-open-admin", action="store_true", default=None,
                       help="with no admin keys, leave the admin routes open off loopback too (default: 403 there)")


def _runtime_arguments(parser: argparse.ArgumentParser, runtime_help: str = "what runs the towers (default auto: "
                       "ONNX Runtime on the CPU, torch on CUDA)") -> None:
    parser.add_argument("--runtime", choices=("auto", "torch", "onnxruntime"), help=runtime_help)
    parser.add_argument("--quantize", choices=("int8",),
                        help="run the towers' matrix multiplies in int8 (ONNX Runtime only; default off)")
    parser.add_argument("--compute-threads", type=_positive_int, metavar="N",
                        help="intra-op threads of the runtime computing the towers (default: its own)")
    parser.add_argument("--export-cache-dir", type=Path, metavar="DIR",
                        help="where exported ONNX graphs are kept (default ~/.cache/mmserve/onnx)")


def _export_parser(subparsers: argparse._SubParsersAction) -> None:
    export = subparsers.add_parser(
        "export", help="fill the exported-graph cache ahead of time",
        description="Export the towers of the model `mmserve serve` would load with the same model options to "
                    "ONNX (on the CPU, in float32), check them against torch and keep them in the export cache, so "
                    "a later start reads them. It takes the model's options below, not serve's device or server "
                    "ones.",
    )
    source = export.add_mutually_exclusive_group()
    source.add_argument("--preset", choices=PRESET_NAMES, help=f"a preset (default {DEFAULT_PRESET})")
    source.add_argument("--model-repo", type=Path, metavar="DIR")
    source.add_argument("--model", metavar="DIR_OR_HUB_ID")
    export.add_argument("--fusion-head", type=Path, metavar="FILE")
    export.add_argument("--seed", type=int, help="seed of a preset's random weights (default 0)")
    export.add_argument("--served-model-name", metavar="NAME")
    export.add_argument("--config", type=Path, metavar="FILE", help="YAML file of settings")
    # torch stays a choice so that it is refused naming why (it has nothing to export), not as a bad spelling.
    _runtime_arguments(export, "auto or onnxruntime, the same here: export writes ONNX Runtime's graphs "
                               "(torch has nothing to export)")


def _init_parser(subparsers: argparse._SubParsersAction) -> None:
    init = subparsers.add_parser(
        "init-model-repo", help="write a loadable model repository",
        description="Write DIR/model.yaml, DIR/weights.safetensors and DIR/tokenizer/ for a preset "
                    "with seeded random weights; replace the weights with real ones to serve them.",
    )
    init.add_argument("directory", type=Path, metavar="DIR")
    init.add_argument("--preset", required=True, choices=PRESET_NAMES)
    init.add_argument("--seed", type=int, default=0)


def _engine_count(value: str) -> int | str:
    """``auto`` or a number; its range is Settings' to refuse, in the one line every setting gets."""
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be auto or a number, got {value!r}") from None


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _quantiles_parser(subparsers: argparse._SubParsersAction) -> None:
    quantiles = subparsers.add_parser(
        "quantiles", help="fleet-wide latency quantiles, merged from every replica's digests",
        description="Fetch GET /v1/monitoring/digests from each replica, merge the T-Digests of each "
                    "route and stage, and print the fleet's quantiles (P50 to P99.99) in milliseconds. "
                    "Exits 2 when a replica cannot be read, and for a usage error (a URL that is not "
                    "http[s]://HOST[:PORT] or HOST:PORT, a replica given twice, --timeout-s not > 0).",
    )
    quantiles.add_argument("urls", nargs="+", metavar="URL", help="a replica's base URL, e.g. http://10.0.0.7:8000")
    quantiles.add_argument("--source", choices=("window", "lifetime"), default="window",
                           help="the sliding window (default; MMSERVE_DRIFT_WINDOW_S) or everything since start")
    quantiles.add_argument("--timeout-s", type=float, default=10.0, help="per-replica HTTP timeout in seconds, > 0 (default 10)")
    quantiles.add_argument("--api-key-file", type=Path, metavar="FILE",
                           help="send the first key in FILE as a bearer token (servers with API keys)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmserve",
        description="mmserve: an online multimodal (image + text) inference server.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _serve_parser(subparsers)
    _init_parser(subparsers)
    _export_parser(subparsers)
    train_fusion_parser(subparsers)
    _quantiles_parser(subparsers)
    subparsers.add_parser(
        "hash-key", help="print the sha256: key-file line of a key read from standard input",
        description="Read a key from standard input (all of it, less one trailing newline; no other whitespace is "
                    "stripped) and print sha256:<lowercase hex SHA-256 of its UTF-8 bytes>, a line for "
                    "MMSERVE_API_KEY_FILE or MMSERVE_ADMIN_API_KEY_FILE that does not hold the key itself. "
                    "Example: printf %s \"$KEY\" | mmserve hash-key >> admin-keys")
    subparsers.add_parser("bench", help="drive a server with open-loop load (mmserve bench --help)",
                          add_help=False)
    return parser


def _serve(args: argparse.Namespace) -> int:
    """Settings, then every check that needs no weights (``server.runtime.startup_checks``), then the server."""
    from pydantic import ValidationError

    from server.runtime.startup_checks import (CONFIGURATION_ERRORS, StartupError,
                                               bind_listening_socket, check_other_ports, check_without_torch,
                                               settings_error)
    from server.settings import load_settings

    try:
        settings = load_settings(
            args.config, preset=args.preset, model_repo=args.model_repo, model=args.model,
            fusion_head=args.fusion_head, seed=args.seed,
            host=args.host, port=args.port, grpc_port=args.grpc_port, device=args.device, dtype=args.dtype,
            decode_device=args.decode_device,
            jpeg_draft=args.jpeg_draft,
            served_model_name=args.served_model_name, enable_fault_injection=args.enable_fault_injection,
            allow_open_admin=args.allow_open_admin, api_workers=args.api_workers, runtime=args.runtime,
            quantize=args.quantize, compute_threads=args.compute_threads, export_cache_dir=args.export_cache_dir,
            engines=args.engines, devices=args.devices, engine_dispatch=args.engine_dispatch,
        )
    except ValidationError as e:
        raise settings_error(e, flags=vars(args)) from e
    from server.runtime.log_output import configure_logging

    configure_logging(settings.log_level, "%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.api_workers is None:
        from server.workers.default_count import api_workers_for

        settings = settings.model_copy(update={"api_workers": api_workers_for(settings.device)})
    check_without_torch(settings)  # keys, the model's files, --device cpu, the export cache: before torch
    from server.workers.engine_plan import num_engines

    engines = num_engines(settings)
    if settings.api_workers > 1 or engines > 1:  # only API processes can send each request to one of the engines
        from server.workers.supervisor import run_supervised

        return run_supervised(settings.model_copy(update={"engines": engines}), settings.api_workers)  # no torch here
    named_device = None
    if settings.devices is not None:  # one device: this process is its one engine, set up as engine_plans sets one
        import os

        from server.workers.engine_plan import engine_plans

        named_device = f"--devices {settings.devices[0]} (MMSERVE_DEVICES)"
        (plan,) = engine_plans(settings, 1)
        settings = plan.settings
        os.environ.update(plan.environment)  # the GPU it names, alone visible: torch is not imported yet
    listening = bind_listening_socket(settings.host, settings.port)  # a bad address fails before the model loads
    check_other_ports(settings)
    from server.runtime.model_loading import plan_device  # torch: this process loads the model anyway

    try:
        plan_device(settings)  # --device, --dtype, --decode-device against this machine, before any weight is read
    except CONFIGURATION_ERRORS as e:
        if named_device is None:
            raise
        raise StartupError(f"{named_device}: {e}") from e  # the setting the user gave, as several engines name it
    from server.app import create_app
    from server.runtime.lifecycle import serve_until_stopped

    exit_code, start_up_error = serve_until_stopped(create_app(settings), settings, listening, announce_address=True)
    if start_up_error is not None:
        raise start_up_error from None  # printed as one line by main()
    return exit_code


def _export(args: argparse.Namespace) -> int:
    from server.runtime.log_output import configure_logging
    from server.settings import load_settings

    from pydantic import ValidationError

    from server.runtime.startup_checks import settings_error

    try:
        settings = load_settings(
            args.config, preset=args.preset, model_repo=args.model_repo, model=args.model,
            fusion_head=args.fusion_head, seed=args.seed, served_model_name=args.served_model_name,
            runtime=args.runtime, quantize=args.quantize, compute_threads=args.compute_threads,
            export_cache_dir=args.export_cache_dir, device="cpu", dtype="float32")  # over serve's, from env or file
    except ValidationError as e:
        raise settings_error(e, flags=vars(args)) from e
    configure_logging(settings.log_level, "%(asctime)s %(levelname)s %(name)s: %(message)s")
    from server.export_command import run_export  # imports torch: after the settings are known to be good

    return run_export(settings)


def _init_model_repo(args: argparse.Namespace) -> int:
    import dataclasses

    from models.loading.repository import build_preset, write_repository

    bundle = build_preset(args.preset, seed=args.seed)
    name = args.directory.resolve().name  # model.yaml's name: what `serve --model DIR` answers as (not the preset's)
    write_repository(args.directory, dataclasses.replace(bundle, config=dataclasses.replace(bundle.config, name=name)))
    print(f"wrote {args.preset} (seed {args.seed}) to {args.directory}, named {name!r} in its model.yaml; "
          f"fingerprint {bundle.fingerprint}")
    print(f"serve it with: mmserve serve --model-repo {args.directory}")
    return 0


def _hash_key() -> int:
    from server.http.keys import hashed_key_line

    key = sys.stdin.buffer.read()
    key = key[:-1] if key.endswith(b"\n") else key
    try:
        key.decode("utf-8")
    except UnicodeDecodeError:
        print("mmserve: the key on standard input is not UTF-8", file=sys.stderr)
        return 2
    if not key:
        print("mmserve: no key on standard input", file=sys.stderr)
        return 2
    if key != key.strip():
        print("mmserve: warning: the key starts or ends with whitespace, which a Bearer header cannot carry",
              file=sys.stderr)
    print(hashed_key_line(key))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        from benchmarks.loadgen.cli import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "hash-key":
        return _hash_key()
    if args.command == "quantiles":
        from clients.quantiles import run_quantiles

        return run_quantiles(args.urls, source=args.source, timeout_s=args.timeout_s,
                             api_key_file=args.api_key_file)
    from server.runtime.startup_checks import CONFIGURATION_ERRORS, StartupError

    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "export":
            return _export(args)
        if args.command == "train-fusion":
            from server.train_fusion_command import run_train_fusion

            return run_train_fusion(args)
        return _init_model_repo(args)
    except (*CONFIGURATION_ERRORS, StartupError) as e:
        import logging

        # The traceback at --log-level debug only (refused before the lifespan as inside it); then one line,
        # whatever the message: a library's own text (transformers' tokenizer errors) may span several, and the
        # last line is what a user (and a log scraper) reads.
        logging.getLogger(__name__).debug("start-up refused", exc_info=True)
        print("mmserve: " + " ".join(str(e).split()), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
