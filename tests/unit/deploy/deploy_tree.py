"""The deployment files as data: where they are, their YAML documents, their containers.

Tests read the manifests, the compose file and the Dockerfiles through this
module so that each test states a rule about them, not how to find them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
DOCKER_DIR = ROOT / "docker"
K8S_DIR = DOCKER_DIR / "k8s"
KSERVE_DIR = DOCKER_DIR / "kserve"
COMPOSE_FILE = DOCKER_DIR / "compose.yaml"
DOCKERFILES = (DOCKER_DIR / "Dockerfile", DOCKER_DIR / "Dockerfile.cuda")

# Kinds whose pod template holds the containers, and where.
_POD_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template", "spec"),
    "InferenceService": ("spec", "predictor"),
    "ServingRuntime": ("spec",),
}


@dataclass(frozen=True)
class Manifest:
    """One YAML document of one manifest file."""

    path: Path
    doc: dict[str, Any]

    @property
    def kind(self) -> str:
        return self.doc["kind"]

    @property
    def name(self) -> str:
        return self.doc["metadata"]["name"]

    @property
    def label(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.kind}/{self.name}"


def manifest_files() -> list[Path]:
    """Every Kubernetes manifest mmserve ships (docker/k8s/** and docker/kserve/**)."""
    return sorted([*K8S_DIR.rglob("*.yaml"), *KSERVE_DIR.rglob("*.yaml")])


def load_manifests() -> list[Manifest]:
    manifests = []
    for path in manifest_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                manifests.append(Manifest(path, doc))
    return manifests


def manifests_of_kind(kind: str) -> list[Manifest]:
    return [manifest for manifest in load_manifests() if manifest.kind == kind]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The pod-level spec (containers, volumes, grace period) of a workload document, else None."""
    path = _POD_SPEC_PATHS.get(doc["kind"])
    if path is None:
        return None
    node: Any = doc
    for key in path:
        node = node[key]
    return node if "containers" in node else None


def containers(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = pod_spec(doc)
    yield from ([] if spec is None else spec["containers"])


def container_env(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())
