"""What the server itself says about its routes, settings and metrics, for checking deployment files.

Nothing here is a copy of the server's values: routes come from the app's
router, settings from ``Settings`` validated exactly as the server validates
its environment, metric names from a scrape of a live server.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from server.settings import Settings

ENV_PREFIX = Settings.model_config["env_prefix"]
_INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def route_paths(app: FastAPI) -> set[str]:
    """Every path the app routes: its OpenAPI paths plus the plain (non-API) routes such as /docs.

    The OpenAPI schema is FastAPI's public account of the included routers'
    routes; ``app.routes`` alone holds included routers as opaque entries.
    """
    plain = {route.path for route in app.routes if isinstance(getattr(route, "path", None), str)}
    return plain | set(app.openapi()["paths"])


def unknown_setting_names(env: Mapping[str, str]) -> set[str]:
    """``MMSERVE_*`` names in ``env`` that are no field of ``Settings``."""
    names = {name for name in env if name.startswith(ENV_PREFIX)}
    return {name for name in names if name[len(ENV_PREFIX):].lower() not in Settings.model_fields}


def settings_from_env(env: Mapping[str, str]) -> Settings:
    """``Settings`` as the server builds them from exactly this environment (others' ``MMSERVE_*`` removed).

    Compose-style ``${NAME:-default}`` values take their default, as when NAME is unset.
    """
    saved = {name: value for name, value in os.environ.items() if name.startswith(ENV_PREFIX)}
    try:
        for name in saved:
            del os.environ[name]
        for name, value in env.items():
            if name.startswith(ENV_PREFIX):
                os.environ[name] = _INTERPOLATION.sub(lambda match: match.group(2) or "", str(value))
        return Settings()
    finally:
        for name in [name for name in os.environ if name.startswith(ENV_PREFIX)]:
            del os.environ[name]
        os.environ.update(saved)


def exported_metric_names(exposition: str) -> set[str]:
    """Metric family names in a Prometheus text exposition (``/metrics`` body)."""
    names = set()
    for family in text_string_to_metric_families(exposition):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names
