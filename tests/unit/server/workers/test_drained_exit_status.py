"""The supervisor's exit status after its drain: never a negative return code (-15 read as 241)."""

from __future__ import annotations

import signal

from server.workers.supervisor import EXIT_ENGINE_DIED, drained_exit_status


def test_engines_that_exited_or_died_of_the_signal_sent_to_stop_them_drained():
    assert drained_exit_status([0, None, -signal.SIGTERM], signal.SIGTERM) == 0


def test_an_engine_killed_by_a_signal_not_sent_failed_with_a_positive_status():
    assert drained_exit_status([0, -signal.SIGKILL], signal.SIGTERM) == EXIT_ENGINE_DIED
    assert drained_exit_status([-signal.SIGINT], signal.SIGTERM) == EXIT_ENGINE_DIED


def test_an_engine_that_exited_non_zero_gives_its_own_status():
    assert drained_exit_status([-signal.SIGTERM, 3, -signal.SIGKILL], signal.SIGTERM) == 3
