"""``mmserve export --help`` offers what export does: ONNX Runtime's graphs, never a torch runtime."""

from __future__ import annotations

import argparse

from server.cli import build_parser


def _help(command: str) -> str:
    parser = build_parser()
    subparsers = next(action for action in parser._actions  # noqa: SLF001 - argparse keeps its subparsers there
                      if isinstance(action, argparse._SubParsersAction))
    return " ".join(subparsers.choices[command].format_help().split())


def test_export_help_says_its_runtime_is_onnx_runtime_not_torch_on_cuda():
    text = _help("export")
    assert "torch on CUDA" not in text
    assert "auto or onnxruntime" in text and "torch has nothing to export" in text


def test_serve_help_keeps_the_runtime_table():
    assert "default auto: ONNX Runtime on the CPU, torch on CUDA" in _help("serve")
