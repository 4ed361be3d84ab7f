"""The monitor's record buffer: bounded, counts what it drops, and a drain takes everything appended so far."""

from __future__ import annotations

import numpy as np

from monitoring.record_buffer import RecordBuffer


def test_a_full_buffer_counts_drops_and_a_drain_folds_what_was_kept():
    buffer = RecordBuffer(capacity=2)
    for total_ms in (1, 2, 3):
        buffer.append("text", {"total": total_ms * 1_000_000}, 1, None, None)
    assert buffer.num_dropped == 1
    folded = buffer.drain_and_fold()
    assert folded.num_records == 2
    (values_s,) = [values for cell, values in folded.values_s.items() if cell.route == "text"]
    np.testing.assert_allclose(np.sort(values_s), [0.001, 0.002])
    buffer.append("text", {"total": 4_000_000}, 1, None, None)  # room again after the drain
    assert buffer.num_dropped == 1 and buffer.drain_and_fold().num_records == 1
    assert buffer.drain_and_fold().num_records == 0
