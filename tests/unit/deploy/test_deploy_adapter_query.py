"""The prometheus-adapter rule the HPA scales on, evaluated by Prometheus itself (promtool) over pods with engines.

The rule's ``metricsQuery`` is filled in as the adapter fills it for a per-pod
query (``<<.GroupBy>>`` = pod) and checked with a ``promql_expr_test``: the
number a pod gets is the work waiting per engine (each engine's lanes summed,
then the mean over the pod's engines), for a pod of two engines, one of one
engine, and one single-process server whose series carry no engine label.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from deploy_tree import manifests_of_kind

SERIES = [
    # Pod a, two engines: engine 0 waits 6 + 2, engine 1 waits 4 -> (8 + 4) / 2 = 6 per engine.
    ('mmserve_queue_depth{namespace="prod", pod="a", lane="vision", engine="0"}', 6),
    ('mmserve_queue_depth{namespace="prod", pod="a", lane="text", engine="0"}', 2),
    ('mmserve_queue_depth{namespace="prod", pod="a", lane="vision", engine="1"}', 4),
    ('mmserve_queue_depth{namespace="prod", pod="a", lane="text", engine="1"}', 0),
    # Pod b, one engine (engine="0"): its lanes summed.
    ('mmserve_queue_depth{namespace="prod", pod="b", lane="vision", engine="0"}', 3),
    ('mmserve_queue_depth{namespace="prod", pod="b", lane="fusion", engine="0"}', 1),
    # Pod c, a single-process server: no engine label.
    ('mmserve_queue_depth{namespace="prod", pod="c", lane="vision"}', 5),
    # Another namespace's pod: not asked for.
    ('mmserve_queue_depth{namespace="test", pod="a", lane="vision", engine="0"}', 100),
]
EXPECTED = {"a": 6, "b": 4, "c": 5}


def _queue_rule() -> dict:
    (config_map,) = [m for m in manifests_of_kind("ConfigMap") if "config.yaml" in m.doc["data"]]
    (rule,) = [rule for rule in yaml.safe_load(config_map.doc["data"]["config.yaml"])["rules"]
               if rule["name"]["as"] == "mmserve_queue_depth"]
    return rule


def test_the_hpa_metric_is_the_work_waiting_per_engine_of_each_pod(tmp_path: Path, prometheus_binary) -> None:
    query = (_queue_rule()["metricsQuery"]
             .replace("<<.Series>>", "mmserve_queue_depth")
             .replace("<<.LabelMatchers>>", 'namespace="prod",pod=~"a|b|c"')
             .replace("<<.GroupBy>>", "pod"))
    assert "<<" not in query, query
    (tmp_path / "rules.yml").write_text("groups: []\n")
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": series, "values": f"{value}x5"} for series, value in SERIES],
            "promql_expr_test": [{
                "expr": query,
                "eval_time": "2m",
                "exp_samples": [{"labels": f'{{pod="{pod}"}}', "value": value} for pod, value in EXPECTED.items()],
            }],
        }],
    }
    (tmp_path / "adapter_test.yml").write_text(yaml.safe_dump(tests))
    result = subprocess.run([prometheus_binary("promtool"), "test", "rules", "adapter_test.yml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
