"""The access rules without a server: which routes are admin, the loopback rule, the decision table, key rings."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from pydantic import SecretStr

from server.app import create_app
from server.http.access_policy import AccessPolicy, Decision, RouteClass, is_admin_route, is_loopback_bind
from server.http.keys import ApiKeyConfigError, KeyRing, Role, hashed_key_line
from server.settings import Settings

INFERENCE_KEY, ADMIN_KEY = "inference-key-31c7", "admin-key-9be2"


def _resolving_to(*addresses: str):
    return lambda host: list(addresses)


@pytest.mark.parametrize(("host", "addresses", "is_loopback"), [
    ("127.0.0.1", ("127.0.0.1",), True),
    ("127.0.0.2", ("127.0.0.2",), True),  # all of 127.0.0.0/8 is loopback
    ("localhost", ("127.0.0.1", "::1"), True),
    ("::1", ("::1",), True),
    ("::ffff:127.0.0.1", ("::ffff:127.0.0.1",), True),  # IPv4-mapped loopback
    ("0.0.0.0", ("0.0.0.0",), False),  # every interface
    ("::", ("::",), False),
    ("10.1.2.3", ("10.1.2.3",), False),
    ("half-local.example", ("127.0.0.1", "192.0.2.7"), False),  # one non-loopback address is enough
    ("nowhere.invalid", (), False),  # resolves to nothing: not known to be loopback
])
def test_the_bind_address_is_loopback_only_when_every_resolved_address_is(host, addresses, is_loopback):
    assert is_loopback_bind(host, _resolving_to(*addresses)) is is_loopback


def test_the_real_resolver_resolves_names_before_judging():
    assert is_loopback_bind("localhost") and is_loopback_bind("127.0.0.1") and is_loopback_bind("::1")
    assert not is_loopback_bind("0.0.0.0") and not is_loopback_bind("::")


def _ring(inference: bool, admin: bool) -> KeyRing:
    return KeyRing.from_sources(api_keys=SecretStr(INFERENCE_KEY) if inference else None,
                                admin_api_keys=SecretStr(ADMIN_KEY) if admin else None)


def _decide(policy: AccessPolicy, route_class: RouteClass, key: str | None) -> Decision:
    presented = None if key is None else key.encode()
    match = policy.keys.match(presented) if presented else None
    return policy.decide(route_class, presented, None if match is None else match.role)


A, MISSING, INVALID, NEEDS, CLOSED = (Decision.ALLOW, Decision.MISSING_KEY, Decision.INVALID_KEY,
                                      Decision.NEEDS_ADMIN, Decision.ADMIN_CLOSED)


@pytest.mark.parametrize(("inference", "admin", "host", "allow_open_admin", "expected"), [
    # (no key, wrong key, inference key, admin key) on an inference route, then on an admin route
    (False, False, "127.0.0.1", False, ((A, A, A, A), (A, A, A, A))),  # loopback, no keys: open as before
    (False, False, "0.0.0.0", False, ((A, A, A, A), (CLOSED, CLOSED, CLOSED, CLOSED))),
    (False, False, "0.0.0.0", True, ((A, A, A, A), (A, A, A, A))),
    (True, True, "0.0.0.0", False, ((MISSING, INVALID, A, A), (MISSING, INVALID, NEEDS, A))),
    (True, True, "127.0.0.1", False, ((MISSING, INVALID, A, A), (MISSING, INVALID, NEEDS, A))),
    (False, True, "0.0.0.0", False, ((A, A, A, A), (MISSING, INVALID, INVALID, A))),  # public inference
    (True, False, "127.0.0.1", False, ((MISSING, INVALID, A, INVALID), (MISSING, INVALID, NEEDS, INVALID))),
    (True, False, "0.0.0.0", True, ((MISSING, INVALID, A, INVALID), (MISSING, INVALID, A, INVALID))),
])
def test_the_decision_table(inference, admin, host, allow_open_admin, expected):
    policy = AccessPolicy.for_bind(_ring(inference, admin), host=host, allow_open_admin=allow_open_admin,
                                   resolve=_resolving_to(host))
    for route_class, row in zip((RouteClass.INFERENCE, RouteClass.ADMIN), expected, strict=True):
        got = tuple(_decide(policy, route_class, key) for key in (None, "wrong-key", INFERENCE_KEY, ADMIN_KEY))
        assert got == row, (route_class, got)
    assert policy.decide(RouteClass.OPEN, None, None) is A


def test_admin_routes_are_the_cache_the_admin_tree_and_every_monitoring_write(tiny_bundle):
    app = create_app(Settings(preset="tiny", device="cpu"), tiny_bundle)
    routes = {(method, path) for path, item in app.openapi()["paths"].items() for method in map(str.upper, item)}
    admin = {route for route in routes if is_admin_route(*route)}
    assert admin == {("DELETE", "/v1/cache"), ("GET", "/v1/admin/faults"), ("POST", "/v1/admin/faults"),
                     ("DELETE", "/v1/admin/faults"), ("POST", "/v1/admin/faults/kill"),
                     ("POST", "/v1/monitoring/baseline")}
    monitoring_writes = {(m, p) for m, p in routes if p.startswith("/v1/monitoring/") and m != "GET"}
    assert monitoring_writes and monitoring_writes <= admin
    assert not any(is_admin_route(m, p) for m, p in routes if p in ("/v1/infer", "/v1/embeddings", "/v1/models"))
    assert is_admin_route("GET", "/v1/admin/anything-later")


def test_a_key_file_may_hold_sha256_lines_and_plain_keys(tmp_path: Path):
    key_file = tmp_path / "admin-keys"
    key_file.write_text(f"# ops\n{hashed_key_line(ADMIN_KEY.encode())}  # alice\nplain-admin-key\n"
                        f"SHA256:{hashlib.sha256(b'upper').hexdigest().upper()}\n")
    ring = KeyRing.from_sources(admin_api_key_file=key_file)
    assert ADMIN_KEY not in key_file.read_text()
    for key in (ADMIN_KEY, "plain-admin-key", "upper"):
        match = ring.match(key.encode())
        assert match is not None and match.role is Role.ADMIN
        assert match.key_id == hashlib.sha256(key.encode()).hexdigest()[:12]
    # The hash itself is no key: presenting the line (or its hex) gets nothing.
    assert ring.match(hashed_key_line(ADMIN_KEY.encode()).encode()) is None
    assert ring.match(hashlib.sha256(ADMIN_KEY.encode()).hexdigest().encode()) is None


def test_a_malformed_sha256_line_stops_the_server_without_echoing_it(tmp_path: Path):
    key_file = tmp_path / "keys"
    key_file.write_text("good-key\nsha256:not-hex-secretish\n")
    with pytest.raises(ApiKeyConfigError, match="line 2: a sha256: entry needs exactly 64 hex digits") as refused:
        KeyRing.from_sources(api_key_file=key_file)
    assert "secretish" not in str(refused.value)


def test_a_key_of_both_roles_is_an_admin_key():
    ring = KeyRing.from_sources(api_keys=SecretStr(f"{ADMIN_KEY},{INFERENCE_KEY}"), admin_api_keys=SecretStr(ADMIN_KEY))
    assert ring.match(ADMIN_KEY.encode()).role is Role.ADMIN
    assert ring.match(INFERENCE_KEY.encode()).role is Role.INFERENCE


def test_the_start_up_warning_names_the_settings_off_loopback(tiny_bundle, caplog):
    with caplog.at_level("WARNING", logger="server.http.auth"):
        create_app(Settings(preset="tiny", device="cpu", host="0.0.0.0"), tiny_bundle)
    warned = " ".join(record.getMessage() for record in caplog.records)
    assert "MMSERVE_API_KEYS" in warned and "MMSERVE_ADMIN_API_KEYS" in warned and "--allow-open-admin" in warned
    caplog.clear()
    with caplog.at_level("WARNING", logger="server.http.auth"):
        create_app(Settings(preset="tiny", device="cpu", host="127.0.0.1"), tiny_bundle)
    assert not caplog.records


def test_allow_open_admin_comes_from_the_flag_or_the_environment(monkeypatch):
    from server.cli import build_parser
    from server.settings import load_settings

    assert build_parser().parse_args(["serve", "--allow-open-admin"]).allow_open_admin is True
    assert build_parser().parse_args(["serve"]).allow_open_admin is None  # not given: the environment decides
    assert load_settings(None, allow_open_admin=None).allow_open_admin is False
    monkeypatch.setenv("MMSERVE_ALLOW_OPEN_ADMIN", "true")
    monkeypatch.setenv("MMSERVE_RATE_LIMIT", "20/s,burst=5")
    settings = load_settings(None, allow_open_admin=None)
    assert settings.allow_open_admin is True and settings.rate_limit == "20/s,burst=5"
