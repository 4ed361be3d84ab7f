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
    assert {path.name for path in route_files} >= {"infer.py", "v2.py", "openai.py", "zero_shot.py"}
    for path in route_files:
        tree = ast.parse(path.read_text(), str(path))
        assert not _called_names(tree) & LAYER_CALLS, f"{path.name} calls {_called_names(tree) & LAYER_CALLS}"
        assert not _imported_modules(tree) & LAYER_MODULES, f"{path.name} imports {_imported_modules(tree)}"


# POST routes that run no inference: they change the server's own state (drills, baseline).
CONTROL_POSTS = {"/v1/admin/faults", "/v1/admin/faults/kill", "/v1/monitoring/baseline"}


def _post_paths(function: ast.AsyncFunctionDef | ast.FunctionDef) -> list[str]:
    return [decorator.args[0].value for decorator in function.decorator_list
            if isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
            and decorator.func.attr == "post" and decorator.args and isinstance(decorator.args[0], ast.Constant)]


def _handlers_not_served(tree: ast.Module) -> set[str]:
    """POST paths whose handler calls ``serve`` neither itself nor through a function of its module."""
    functions = [node for node in tree.body if isinstance(node, (ast.AsyncFunctionDef, ast.FunctionDef))]
    serving = {"serve"}
    serving |= {function.name for function in functions if _called_names(function) & serving}
    return {path for function in functions for path in _post_paths(function)
            if not _called_names(function) & serving and path not in CONTROL_POSTS}


def test_every_inference_endpoint_goes_through_the_layer():
    served = set()
    for path in sorted(ROUTES.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        assert not _handlers_not_served(tree), f"{path.name}: {_handlers_not_served(tree)} answer without serve()"
        served |= {p for node in ast.walk(tree) if isinstance(node, (ast.AsyncFunctionDef, ast.FunctionDef))
                   for p in _post_paths(node) if p not in CONTROL_POSTS}
    assert served >= {"/v1/infer", "/v1/embeddings", "/v1/classify", "/v1/rank", "/v2/models/{model_name:path}/infer"}


def test_the_endpoint_scan_sees_a_handler_that_answers_by_itself():
    tree = ast.parse("""
@router.post("/v1/classify")
async def classify(request):
    return await answer_request(request, "/v1/classify", "classify", _classify)

async def _infer(request):
    return await serve(request, ENDPOINT)

@router.post("/v1/infer")
async def infer(request):
    return await _infer(request)
""")
    assert _handlers_not_served(tree) == {"/v1/classify"}


def test_the_scan_sees_such_calls():
    tree = ast.parse("import uuid\nrid = uuid.uuid4().hex\nstate.monitor.record('text', {})\n")
    assert _called_names(tree) & LAYER_CALLS == {"uuid4", "record"} and "uuid" in _imported_modules(tree)
