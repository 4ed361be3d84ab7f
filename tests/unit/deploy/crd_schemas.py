"""JSON schemas for the custom resources mmserve ships, built on Kubernetes' own schemas.

The Kubernetes schemas that `kubernetes-validate` ships cover core kinds only;
ServiceMonitor and PodMonitor (Prometheus Operator) and InferenceService / ServingRuntime
(KServe) are CRDs. Their schemas here are written from the CRDs' documented
fields (the Prometheus Operator's `monitoring.coreos.com_servicemonitors.yaml` and `_podmonitors.yaml`
and KServe's v1beta1 / v1alpha1 API reference): apiVersion and kind fixed,
required fields required, unknown fields refused. Wherever a CRD embeds a
core type (Container, Volume, LabelSelector, PodSpec fields) the schema refers
to the core definition shipped with `kubernetes-validate`, so a container in an
InferenceService is checked exactly as strictly as one in a Deployment.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
from referencing import Registry, Resource

KUBERNETES_VERSION = "1.37.0"  # the core definitions CRD fields refer to
_DEFINITIONS_ID = "https://kubernetes.io/api/_definitions.json"

Schema = dict[str, Any]


@cache
def core_definitions(version: str = KUBERNETES_VERSION) -> Schema:
    """Kubernetes' strict core type definitions as kubernetes-validate ships them."""
    path = (resources.files("kubernetes_validate") / "kubernetes-json-schema"
            / f"v{version}-local-strict" / "_definitions.json")
    definitions = json.loads(path.read_text())
    if definitions.get("$id") != _DEFINITIONS_ID:
        raise LookupError(f"unexpected $id in {path}: {definitions.get('$id')}")
    return definitions


def core(name: str) -> Schema:
    """A reference to one core type, e.g. ``core("io.k8s.api.core.v1.Container")``."""
    return {"$ref": f"{_DEFINITIONS_ID}#/$defs/{name}"}


def _absolute_refs(node: Any) -> Any:
    """Core schemas refer to each other as ``#/$defs/...``; copied out, they need the full id."""
    if isinstance(node, dict):
        return {key: (_DEFINITIONS_ID + value if key == "$ref" and value.startswith("#") else _absolute_refs(value))
                for key, value in node.items()}
    if isinstance(node, list):
        return [_absolute_refs(item) for item in node]
    return node


def _core_properties(name: str) -> dict[str, Schema]:
    """The properties of one core type, to extend with a CRD's own fields."""
    return _absolute_refs(core_definitions()["$defs"][name]["properties"])


_STRING: Schema = {"type": "string"}
_BOOLEAN: Schema = {"type": "boolean"}
_INTEGER: Schema = {"type": "integer"}
_OBJECT: Schema = {"type": "object"}
_STRING_MAP: Schema = {"type": "object", "additionalProperties": {"type": "string"}}
# Prometheus Operator's Duration type.
_DURATION: Schema = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
_KSERVE_PROTOCOLS = ["v1", "v2", "grpc-v1", "grpc-v2"]
# KServe runs the container of this name as the model server.
_HAS_KSERVE_CONTAINER: Schema = {"contains": {"properties": {"name": {"const": "kserve-container"}}}}


def _resource(api_version: str, kind: str, spec: Schema) -> Schema:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": {"allOf": [core("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")],
                         "required": ["name"]},
            "spec": spec,
        },
    }


def _closed(properties: dict[str, Schema], required: list[str] | None = None) -> Schema:
    return {"type": "object", "additionalProperties": False, "properties": properties,
            "required": required or []}


# What a ServiceMonitor's endpoint and a PodMonitor's podMetricsEndpoint both take (the CRDs' shared fields).
_SCRAPE_ENDPOINT: dict[str, Schema] = {
    "port": _STRING, "targetPort": {"type": ["integer", "string"]},
    "path": {"type": "string", "pattern": "^/"}, "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
    "interval": _DURATION, "scrapeTimeout": _DURATION, "params": _OBJECT,
    "honorLabels": _BOOLEAN, "honorTimestamps": _BOOLEAN, "trackTimestampsStaleness": _BOOLEAN,
    "relabelings": {"type": "array", "items": _OBJECT},
    "metricRelabelings": {"type": "array", "items": _OBJECT},
    "tlsConfig": _OBJECT, "authorization": _OBJECT, "basicAuth": _OBJECT, "oauth2": _OBJECT,
    "bearerTokenSecret": _OBJECT, "proxyUrl": _STRING,
    "followRedirects": _BOOLEAN, "enableHttp2": _BOOLEAN, "filterRunning": _BOOLEAN,
}
# And what both specs take besides their endpoints.
_MONITOR_SPEC: dict[str, Schema] = {
    "selector": core("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector"),
    "namespaceSelector": _closed({"any": _BOOLEAN, "matchNames": {"type": "array", "items": _STRING}}),
    "jobLabel": _STRING,
    "podTargetLabels": {"type": "array", "items": _STRING},
    "sampleLimit": _INTEGER, "targetLimit": _INTEGER, "labelLimit": _INTEGER,
    "attachMetadata": _OBJECT, "scrapeClass": _STRING,
}


def service_monitor() -> Schema:
    endpoint = _closed({**_SCRAPE_ENDPOINT, "bearerTokenFile": _STRING})
    spec = _closed({
        **_MONITOR_SPEC,
        "endpoints": {"type": "array", "minItems": 1, "items": endpoint},
        "targetLabels": {"type": "array", "items": _STRING},
    }, required=["selector", "endpoints"])
    return _resource("monitoring.coreos.com/v1", "ServiceMonitor", spec)


def pod_monitor() -> Schema:
    """Prometheus Operator PodMonitor: pods by label, and how to scrape each (monitoring.coreos.com_podmonitors)."""
    endpoint = _closed({**_SCRAPE_ENDPOINT, "portNumber": _INTEGER})
    spec = _closed({
        **_MONITOR_SPEC,
        "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": endpoint},
    }, required=["selector", "podMetricsEndpoints"])
    return _resource("monitoring.coreos.com/v1", "PodMonitor", spec)


def _model_spec() -> Schema:
    """KServe ModelSpec: a Container's fields plus the model's format, runtime and protocol."""
    properties = _core_properties("io.k8s.api.core.v1.Container")
    properties.update({
        "modelFormat": _closed({"name": _STRING, "version": _STRING}, required=["name"]),
        "runtime": _STRING, "runtimeVersion": _STRING,
        "protocolVersion": {"enum": _KSERVE_PROTOCOLS},
        "storageUri": _STRING, "storage": _OBJECT,
    })
    return _closed(properties, required=["modelFormat"])


def inference_service() -> Schema:
    """KServe v1beta1 InferenceService: a predictor is PodSpec fields plus component extensions."""
    predictor_properties = _core_properties("io.k8s.api.core.v1.PodSpec")
    predictor_properties["containers"] = {
        "type": "array", "items": core("io.k8s.api.core.v1.Container"), **_HAS_KSERVE_CONTAINER,
    }
    predictor_properties.update({
        "minReplicas": {"type": "integer", "minimum": 0},
        "maxReplicas": {"type": "integer", "minimum": 0},
        "scaleTarget": _INTEGER,
        "scaleMetric": {"enum": ["cpu", "memory", "concurrency", "rps"]},
        "containerConcurrency": _INTEGER, "timeout": _INTEGER,
        "canaryTrafficPercent": {"type": "integer", "minimum": 0, "maximum": 100},
        "logger": _OBJECT, "batcher": _OBJECT, "labels": _STRING_MAP, "annotations": _STRING_MAP,
        "deploymentStrategy": _OBJECT, "autoScaling": _OBJECT, "workerSpec": _OBJECT,
        "model": _model_spec(),
    })
    predictor = {
        **_closed(predictor_properties),
        "anyOf": [{"required": ["model"]}, {"required": ["containers"]}],
    }
    spec = _closed({"predictor": predictor, "transformer": _OBJECT, "explainer": _OBJECT},
                   required=["predictor"])
    return _resource("serving.kserve.io/v1beta1", "InferenceService", spec)


def serving_runtime() -> Schema:
    """KServe v1alpha1 ServingRuntime: model formats, protocols and the pod that serves them."""
    model_format = _closed({"name": _STRING, "version": _STRING, "autoSelect": _BOOLEAN,
                            "priority": {"type": "integer", "minimum": 1}}, required=["name"])
    spec = _closed({
        "supportedModelFormats": {"type": "array", "items": model_format},
        "protocolVersions": {"type": "array", "items": {"enum": _KSERVE_PROTOCOLS}},
        "multiModel": _BOOLEAN, "disabled": _BOOLEAN, "replicas": _INTEGER,
        "grpcEndpoint": _STRING, "grpcDataEndpoint": _STRING, "httpDataEndpoint": _STRING,
        "storageHelper": _OBJECT, "builtInAdapter": _OBJECT, "workerSpec": _OBJECT,
        "containers": {"type": "array", "minItems": 1, "items": core("io.k8s.api.core.v1.Container"),
                       **_HAS_KSERVE_CONTAINER},
        "volumes": {"type": "array", "items": core("io.k8s.api.core.v1.Volume")},
        "nodeSelector": _STRING_MAP, "labels": _STRING_MAP, "annotations": _STRING_MAP,
        "affinity": core("io.k8s.api.core.v1.Affinity"),
        "tolerations": {"type": "array", "items": core("io.k8s.api.core.v1.Toleration")},
        "imagePullSecrets": {"type": "array", "items": core("io.k8s.api.core.v1.LocalObjectReference")},
        "hostIPC": _BOOLEAN,
    }, required=["containers"])
    return _resource("serving.kserve.io/v1alpha1", "ServingRuntime", spec)


CUSTOM_RESOURCE_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): service_monitor,
    ("monitoring.coreos.com/v1", "PodMonitor"): pod_monitor,
    ("serving.kserve.io/v1beta1", "InferenceService"): inference_service,
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): serving_runtime,
}


def is_custom_resource(doc: dict[str, Any]) -> bool:
    return (doc.get("apiVersion"), doc.get("kind")) in CUSTOM_RESOURCE_SCHEMAS


def validate_custom_resource(doc: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` (best match) if ``doc`` breaks its CRD's schema."""
    schema = CUSTOM_RESOURCE_SCHEMAS[(doc["apiVersion"], doc["kind"])]()
    registry = Resource.from_contents(core_definitions()) @ Registry()
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    if error is not None:
        raise error
