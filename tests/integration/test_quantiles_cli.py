"""``mmserve quantiles``: two live replicas with different traffic, merged into fleet quantiles.

The printed numbers are checked twice: against a merge of the two fetched
digests done here with fastdigest itself, and against the exact quantiles of
every stage time the two servers reported to the client (``timings_ms``).
"""

from __future__ import annotations

import base64
import socket
import time

import httpx
import numpy as np

from monitoring import SUMMARY_QUANTILES
from monitoring.digest import digest_from_json
from server.cli import main as mmserve_main


def image_body(seed: int) -> dict:
    pixels = np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    return {"image": {"uint8": {"shape": [8, 8, 3], "b64": base64.b64encode(pixels.tobytes()).decode()}}}


def send(client: httpx.Client, bodies: list[dict]) -> list[dict]:
    timings = []
    for body in bodies:
        answer = client.post("/v1/infer", json=body)
        assert answer.status_code == 200, answer.text
        timings.append(answer.json())
    return timings


def wait_until_folded(client: httpx.Client, num_requests: dict[str, int]) -> dict:
    deadline = time.monotonic() + 10
    while True:
        document = client.get("/v1/monitoring/digests").json()
        counts = {entry["route"]: entry["lifetime"]["n_values"] for entry in document["series"]
                  if entry["stage"] == "total"}
        if counts == num_requests:
            return document
        assert time.monotonic() < deadline, (counts, num_requests)
        time.sleep(0.1)


def parse_table(text: str) -> dict[tuple[str, str], list[str]]:
    lines = text.strip().splitlines()
    header = lines[0].split()
    assert header[:4] == ["route", "stage", "replicas", "count"]
    return {(cells[0], cells[1]): cells[2:] for cells in (line.split() for line in lines[1:])}


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_quantiles_merges_two_replicas_digests(live_server_factory, capsys):
    texts_a = [{"text": f"short {i}"} for i in range(15)]
    texts_b = [{"text": f"a longer sentence, number {i} of the second replica"} for i in range(25)]
    images_b = [image_body(seed) for seed in range(5)]
    with live_server_factory() as a, live_server_factory(max_queue_delay_ms=1) as b, \
            a.client() as client_a, b.client() as client_b:
        answers = send(client_a, texts_a) + send(client_b, texts_b + images_b)
        documents = [wait_until_folded(client_a, {"text": 15}),
                     wait_until_folded(client_b, {"text": 25, "vision": 5})]
        capsys.readouterr()
        exit_code = mmserve_main(["quantiles", a.url, b.url.removeprefix("http://") + "/", "--source", "lifetime"])
        printed = capsys.readouterr()
    assert exit_code == 0, printed.err
    table = parse_table(printed.out)

    expected_keys = {(entry["route"], entry["stage"]) for document in documents for entry in document["series"]}
    assert set(table) == expected_keys
    for (route, stage), cells in table.items():
        parts = [digest_from_json(entry["lifetime"]) for document in documents for entry in document["series"]
                 if (entry["route"], entry["stage"]) == (route, stage)]
        merged = parts[0]
        for part in parts[1:]:
            merged.merge_inplace(part)
        assert cells[0] == str(len(parts))
        assert cells[1] == str(int(merged.n_values))
        assert cells[2:] == [f"{merged.quantile(q) * 1e3:.3f}" for q in SUMMARY_QUANTILES]

        observed_ms = np.array([answer["timings_ms"][stage] for answer in answers if answer["route"] == route])
        assert int(cells[1]) == len(observed_ms)
        for q, printed_ms in zip(SUMMARY_QUANTILES, map(float, cells[2:])):
            # A valid q-quantile of the fleet's samples, within one rank (1 us of rounding each way).
            below = np.mean(observed_ms < printed_ms - 1e-3)
            at_or_below = np.mean(observed_ms <= printed_ms + 1e-3)
            slack = 1.0 / len(observed_ms)
            assert below <= q + slack and at_or_below >= q - slack, (route, stage, q, printed_ms)
    assert table[("text", "total")][0] == "2" and table[("vision", "total")][0] == "1"


def test_quantiles_fails_naming_each_replica_it_cannot_read(live_server_factory, capsys):
    unreachable = f"http://127.0.0.1:{closed_port()}"
    with live_server_factory() as server:
        capsys.readouterr()
        exit_code = mmserve_main(["quantiles", server.url, unreachable, f"{server.url}/no-such-prefix"])
        printed = capsys.readouterr()
    assert exit_code == 2
    assert printed.out == ""
    errors = printed.err.strip().splitlines()
    assert len(errors) == 2, errors
    assert errors[0].startswith(f"mmserve quantiles: cannot reach {unreachable}/v1/monitoring/digests")
    assert errors[1].startswith(f"mmserve quantiles: {server.url}/no-such-prefix/v1/monitoring/digests "
                                "answered HTTP 404")


def test_quantiles_sends_the_key_from_a_key_file(live_server_factory, capsys, tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text("# fleet reader\nreader-key-5d1e\n")
    with live_server_factory(api_keys="reader-key-5d1e") as server, \
            server.client(headers={"Authorization": "Bearer reader-key-5d1e"}) as client:
        send(client, [{"text": "keyed"}])
        wait_until_folded(client, {"text": 1})
        capsys.readouterr()
        without_key = mmserve_main(["quantiles", server.url])
        refused = capsys.readouterr()
        with_key = mmserve_main(["quantiles", server.url, "--api-key-file", str(key_file), "--source", "lifetime"])
        printed = capsys.readouterr()
    assert without_key == 2 and "answered HTTP 401" in refused.err
    assert with_key == 0, printed.err
    assert ("text", "total") in parse_table(printed.out)
