"""The manifests, compose file and images agree with the server they deploy.

Probes must hit routes the app serves (and answer 200 once it is ready),
ports must be the port the server binds, every MMSERVE_* variable must be a
setting with a valid value, the HPA's metric must be one the server exports,
and the grace period must outlast the preStop pause plus the drain timeout.
All of it is read from the app and from Settings, not restated here.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from deploy_tree import (
    DOCKERFILES,
    Manifest,
    compose,
    container_env,
    containers,
    load_manifests,
    manifests_of_kind,
    pod_spec,
)
from dockerfile_instructions import duration_s, env_assignments, final_stage, healthcheck, read_instructions
from server.cli import build_parser
from server_contract import (
    ENV_PREFIX,
    exported_metric_names,
    route_paths,
    settings_from_env,
    unknown_setting_names,
)

WORKLOADS = [manifest for manifest in load_manifests() if pod_spec(manifest.doc) is not None]
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def _workload_containers() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{manifest.label}:{container['name']}", container)
            for manifest in WORKLOADS for container in containers(manifest.doc)]


CONTAINERS = _workload_containers()


def _env_sources() -> list[tuple[str, dict[str, str]]]:
    """Every place that hands the server an environment: manifests, compose, Dockerfiles."""
    sources = [(label, container_env(container)) for label, container in CONTAINERS]
    for name, service in compose()["services"].items():
        sources.append((f"compose.yaml:{name}", {k: str(v) for k, v in (service.get("environment") or {}).items()}))
    for path in DOCKERFILES:
        sources.append((path.name, env_assignments(final_stage(read_instructions(path)))))
    return sources


ENV_SOURCES = _env_sources()


def _container_port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    return next(item["containerPort"] for item in container["ports"] if item.get("name") == port)


@pytest.fixture(scope="module")
def metric_names(tiny_server) -> set[str]:
    with tiny_server.client() as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    return exported_metric_names(response.text)


def test_workloads_found():
    kinds = {manifest.kind for manifest in WORKLOADS}
    assert {"Deployment", "InferenceService", "ServingRuntime"} <= kinds


@pytest.mark.parametrize(("label", "env"), ENV_SOURCES, ids=[label for label, _ in ENV_SOURCES])
def test_every_mmserve_variable_is_a_setting_with_a_valid_value(label: str, env: dict[str, str]):
    assert not unknown_setting_names(env), f"{label}: not settings: {sorted(unknown_setting_names(env))}"
    if any(name.startswith(ENV_PREFIX) for name in env):
        settings = settings_from_env(env)  # raises pydantic.ValidationError on a bad value
        assert settings.host in {"0.0.0.0", "::"}, f"{label}: a container must bind every interface"


# Variables that size a library's thread pool. None of them reaches ONNX Runtime, the CPU's default runtime
# (its intra_op_num_threads 0 is every core of the node): only MMSERVE_COMPUTE_THREADS sizes the runtime that
# computes, so a place that sizes threads and leaves it out sizes the wrong pool.
THREAD_POOL_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@pytest.mark.parametrize(("label", "env"), ENV_SOURCES, ids=[label for label, _ in ENV_SOURCES])
def test_a_place_that_sizes_threads_sizes_the_runtime_that_computes(label: str, env: dict[str, str]):
    for name in THREAD_POOL_VARIABLES:
        if name in env:
            assert f"{ENV_PREFIX}COMPUTE_THREADS" in env, f"{label}: {name} without MMSERVE_COMPUTE_THREADS"
            assert settings_from_env(env).compute_threads == int(env[name]), f"{label}: two sizes for one pool"


def _cpu_cores(quantity: str) -> float:
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


@pytest.mark.parametrize(("label", "container"), CONTAINERS, ids=[label for label, _ in CONTAINERS])
def test_each_engines_compute_pool_is_sized_within_the_cpu_request(label: str, container: dict[str, Any]):
    """Left unset, the runtime sizes its pool from the node's cores, not the pod's share of them."""
    settings = settings_from_env(container_env(container))
    assert settings.compute_threads is not None, f"{label}: MMSERVE_COMPUTE_THREADS unset"
    num_engines = int(settings.engines) if settings.engines != "auto" else \
        int(container["resources"].get("limits", {}).get("nvidia.com/gpu", 1))
    assert settings.compute_threads * num_engines <= _cpu_cores(str(container["resources"]["requests"]["cpu"]))


def test_a_misspelt_setting_is_caught():
    assert unknown_setting_names({"MMSERVE_MAX_BATCHSIZE": "4", "MMSERVE_PORT": "1"}) == {"MMSERVE_MAX_BATCHSIZE"}


@pytest.mark.parametrize(("label", "container"), CONTAINERS, ids=[label for label, _ in CONTAINERS])
def test_container_runs_the_serve_command_on_the_settings_port(label: str, container: dict[str, Any]):
    if "args" in container:
        assert build_parser().parse_args(container["args"]).command == "serve"
    settings = settings_from_env(container_env(container))
    assert [port["containerPort"] for port in container["ports"]] == [settings.port, settings.grpc_port]
    assert settings.grpc_port == 8001  # Triton's gRPC port


@pytest.mark.parametrize(("label", "container"), CONTAINERS, ids=[label for label, _ in CONTAINERS])
def test_probes_hit_routes_that_answer_once_ready(label: str, container: dict[str, Any], tiny_server):
    routes = route_paths(tiny_server.app)
    settings = settings_from_env(container_env(container))
    assert all(probe in container for probe in PROBES), f"{label} lacks a probe"
    with tiny_server.client() as client:
        for probe in PROBES:
            http_get = container[probe]["httpGet"]
            assert http_get["path"] in routes, f"{label} {probe}: {http_get['path']} is not a route"
            assert _container_port(container, http_get["port"]) == settings.port
            assert client.get(http_get["path"]).status_code == 200, f"{label} {probe}"
    # Readiness gates traffic on warm-up and drain; liveness only on the compute thread.
    assert container["readinessProbe"]["httpGet"]["path"].endswith("/ready")
    assert container["startupProbe"]["httpGet"]["path"].endswith("/ready")
    assert container["livenessProbe"]["httpGet"]["path"].endswith("/live")


def _image_start_periods_s() -> dict[str, float]:
    """HEALTHCHECK start period of each image, keyed by the device the image is built for."""
    periods_s = {}
    for path in DOCKERFILES:
        instructions = final_stage(read_instructions(path))
        device = settings_from_env(env_assignments(instructions)).device
        periods_s[device] = duration_s(healthcheck(instructions).options["start-period"])
    return periods_s


@pytest.mark.parametrize(("label", "container"), CONTAINERS, ids=[label for label, _ in CONTAINERS])
def test_startup_probe_waits_at_least_as_long_as_the_image_healthcheck(label: str, container: dict[str, Any]):
    """The kubelet gives warm-up no less time than the image's own health check does."""
    device = settings_from_env(container_env(container)).device
    probe = container["startupProbe"]
    budget_s = probe.get("initialDelaySeconds", 0) + probe["periodSeconds"] * probe["failureThreshold"]
    assert budget_s >= _image_start_periods_s()[device], f"{label}: {budget_s} s of startup probing is too short"


# A ServingRuntime's pod takes its grace period from the InferenceService that uses it (checked below).
@pytest.mark.parametrize("manifest", [m for m in WORKLOADS if m.kind != "ServingRuntime"],
                         ids=lambda manifest: manifest.label)
def test_grace_period_outlasts_prestop_pause_plus_drain(manifest: Manifest):
    spec = pod_spec(manifest.doc)
    assert spec is not None
    grace_s = spec.get("terminationGracePeriodSeconds")
    assert grace_s is not None, f"{manifest.label}: the default 30 s is the drain timeout itself"
    for container in containers(manifest.doc):
        drain_s = settings_from_env(container_env(container)).drain_timeout_s
        command = container["lifecycle"]["preStop"]["exec"]["command"]
        assert command[0] == "sleep"
        assert grace_s > float(command[1]) + drain_s, manifest.label


def test_runtime_based_inference_service_outlasts_the_runtime_drain():
    runtime = manifests_of_kind("ServingRuntime")[0]
    drain_s = max(settings_from_env(container_env(c)).drain_timeout_s for c in containers(runtime.doc))
    pause_s = max(float(c["lifecycle"]["preStop"]["exec"]["command"][1]) for c in containers(runtime.doc))
    for service in manifests_of_kind("InferenceService"):
        if "model" in service.doc["spec"]["predictor"]:
            assert service.doc["spec"]["predictor"]["terminationGracePeriodSeconds"] > pause_s + drain_s


def _deployments() -> dict[str, Manifest]:
    return {manifest.path.parent.name: manifest for manifest in manifests_of_kind("Deployment")}


def test_cpu_and_gpu_deployments_are_interchangeable_and_gpu_means_one_gpu_per_process():
    deployments = _deployments()
    assert set(deployments) == {"cpu", "gpu"}
    cpu, gpu = deployments["cpu"].doc, deployments["gpu"].doc
    assert cpu["metadata"]["name"] == gpu["metadata"]["name"]
    assert cpu["spec"]["selector"] == gpu["spec"]["selector"]
    assert cpu["spec"]["template"]["metadata"]["labels"] == gpu["spec"]["template"]["metadata"]["labels"]
    (cpu_container,), (gpu_container,) = cpu["spec"]["template"]["spec"]["containers"], \
        gpu["spec"]["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in cpu_container["resources"].get("limits", {})
    assert settings_from_env(container_env(cpu_container)).device == "cpu"
    assert gpu_container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert settings_from_env(container_env(gpu_container)).device == "cuda"


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def test_service_pdb_hpa_and_servicemonitor_select_the_deployment(tiny_server):
    (service,) = manifests_of_kind("Service")
    (budget,) = manifests_of_kind("PodDisruptionBudget")
    (monitor,) = manifests_of_kind("ServiceMonitor")
    autoscalers = {hpa.path.parent.name: hpa.doc for hpa in manifests_of_kind("HorizontalPodAutoscaler")}
    for deployment in _deployments().values():
        pod_labels = deployment.doc["spec"]["template"]["metadata"]["labels"]
        (container,) = containers(deployment.doc)
        assert _matches(service.doc["spec"]["selector"], pod_labels)
        assert _matches(budget.doc["spec"]["selector"]["matchLabels"], pod_labels)
        target_ports = {port["targetPort"] for port in service.doc["spec"]["ports"]}
        settings = settings_from_env(container_env(container))
        assert {_container_port(container, port) for port in target_ports} == {settings.port, settings.grpc_port}
        target = autoscalers["k8s"]["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) == ("Deployment", deployment.name)
    assert _matches(monitor.doc["spec"]["selector"]["matchLabels"], service.doc["metadata"]["labels"])
    service_port_names = {port["name"] for port in service.doc["spec"]["ports"]}
    for endpoint in monitor.doc["spec"]["endpoints"]:
        assert endpoint["port"] in service_port_names
        assert endpoint["path"] in route_paths(tiny_server.app)
    # Draining one pod at a time must leave the HPA's floor minus one serving.
    assert budget.doc["spec"]["maxUnavailable"] < autoscalers["k8s"]["spec"]["minReplicas"]


def _adapter_rules() -> list[dict[str, Any]]:
    (config_map,) = [m for m in manifests_of_kind("ConfigMap") if "config.yaml" in m.doc["data"]]
    return yaml.safe_load(config_map.doc["data"]["config.yaml"])["rules"]


# The label KServe puts on every pod of an InferenceService (KServe's InferenceServicePodLabelKey).
KSERVE_POD_LABEL = "serving.kserve.io/inferenceservice"


def test_on_kserve_a_podmonitor_scrapes_the_predictor_pods_on_the_server_port(tiny_server):
    """KServe's generated Service lacks the label the ServiceMonitor selects: the PodMonitor must reach the pods."""
    (monitor,) = manifests_of_kind("PodMonitor")
    assert monitor.path.parent.name == "kserve"
    selector = monitor.doc["spec"]["selector"]["matchLabels"]
    services = manifests_of_kind("InferenceService")
    assert services and selector == {KSERVE_POD_LABEL: services[0].name}
    assert {service.name for service in services} == {services[0].name}  # both forms: one name, one selector
    kserve_containers = [container for manifest in WORKLOADS if manifest.path.parent.name == "kserve"
                         for container in containers(manifest.doc)]
    assert kserve_containers
    for endpoint in monitor.doc["spec"]["podMetricsEndpoints"]:
        for container in kserve_containers:
            assert _container_port(container, endpoint["targetPort"]) == settings_from_env(
                container_env(container)).port
        assert endpoint["path"] in route_paths(tiny_server.app)


@pytest.mark.parametrize("hpa", manifests_of_kind("HorizontalPodAutoscaler"), ids=lambda m: m.label)
def test_hpa_scales_on_a_per_pod_metric_the_server_exports(hpa: Manifest, metric_names: set[str]):
    (metric,) = hpa.doc["spec"]["metrics"]
    assert metric["type"] == "Pods"
    name = metric["pods"]["metric"]["name"]
    rules = [rule for rule in _adapter_rules() if rule["name"]["as"] == name]
    assert len(rules) == 1, f"no prometheus-adapter rule serves {name}"
    rule = rules[0]
    series = re.match(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)", rule["seriesQuery"]).group(1)  # type: ignore[union-attr]
    assert series in metric_names, f"{series} is not exported on /metrics"
    assert re.search(rule["name"]["matches"], series)
    overrides = rule["resources"]["overrides"]
    assert {overrides["pod"]["resource"], overrides["namespace"]["resource"]} == {"pod", "namespace"}
    # Less than one full batch waiting per pod, or scaling starts only after latency has doubled.
    target = float(metric["pods"]["target"]["averageValue"])
    max_batch_size = min(settings_from_env(container_env(c)).max_batch_size for _, c in CONTAINERS)
    assert 0 < target < max_batch_size
    assert hpa.doc["spec"]["minReplicas"] <= hpa.doc["spec"]["maxReplicas"]


def test_kserve_predictor_speaks_protocol_v2_on_the_server_port(tiny_server):
    services = {("model" in m.doc["spec"]["predictor"]): m for m in manifests_of_kind("InferenceService")}
    (runtime,) = manifests_of_kind("ServingRuntime")
    routes = route_paths(tiny_server.app)
    custom = services[False].doc
    (container,) = custom["spec"]["predictor"]["containers"]
    assert container["name"] == "kserve-container"
    assert {item["name"]: item["value"] for item in container["env"]}["PROTOCOL"] == "v2"
    model = services[True].doc["spec"]["predictor"]["model"]
    assert model["protocolVersion"] in runtime.doc["spec"]["protocolVersions"]
    assert model["protocolVersion"] == "v2"
    assert model["runtime"] == runtime.name
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime.doc["spec"]["supportedModelFormats"]}
    # What PROTOCOL=v2 promises KServe: the Open Inference Protocol's inference route.
    assert "/v2/models/{model_name}/infer" in routes
    server_port = settings_from_env(container_env(container)).port
    for annotations in (custom["metadata"]["annotations"], runtime.doc["spec"]["annotations"]):
        assert int(annotations["prometheus.kserve.io/port"]) == server_port
        assert annotations["prometheus.kserve.io/path"] in routes
    # KServe names the predictor's Deployment <InferenceService>-predictor.
    (kserve_hpa,) = [m for m in manifests_of_kind("HorizontalPodAutoscaler") if m.path.parent.name == "kserve"]
    assert kserve_hpa.doc["spec"]["scaleTargetRef"]["name"] == f"{custom['metadata']['name']}-predictor"


def test_compose_stop_grace_outlasts_the_drain():
    service = compose()["services"]["mmserve"]
    drain_s = settings_from_env({k: str(v) for k, v in service["environment"].items()}).drain_timeout_s
    assert duration_s(service["stop_grace_period"]) > drain_s
