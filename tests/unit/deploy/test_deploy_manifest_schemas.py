"""Every Kubernetes manifest validates offline: core kinds against Kubernetes' own schemas, CRDs against theirs.

Core kinds go through `kubernetes-validate` in strict mode (unknown fields
refused) for the oldest and the newest Kubernetes release we deploy to; the
custom resources through the schemas in crd_schemas.py. The negative cases
prove each validator refuses a misspelt field, so a pass means something.
"""

from __future__ import annotations

import copy

import jsonschema
import kubernetes_validate
import pytest

from crd_schemas import is_custom_resource, validate_custom_resource
from deploy_tree import Manifest, containers, load_manifests, manifest_files

# Oldest and newest Kubernetes releases the manifests must be valid for.
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")

MANIFESTS = load_manifests()
CORE = [manifest for manifest in MANIFESTS if not is_custom_resource(manifest.doc)]
CUSTOM = [manifest for manifest in MANIFESTS if is_custom_resource(manifest.doc)]


def test_every_manifest_file_holds_named_kubernetes_objects():
    assert manifest_files(), "no manifests found under docker/k8s or docker/kserve"
    files_with_docs = {manifest.path for manifest in MANIFESTS}
    assert files_with_docs == set(manifest_files())
    for manifest in MANIFESTS:
        assert {"apiVersion", "kind", "metadata"} <= set(manifest.doc), manifest.label
        assert manifest.name, manifest.label


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("manifest", CORE, ids=lambda manifest: manifest.label)
def test_core_manifest_is_valid_kubernetes(manifest: Manifest, version: str):
    kubernetes_validate.validate(manifest.doc, version, strict=True)


@pytest.mark.parametrize("manifest", CUSTOM, ids=lambda manifest: manifest.label)
def test_custom_resource_is_valid_for_its_crd(manifest: Manifest):
    validate_custom_resource(manifest.doc)


def test_both_crd_families_are_covered():
    kinds = {manifest.kind for manifest in CUSTOM}
    assert {"ServiceMonitor", "PodMonitor", "InferenceService", "ServingRuntime"} <= kinds


def _misspell_first_probe_field(doc: dict) -> dict:
    broken = copy.deepcopy(doc)
    container = next(containers(broken))
    probe = container["readinessProbe"]["httpGet"]
    probe["pth"] = probe.pop("path")
    return broken


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_validation_refuses_a_misspelt_field(version: str):
    deployment = next(manifest for manifest in CORE if manifest.kind == "Deployment")
    with pytest.raises(kubernetes_validate.ValidationError, match="pth"):
        kubernetes_validate.validate(_misspell_first_probe_field(deployment.doc), version, strict=True)


@pytest.mark.parametrize("manifest", [m for m in CUSTOM if any(True for _ in containers(m.doc))],
                         ids=lambda manifest: manifest.label)
def test_crd_validation_checks_embedded_containers_as_strictly_as_core(manifest: Manifest):
    with pytest.raises(jsonschema.ValidationError, match="pth"):
        validate_custom_resource(_misspell_first_probe_field(manifest.doc))


@pytest.mark.parametrize("manifest", CUSTOM, ids=lambda manifest: manifest.label)
def test_crd_validation_refuses_unknown_spec_fields_and_missing_required_ones(manifest: Manifest):
    unknown = copy.deepcopy(manifest.doc)
    unknown["spec"]["replicaCount"] = 3
    with pytest.raises(jsonschema.ValidationError, match="replicaCount"):
        validate_custom_resource(unknown)
    without_spec = {key: value for key, value in manifest.doc.items() if key != "spec"}
    with pytest.raises(jsonschema.ValidationError, match="spec"):
        validate_custom_resource(without_spec)
