"""`mmserve serve` given a path of the wrong kind: a directory where a file goes, a file where a directory goes.

Each must end in one last line that says what the path is (not "does not
exist" for a directory that does), exit 2, no traceback, before the model
loads. None imports torch: they run one after another in seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_bad_start import BadStart, _problems, _start


def _cases(tmp_path: Path) -> list[BadStart]:
    trained = tmp_path / "trained"  # what `mmserve train-fusion --out DIR` leaves: DIR/fusion_head.safetensors
    trained.mkdir()
    (trained / "fusion_head.safetensors").write_bytes(b"")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    return [
        BadStart("fusion head a directory", ("--model-repo", str(tmp_path), "--fusion-head", str(trained)),
                 ("--fusion-head", str(trained), "is a directory, not a safetensors file",
                  str(trained / "fusion_head.safetensors"))),
        BadStart("fusion head missing", ("--model-repo", str(tmp_path), "--fusion-head", str(tmp_path / "none")),
                 ("--fusion-head", str(tmp_path / "none"), "does not exist")),
        BadStart("model a file", ("--model", str(weights)), ("--model", str(weights), "is a file, not a directory")),
        BadStart("config a directory", ("--config", str(trained)), ("--config", str(trained), "directory")),
    ]


@pytest.mark.parametrize("index", range(4))
def test_a_path_of_the_wrong_kind_is_named_for_what_it_is(tmp_path: Path, index: int):
    case = _cases(tmp_path)[index]
    output, _ = (process := _start(case, {})).communicate(timeout=120)
    problems = _problems(case, output, process.returncode, expected_returncode=2)
    assert not problems, f"{', '.join(problems)}\n{output[-1500:]}"
