"""House rules that check themselves: small product files, one image encoder for tests, honest skips.

Each rule reads the source tree (no imports, no server), so it costs
milliseconds and fails on the commit that breaks it, naming the file and line.
An exception to a rule is listed here with its reason, never granted silently.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

# The product: the import packages DESIGN.md lays out, the replica client, and the load generator behind
# `mmserve bench` (the rest of benchmarks/ is scripts, not product).
PRODUCT_DIRS = ("server", "router", "models", "kernels", "cache", "monitoring", "clients", "benchmarks/loadgen")
MAX_PRODUCT_FILE_LINES = 400
# path -> why it may be longer. Empty: every product file keeps the rule.
LONG_FILE_EXCEPTIONS: dict[str, str] = {}

# The one module that encodes images for tests; every other test module calls it.
IMAGE_ENCODER_MODULE = "tests/encoded_images.py"
# "path:function" -> why that function writes image bytes itself.
ENCODING_EXCEPTIONS: dict[str, str] = {}
_ENCODER_CALLS = {"imencode", "imwrite", "encode_jpeg", "encode_png", "write_jpeg", "write_png"}

# A skip is a fact about the machine: an operating system or C library, a device, or a binary not on PATH.
# A Python dependency is installed, never skipped (so no importorskip).
_PLATFORM_FACT = re.compile(r"\bLinux\b|\bglibc\b|\bmacOS\b|\bWindows\b|\bCUDA\b|\bGPU\b|not on PATH")


def _python_files(*dirs: Path) -> Iterator[Path]:
    for directory in dirs:
        yield from sorted(path for path in directory.rglob("*.py") if "__pycache__" not in path.parts)


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_no_product_file_is_over_400_lines():
    too_long = {}
    for path in _python_files(*(ROOT / name for name in PRODUCT_DIRS)):
        num_lines = len(path.read_text().splitlines())
        if num_lines > MAX_PRODUCT_FILE_LINES and _relative(path) not in LONG_FILE_EXCEPTIONS:
            too_long[_relative(path)] = num_lines
    assert not too_long, f"product files over {MAX_PRODUCT_FILE_LINES} lines (split them along a seam): {too_long}"


def test_the_long_file_exceptions_are_still_needed():
    for name in LONG_FILE_EXCEPTIONS:
        assert len((ROOT / name).read_text().splitlines()) > MAX_PRODUCT_FILE_LINES, f"{name} is short again"


def _encoding_calls(tree: ast.AST) -> Iterator[tuple[str, int, str]]:
    """(enclosing function, line, call) for each call that writes an image file's bytes.

    Pillow's ``Image.save`` is every call named ``save`` but ``torch.save``; the rest are
    the other image codecs' encoders (OpenCV, torchvision).
    """
    def visit(node: ast.AST, function: str) -> Iterator[tuple[str, int, str]]:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                attribute, receiver = child.func.attr, child.func.value
                is_torch_save = isinstance(receiver, ast.Name) and receiver.id == "torch"
                if (attribute == "save" and not is_torch_save) or attribute in _ENCODER_CALLS:
                    yield name, child.lineno, attribute
            yield from visit(child, name)
    yield from visit(tree, "<module>")


def test_tests_encode_images_only_through_encoded_images():
    offenders = []
    for path in _python_files(TESTS):
        if _relative(path) == IMAGE_ENCODER_MODULE:
            continue
        for function, line, call in _encoding_calls(ast.parse(path.read_text())):
            if f"{_relative(path)}:{function}" not in ENCODING_EXCEPTIONS:
                offenders.append(f"{_relative(path)}:{line} {function} calls .{call}(")
    assert not offenders, "encode with tests/encoded_images.py (encode, encoded_image, ...) instead: " \
                          + "; ".join(offenders)


def test_the_encoding_rule_sees_a_pillow_save_into_a_buffer():
    source = "def png(image):\n    buffer = io.BytesIO()\n    image.save(buffer, format='PNG')\n" \
             "def weights(model):\n    torch.save(model.state_dict(), 'w.bin')\n"
    assert list(_encoding_calls(ast.parse(source))) == [("png", 3, "save")]


def _literal_text(node: ast.AST | None, names: dict[str, ast.AST]) -> str | None:
    """The text of a reason: a string, the constant parts of an f-string, or a local name bound to one."""
    if isinstance(node, ast.Name) and node.id in names:
        node = names[node.id]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value for part in node.values if isinstance(part, ast.Constant))
    return None


def _skips(tree: ast.AST) -> Iterator[tuple[int, str, str | None]]:
    """(line, kind, reason text) for each skip: pytest.skip(...), pytest.mark.skip[if](...), importorskip."""
    def visit(node: ast.AST, names: dict[str, ast.AST]) -> Iterator[tuple[int, str, str | None]]:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            names = dict(names)
            for statement in ast.walk(node):
                if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                        and isinstance(statement.targets[0], ast.Name):
                    names[statement.targets[0].id] = statement.value
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                kind = child.func.attr
                keywords = {keyword.arg: keyword.value for keyword in child.keywords}
                if kind == "importorskip":
                    yield child.lineno, kind, None
                elif kind in ("skip", "skipif") and "pytest" in ast.unparse(child.func.value):
                    if kind == "skipif":
                        reason = keywords.get("reason")
                    else:
                        reason = child.args[0] if child.args else keywords.get("reason")
                    yield child.lineno, kind, _literal_text(reason, names)
            yield from visit(child, names)
    yield from visit(tree, {})


def test_every_skip_names_a_platform_fact_or_a_missing_binary():
    vague = []
    for path in _python_files(TESTS):
        for line, kind, reason in _skips(ast.parse(path.read_text())):
            if kind == "importorskip":
                vague.append(f"{_relative(path)}:{line} importorskip (install the dependency instead)")
            elif reason is None or not _PLATFORM_FACT.search(reason):
                vague.append(f"{_relative(path)}:{line} {kind} reason {reason!r}")
    assert not vague, "a skip says which machine fact it rests on (" + _PLATFORM_FACT.pattern + "): " \
                      + "; ".join(vague)


def test_the_skip_rule_reads_reasons_from_literals_and_local_names():
    source = ("import pytest\n"
              "@pytest.mark.skipif(cond, reason='flaky')\ndef test_a(): ...\n"
              "def find(name):\n    message = f'{name} is not on PATH'\n    pytest.skip(message)\n"
              "torch = pytest.importorskip('torch')\n")
    assert list(_skips(ast.parse(source))) == [(2, "skipif", "flaky"), (6, "skip", " is not on PATH"),
                                               (7, "importorskip", None)]
