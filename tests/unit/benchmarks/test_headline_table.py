"""BENCHMARKS.md's headline table is what ``benchmarks.headline`` makes of ``benchmarks/results/``, and a saved file feeds it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks import headline
from benchmarks.harness.figures import Figure, save_figures


def test_the_headline_table_in_benchmarks_md_equals_what_the_result_files_generate() -> None:
    markdown = headline.BENCHMARKS_MD.read_text(encoding="utf-8")
    table = headline.render(headline.read_results())
    assert table in markdown, "BENCHMARKS.md's headline table is stale: run python -m benchmarks.headline"
    assert headline.with_headline(markdown, table) == markdown
    first_row = markdown.splitlines().index("| Question | Latest figure | Machine | Date | Command |")
    assert first_row < 40


def test_every_result_file_names_known_rows_and_says_where_it_came_from() -> None:
    keys = {row.key for row in headline.ROWS}
    for document in headline.read_results():
        assert {"date", "machine", "command", "commit", "figures"} <= document.keys()
        assert document["figures"] and {figure["row"] for figure in document["figures"]} <= keys


def test_a_saved_file_becomes_its_row_and_the_newest_file_wins(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["benchmarks/segment_cache.py", "--seconds", "30"])
    save_figures(tmp_path / "old.json", [Figure("cache_gain", "Zipf gain", 2.5, "x")], date="2026-01-01 00:00 UTC")
    save_figures(tmp_path / "new.json", [Figure("cache_gain", "Zipf gain", 9.71, "x")], date="2026-02-01 00:00 UTC")
    saved = json.loads((tmp_path / "new.json").read_text())
    assert saved["figures"] == [{"row": "cache_gain", "name": "Zipf gain", "value": 9.71, "unit": "x"}]
    assert saved["command"].endswith("--seconds 30") and saved["commit"]

    rows = {line.split("](#")[0]: line for line in headline.render(headline.read_results(tmp_path)).splitlines()
            if line.startswith("| [")}
    assert "Zipf gain: 9.71x" in rows["| [segment cache gain"] and "2026-02-01 00:00 UTC" in rows["| [segment cache gain"]
    assert "no run on record" in rows["| [drift detection delay"]
