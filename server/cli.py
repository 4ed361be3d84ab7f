"""The ``mmserve`` command line.

    mmserve serve [--preset vit-l16|vit-b16|tiny | --model-repo DIR] [--host H] [--port P]
                  [--device auto|cpu|cuda] [--config FILE]
    mmserve init-model-repo DIR --preset NAME [--seed N]
    mmserve bench URL ...           (the load generator; see `mmserve bench --help`)
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from models.presets import DEFAULT_PRESET, PRESET_NAMES

_EPILOG = """\
examples:
  mmserve serve                                  # default preset (vit-l16), random weights, port 8000
  mmserve serve --preset tiny --port 8080        # a tiny model that starts in seconds
  mmserve init-model-repo ./my-model --preset vit-b16
  mmserve serve --model-repo ./my-model
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
    serve.add_argument("--seed", type=int, help="seed of a preset's random weights (default 0)")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default 8000)")
    serve.add_argument("--device", choices=("auto", "cpu", "cuda"), help="default auto")
    serve.add_argument("--config", type=Path, metavar="FILE", help="YAML file of settings")
    serve.add_argument("--enable-fault-injection", action="store_true", default=None,
                       help="turn on POST /v1/admin/faults for alert drills (off by default)")


def _init_parser(subparsers: argparse._SubParsersAction) -> None:
    init = subparsers.add_parser(
        "init-model-repo", help="write a loadable model repository",
        description="Write DIR/model.yaml, DIR/weights.safetensors and DIR/tokenizer/ for a preset "
                    "with seeded random weights; replace the weights with real ones to serve them.",
    )
    init.add_argument("directory", type=Path, metavar="DIR")
    init.add_argument("--preset", required=True, choices=PRESET_NAMES)
    init.add_argument("--seed", type=int, default=0)


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
    subparsers.add_parser("bench", help="drive a server with open-loop load (mmserve bench --help)",
                          add_help=False)
    return parser


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from server.app import create_app
    from server.lifecycle import DrainingServer
    from server.settings import load_settings

    settings = load_settings(
        args.config, preset=args.preset, model_repo=args.model_repo, seed=args.seed,
        host=args.host, port=args.port, device=args.device,
        enable_fault_injection=args.enable_fault_injection,
    )
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level)
    server = DrainingServer(config, app, settings.drain_timeout_s)
    server.run()
    return 0 if server.started else 1


def _init_model_repo(args: argparse.Namespace) -> int:
    from models.repository import build_preset, write_repository

    bundle = build_preset(args.preset, seed=args.seed)
    write_repository(args.directory, bundle)
    print(f"wrote {args.preset} (seed {args.seed}) to {args.directory}; fingerprint {bundle.fingerprint}")
    print(f"serve it with: mmserve serve --model-repo {args.directory}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        from benchmarks.loadgen.cli import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    from models.errors import ModelError

    try:
        if args.command == "serve":
            return _serve(args)
        return _init_model_repo(args)
    except ModelError as e:
        print(f"mmserve: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
