"""``benchmarks/train_fusion_time.py``: a row from a model card, seconds per step, and the table."""

from __future__ import annotations

import pytest

from benchmarks.train_fusion_time import format_table, timed_run_of


def _card(num_pairs: int, steps_run: int, training_s: float, auc: float, learned: bool) -> dict:
    return {"pairs": {"num_pairs": num_pairs}, "held_out": {"auc": auc}, "verdict": {"learned": learned},
            "training": {"feature_seconds": 12.5, "training_seconds": training_s, "steps_run": steps_run,
                         "epochs_run": 7, "chosen": {"budget_steps": 500}}}


def test_a_row_reads_the_card_and_divides_training_time_by_steps():
    run = timed_run_of(_card(1000, 350, 420.0, 0.912, True), wall_s=451.25)
    assert (run.num_pairs, run.wall_s, run.feature_s, run.training_s) == (1000, 451.25, 12.5, 420.0)
    assert (run.steps_run, run.budget_steps, run.epochs_run) == (350, 500, 7)
    assert run.seconds_per_step == pytest.approx(1.2)


def test_the_table_has_one_line_per_size_and_marks_a_refused_head():
    runs = [timed_run_of(_card(120, 300, 30.0, 0.93, True), 50.0),
            timed_run_of(_card(5000, 0, 0.0, 0.5, False), 9.0)]
    lines = format_table(runs, "header").splitlines()
    assert lines[0] == "header" and len(lines) == 4
    assert lines[2].split() == ["120", "50.0", "12.5", "30.0", "300/500", "7", "0.100", "0.930"]
    assert lines[3].split()[-3:] == ["0.500", "(exit", "3)"] and "nan" in lines[3]  # no steps: no s/step
