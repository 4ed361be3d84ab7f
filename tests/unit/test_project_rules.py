"""Project-wide rules checked on every run: import direction, README settings, CI wiring."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_imports_point_the_way_design_md_draws_them():
    lint_imports = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    done = subprocess.run([lint_imports], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_no_other_installed_distribution_ships_our_top_level_packages():
    """Two distributions with one import name overwrite each other's files and shadow each other's imports:
    transformers 5.25 brought the `kernels` distribution, and `from kernels import ...` in transformers found ours."""
    ours = ["server", "router", "models", "kernels", "cache", "monitoring", "benchmarks", "clients"]
    owners = importlib.metadata.packages_distributions()
    shared = {name: sorted(set(owners[name]) - {"mmserve"}) for name in ours if set(owners.get(name, [])) - {"mmserve"}}
    assert not shared, f"installed distributions that ship an import package named like ours: {shared}"


def test_every_setting_is_in_the_readme_table():
    readme = (ROOT / "README.md").read_text()
    table_rows = [line for line in readme.splitlines() if line.startswith("| `")]
    documented = set(re.findall(r"`([a-z_]+)`", "\n".join(row.split("|")[1] for row in table_rows)))
    assert set(Settings.model_fields) <= documented, set(Settings.model_fields) - documented
    for name, field in Settings.model_fields.items():
        if field.default not in (None,) and not isinstance(field.default, bool):
            row = next(row for row in table_rows if f"`{name}`" in row.split("|")[1])
            assert f"`{field.default}`" in row, f"README default of {name} is not {field.default!r}"


def test_ci_runs_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -e '.[test]'" in readme and "pip install -q -e '.[test]'" in ci
    assert "python -m pytest" in readme and "python -m pytest" in ci
    assert '"$status" -eq 5' in ci  # "no tests collected" fails CI


def test_ci_requires_the_prometheus_binaries():
    ci = (ROOT / ".ci" / "run").read_text()
    install = ci.index("apt-get install -y -qq prometheus")
    require = ci.index("export MMSERVE_REQUIRE_PROMETHEUS=1")
    assert install < require < ci.index("python -m pytest")


def test_a_missing_prometheus_binary_skips_with_the_install_hint(prometheus_binary, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("MMSERVE_REQUIRE_PROMETHEUS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y prometheus"):
        prometheus_binary("promtool")


def test_a_missing_prometheus_binary_fails_when_required(prometheus_binary, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("MMSERVE_REQUIRE_PROMETHEUS", "1")
    with pytest.raises(pytest.fail.Exception, match="promtool is not on PATH"):
        prometheus_binary("promtool")


def test_a_present_prometheus_binary_is_found(prometheus_binary, monkeypatch, tmp_path):
    fake = tmp_path / "promtool"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("MMSERVE_REQUIRE_PROMETHEUS", "1")
    assert prometheus_binary("promtool") == str(fake)
