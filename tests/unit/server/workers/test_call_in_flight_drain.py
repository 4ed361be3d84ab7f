"""An API process that drains refuses a new call with a message: ``{"code": "shutting_down", "message": ""}``
told a client nothing (gRPC's ``UNAVAILABLE`` and HTTP's 503 carry this text)."""

from __future__ import annotations

import pytest

from router.errors import ShuttingDownError
from server.http.error_mapping import api_error_from
from server.workers.engine_client import CallInFlight


class _DrainingClient:
    """What ``CallInFlight`` reads of an ``EngineClient``: draining, nothing in flight."""

    is_draining, num_in_flight = True, 0


def test_a_draining_api_process_refuses_a_call_saying_the_server_is_shutting_down():
    client = _DrainingClient()
    with pytest.raises(ShuttingDownError) as raised, CallInFlight(client):  # type: ignore[arg-type]
        pass
    error = api_error_from(raised.value)
    assert error is not None
    assert (error.status, error.code, error.message) == (503, "shutting_down", "the server is shutting down")
    assert client.num_in_flight == 0  # refused before it was counted in flight


def test_no_shutting_down_error_is_without_a_message():
    assert str(ShuttingDownError()) == "the server is shutting down"
