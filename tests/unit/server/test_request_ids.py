"""Request ids: version-4 UUIDs as 32 hex digits, never repeated, not even by a forked process."""

from __future__ import annotations

import os
import uuid

from server.request_layer import new_request_id


def test_request_ids_are_distinct_version_4_uuids():
    ids = [new_request_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    for request_id in ids[:100]:
        parsed = uuid.UUID(request_id)
        assert parsed.hex == request_id and parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_a_forked_process_draws_other_ids_than_its_parent():
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        os.close(read_end)
        os.write(write_end, new_request_id().encode())
        os._exit(0)
    os.close(write_end)
    parent_next = new_request_id()
    with os.fdopen(read_end, "rb") as pipe:
        child_next = pipe.read().decode()
    os.waitpid(pid, 0)
    assert len(child_next) == 32 and child_next != parent_next
