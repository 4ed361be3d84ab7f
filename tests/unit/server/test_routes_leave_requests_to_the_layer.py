"""Routes parse and render; the request layer alone takes the time, makes ids, traces and records."""

from __future__ import annotations

import ast
from pathlib import Path

import server.routes

ROUTES = Path(server.routes.__file__).parent
# What only server/request_layer.py may do for a request.
LAYER_CALLS = {"uuid4", "perf_counter_ns", "record", "begin", "answer_traced"}
LAYER_MODULES = {"uuid", "time"}


def _called_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


def _imported_modules(tree: ast.AST) -> set[str]:
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
    return modules


def test_no_route_takes_the_time_makes_an_id_traces_or_records():
    route_files = sorted(ROUTES.glob("*.py"))
    assert {path.name for path in route_files} >= {"infer.py", "v2.py", "openai.py"}
    for path in route_files:
        tree = ast.parse(path.read_text(), str(path))
        assert not _called_names(tree) & LAYER_CALLS, f"{path.name} calls {_called_names(tree) & LAYER_CALLS}"
        assert not _imported_modules(tree) & LAYER_MODULES, f"{path.name} imports {_imported_modules(tree)}"


def test_the_scan_sees_such_calls():
    tree = ast.parse("import uuid\nrid = uuid.uuid4().hex\nstate.monitor.record('text', {})\n")
    assert _called_names(tree) & LAYER_CALLS == {"uuid4", "record"} and "uuid" in _imported_modules(tree)
