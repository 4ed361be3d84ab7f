"""Security: API keys, the probe port, CORS, logs without payloads, no pickle, no path escapes."""

from __future__ import annotations

import base64
import hmac
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as triton_http
import uvicorn
import yaml
from pydantic import SecretStr
from tritonclient.utils import InferenceServerException

from encoded_images import encoded_image
from server.app import create_app
from server.http.auth import ApiKeyConfigError
from server.http.keys import KeyRing, Role, key_digest
from server.cli import main as mmserve_main
from server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("server", "router", "models", "kernels", "cache", "monitoring")
KEYS = ("key-one-4f9c2e", "key-two-81d0aa")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _count(metrics_text: str, code: str) -> float:
    return sum(float(value) for value in
               re.findall(rf'^mmserve_requests_total\{{[^}}]*code="{code}"[^}}]*\}} (\S+)$', metrics_text, re.M))


def test_keys_guard_every_route_but_health_and_metrics(live_server_factory):
    with live_server_factory(api_keys=",".join(KEYS)) as server, server.client() as client:
        missing = client.post("/v1/infer", json={"text": "no key"})
        wrong = client.post("/v1/infer", json={"text": "wrong key"}, headers=_bearer("key-one-4f9c2f"))
        basic = client.post("/v1/infer", json={"text": "basic"}, headers={"Authorization": "Basic a2V5OnB3"})
        for refused, code in ((missing, "missing_api_key"), (wrong, "invalid_api_key"), (basic, "invalid_api_key")):
            assert refused.status_code == 401
            assert refused.headers["WWW-Authenticate"].startswith("Bearer")
            assert refused.json()["error"]["code"] == code and refused.json()["error"]["field"] == "authorization"
        for key in KEYS:
            assert client.post("/v1/infer", json={"text": "with a key"}, headers=_bearer(key)).status_code == 200
        # Probes and scrapers need no key; everything else does, the docs and admin routes included.
        for path in ("/health/live", "/health/ready", "/v2/health/live", "/v2/health/ready"):
            assert client.get(path).status_code == 200, path
        metrics = client.get("/metrics")
        assert metrics.status_code == 200 and _count(metrics.text, "401") == 3
        for method, path in (("GET", "/openapi.json"), ("GET", "/v1/models"), ("GET", "/v2/models/tiny"),
                             ("DELETE", "/v1/cache"), ("POST", "/v1/admin/faults"),
                             ("POST", "/v1/monitoring/baseline"), ("POST", "/v1/embeddings"),
                             ("POST", "/v2/models/tiny/infer")):
            assert client.request(method, path).status_code == 401, path
        for path in ("/v1/models", "/v1/models/tiny", "/v1/embeddings"):  # OpenAI's paths: OpenAI's shape
            assert client.get(path).json()["error"]["param"] == "authorization", path
        # An inference key is no admin key: the cache stays (server.http.access_policy; test_auth_roles.py).
        assert client.delete("/v1/cache", headers=_bearer(KEYS[1])).status_code == 403


def test_a_presented_key_is_compared_with_every_key_in_constant_time(monkeypatch):
    compared: list[tuple[bytes, bytes]] = []
    real_compare = hmac.compare_digest

    def recording_compare(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real_compare(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording_compare)
    ring = KeyRing.from_sources(api_keys=SecretStr(KEYS[0]), admin_api_keys=SecretStr(KEYS[1]))
    assert ring.match(KEYS[0].encode()).role is Role.INFERENCE and ring.match(KEYS[1].encode()).role is Role.ADMIN
    assert ring.match(b"key-one") is None
    # Digests of equal length are compared, never the keys, and every configured key each time (no early exit).
    digests = [key_digest(key.encode()) for key in KEYS]
    assert compared == [(key_digest(presented), configured) for presented in (KEYS[0].encode(), KEYS[1].encode(),
                                                                              b"key-one")
                        for configured in digests]


def test_openai_and_triton_clients_work_with_keys_on(live_server_factory):
    with live_server_factory(api_keys=KEYS[0]) as server:
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEYS[0], max_retries=0) as client:
            answer = client.embeddings.create(model="tiny", input=["a red bicycle"])
            assert len(answer.data) == 1 and len(answer.data[0].embedding) > 0
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="not-a-key", max_retries=0) as client:
            with pytest.raises(openai.AuthenticationError):
                client.embeddings.create(model="tiny", input=["a red bicycle"])

        triton = triton_http.InferenceServerClient(url=server.url.removeprefix("http://"))
        try:
            text = triton_http.InferInput("text", [1], "BYTES")
            text.set_data_from_numpy(np.array([b"a red bicycle"], dtype=object))
            result = triton.infer("tiny", [text], headers=_bearer(KEYS[0]))
            assert result.as_numpy("text_embedding").shape[0] == 1
            with pytest.raises(InferenceServerException) as refused:
                triton.infer("tiny", [text])
            assert refused.value.status() == "401"
        finally:
            triton.close()


@contextmanager
def _server_with_closed_probes(settings: Settings, bundle: object, ops_port: int) -> Iterator[str]:
    """Like the shared live-server fixture, but readiness is read on the probe port (the main one needs a key)."""
    app = create_app(settings, bundle)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not become ready"
            try:
                if httpx.get(f"http://127.0.0.1:{ops_port}/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()


def test_keys_from_a_file_and_closed_probes_on_their_own_port(tiny_bundle, tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text("# operators\nfile-key-a  # alice\n\nfile-key-b\n")
    ops_port = _free_port()
    settings = Settings(preset="tiny", device="cpu", api_key_file=key_file, open_health_and_metrics=False,
                        metrics_port=ops_port)
    with _server_with_closed_probes(settings, tiny_bundle, ops_port) as url, \
            httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/health/live").status_code == 401
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=_bearer("file-key-b")).status_code == 200
        assert client.post("/v1/infer", json={"text": "a"}, headers=_bearer("file-key-a")).status_code == 200
        assert client.post("/v1/infer", json={"text": "a"}, headers=_bearer("# operators")).status_code == 401
        with httpx.Client(base_url=f"http://127.0.0.1:{ops_port}", timeout=10) as probes:
            assert probes.get("/health/live").json() == {"status": "live"}
            assert probes.get("/health/ready").status_code == 200
            scraped = probes.get("/metrics")
            assert scraped.status_code == 200 and _count(scraped.text, "200") >= 1
            assert probes.post("/v1/infer", json={"text": "a"}).status_code == 404
            assert probes.get("/openapi.json").status_code == 404


def test_an_empty_key_file_stops_the_server_rather_than_leaving_it_open(tmp_path, capsys, monkeypatch):
    key_file = tmp_path / "keys"
    key_file.write_text("# nobody yet\n\n")
    with pytest.raises(ApiKeyConfigError, match="holds no key"):
        create_app(Settings(preset="tiny", device="cpu", api_key_file=key_file))
    monkeypatch.setenv("MMSERVE_API_KEY_FILE", str(key_file))
    assert mmserve_main(["serve", "--preset", "tiny", "--port", str(_free_port())]) == 2
    assert "holds no key" in capsys.readouterr().err


def test_bench_sends_its_key_file_and_a_run_of_refusals_exits_nonzero(live_server_factory, tmp_path, capsys):
    """``mmserve bench --api-key-file`` reads the file as ``mmserve quantiles`` does; a run whose answers are
    mostly errors (401 without the key, 422 for texts over the model's limit) says so and exits 3."""
    key_file = tmp_path / "bench-key"
    key_file.write_text(f"# the bench's key\n{KEYS[1]}\n")
    load = ["--rate", "20", "--duration", "1", "--mix", "text:1", "--no-progress"]

    def bench(name: str, *flags: str) -> tuple[int, dict]:
        code = mmserve_main(["bench", server.url, *load, *flags, "--output", str(tmp_path / f"{name}.json")])
        return code, json.loads((tmp_path / f"{name}.json").read_text())

    with live_server_factory(api_keys=",".join(KEYS)) as server:
        keyless_code, keyless = bench("keyless", "--text-chars", "8:24")
        keyed_code, keyed = bench("keyed", "--text-chars", "8:24", "--api-key-file", str(key_file))
        long_code, too_long = bench("too-long", "--text-chars", "3000:4000", "--api-key-file", str(key_file))
    assert keyless_code == 3 and keyless["ok"] == 0 and set(keyless["errors_by_status"]) == {"401"}, keyless
    assert any("401" in warning and "--api-key-file" in warning for warning in keyless["warnings"]), keyless
    assert keyed_code == 0 and keyed["ok"] == keyed["sent"] > 0 and not keyed["mostly_errors"], keyed
    assert keyed["config"]["api_key_sent"] is True and KEYS[1] not in json.dumps(keyed)
    assert long_code == 3 and set(too_long["errors_by_status"]) == {"422"}, too_long
    assert any("--truncate" in warning for warning in too_long["warnings"]), too_long
    assert "WARNING: " in capsys.readouterr().out  # the table says it too


def test_cors_is_off_unless_origins_are_configured(live_server_factory):
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    with live_server_factory() as server, server.client() as client:
        assert "access-control-allow-origin" not in client.options("/v1/infer", headers=preflight).headers
        plain = client.post("/v1/infer", json={"text": "x"}, headers={"Origin": "https://app.example"})
        assert "access-control-allow-origin" not in plain.headers
    with live_server_factory(cors_origins="https://app.example", api_keys=KEYS[0]) as server, \
            server.client() as client:
        allowed = client.options("/v1/infer", headers=preflight)
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == "https://app.example"
        assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
        other = client.options("/v1/infer", headers={**preflight, "Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers
        answer = client.post("/v1/infer", json={"text": "x"},
                             headers={"Origin": "https://app.example", **_bearer(KEYS[0])})
        assert answer.headers["access-control-allow-origin"] == "https://app.example"
        assert "x-request-id" in answer.headers["access-control-expose-headers"].lower()


def test_logs_carry_ids_sizes_and_digests_never_texts_or_image_bytes(tiny_server, caplog):
    secret = "Zebra-quartz-7731 my-home-address"
    image = encoded_image(5, (32, 24))
    image_b64 = base64.b64encode(image).decode()
    with caplog.at_level(logging.DEBUG), tiny_server.client() as client:
        served = client.post("/v1/infer", json={"text": secret, "image": {"b64": image_b64}})
        refused = client.post("/v1/infer", json={"text": secret * 20_000})  # over max_text_chars: 422
        broken = client.post("/v1/infer", content=f'{{"text": "{secret}"'.encode(),
                             headers={"content-type": "application/json"})
        embedded = client.post("/v1/embeddings", json={"input": [secret]})
    assert (served.status_code, refused.status_code, broken.status_code, embedded.status_code) == (200, 422, 400, 200)
    logged = "\n".join(record.getMessage() + (record.exc_text or "") for record in caplog.records)
    for fragment in ("Zebra-quartz", "my-home-address", image_b64[:40], image_b64[-40:]):
        assert fragment not in logged
    access = [record.getMessage() for record in caplog.records if record.name == "server.http.access_log"]
    assert any(served.headers["X-Request-ID"] in line and "POST /v1/infer -> 200" in line and "blake2b" in line
               for line in access), access
    assert any(refused.headers["X-Request-ID"] in line and "-> 422" in line for line in access)


def _unsafe_loads(source: str) -> list[str]:
    problems = []
    for number, line in enumerate(source.splitlines(), 1):
        code = line.split("#", 1)[0]
        if re.search(r"\b(import|from)\s+(c?pickle|dill|joblib|shelve|marshal)\b", code):
            problems.append(f"{number}: {line.strip()}")
        if re.search(r"\bpickle\.", code):
            problems.append(f"{number}: {line.strip()}")
        if "torch.load(" in code and "weights_only=True" not in code:
            problems.append(f"{number}: {line.strip()}")
        if "allow_pickle=True" in code or "trust_remote_code=True" in code:
            problems.append(f"{number}: {line.strip()}")
    return problems


def test_no_pickle_anywhere_on_the_load_path():
    assert _unsafe_loads("import pickle\nx = torch.load(f)\ny = torch.load(f, weights_only=True)\n") == [
        "1: import pickle", "2: x = torch.load(f)"]
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            problems = _unsafe_loads(path.read_text())
            if problems:
                found[str(path.relative_to(ROOT))] = problems
    assert found == {}
    loading = (ROOT / "models" / "loading" / "repository.py").read_text()
    assert "safetensors" in loading and "load_file(" in loading


def _repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    assert mmserve_main(["init-model-repo", str(repo), "--preset", "tiny", "--seed", "0"]) == 0
    return repo


@pytest.mark.parametrize("escape", ["hf_dir", "tokenizer_symlink"])
def test_model_repository_paths_cannot_escape_the_repository(tmp_path, capfd, escape):
    repo = _repository(tmp_path)
    outside = tmp_path / "outside"
    (repo / "tokenizer").rename(outside)
    if escape == "hf_dir":
        config = yaml.safe_load((repo / "model.yaml").read_text())
        config["text"]["hf_dir"] = "../outside"
        (repo / "model.yaml").write_text(yaml.safe_dump(config))
    else:
        (repo / "tokenizer").symlink_to(outside, target_is_directory=True)
    status = mmserve_main(["serve", "--model-repo", str(repo), "--port", str(_free_port()), "--device", "cpu"])
    assert status == 2  # a configuration error: one line, no traceback (server.runtime.startup_checks)
    captured = capfd.readouterr()
    last_line = (captured.out + captured.err).strip().splitlines()[-1]
    assert "points outside the repository" in last_line and "Traceback" not in captured.out + captured.err
