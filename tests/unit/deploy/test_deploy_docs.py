"""docs/scaling-out.md names only deployment files that exist."""

from __future__ import annotations

import re

from deploy_tree import ROOT

GUIDE = ROOT / "docs" / "scaling-out.md"


def test_every_docker_path_in_the_guide_exists():
    paths = set(re.findall(r"`(docker/[\w./-]+?)/?`", GUIDE.read_text()))
    paths |= set(re.findall(r"(docker/[\w.-]+(?:/[\w.-]+)*\.(?:yaml|yml))", GUIDE.read_text()))
    assert len(paths) >= 10, sorted(paths)
    missing = sorted(path for path in paths if not (ROOT / path).exists())
    assert not missing, f"the guide names files that do not exist: {missing}"
