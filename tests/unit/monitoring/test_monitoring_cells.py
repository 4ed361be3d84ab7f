"""Cells: each sample goes into one digest, and every series is read back as a merge of cells."""

from __future__ import annotations

import numpy as np
import pytest

from monitoring.digest import ks_distance, new_digest
from monitoring.ingest import CellKey
from monitoring.stage_digests import StageDigests


def cell(batch_bucket: str = "", cache: str = "") -> CellKey:
    return CellKey("fusion", "vision", batch_bucket, cache)


def test_series_are_the_unions_of_their_cells() -> None:
    digests = StageDigests(max_centroids=2000, segment_max_centroids=200, num_sub_windows=4)
    rng = np.random.default_rng(0)
    layout = {("1", "hit"): 100, ("1", "miss"): 200, ("5-8", "hit"): 300, ("5-8", ""): 400, ("", "miss"): 500}
    for (bucket, cache), num_values in layout.items():
        digests.add(cell(bucket, cache), rng.lognormal(np.log(0.02), 0.3, num_values))

    assert digests.window().n_values == 1500
    assert digests.lifetime().n_values == 1500
    counts = {segment: int(window.n_values) for segment, (window, _) in digests.segment_pairs().items()}
    assert counts == {
        ("batch_size", "1"): 300,
        ("batch_size", "5-8"): 700,
        ("cache", "hit"): 400,
        ("cache", "miss"): 700,
    }


def test_values_held_back_by_a_cell_are_read_and_closed() -> None:
    """Fewer values than a batch_update is worth wait in the cell; a read or a rotation takes them in."""
    digests = StageDigests(max_centroids=2000, segment_max_centroids=200, num_sub_windows=3)
    digests.add(cell("1", "miss"), np.full(10, 0.004))
    digests.add(cell("1", "miss"), np.full(10, 0.006))
    assert digests.window().n_values == 20
    assert digests.window().quantile(0.75) == pytest.approx(0.006)
    digests.add(cell("1", "miss"), np.full(5, 0.010))  # after a read: the window is merged again
    assert digests.window().n_values == 25

    digests.rotate(1, into_baseline=True)
    assert digests.window().n_values == 25
    assert digests.baseline.n_values == 25
    assert digests.segment_pairs()[("cache", "miss")][1].n_values == 25
    digests.rotate(1, into_baseline=False)
    digests.add(cell("2", "miss"), np.full(7, 0.001))
    assert digests.window().n_values == 32
    digests.rotate(2, into_baseline=False)  # three sub-windows: the first one has slid out
    assert digests.window().n_values == 7
    assert digests.lifetime().n_values == 32
    assert digests.baseline.n_values == 25  # frozen: nothing joined it since
    assert {s: int(w.n_values) for s, (w, _) in digests.segment_pairs().items()} == {
        ("batch_size", "1"): 0, ("batch_size", "2"): 7, ("cache", "miss"): 7,
    }


def test_a_segment_merged_from_cells_matches_one_digest_of_its_samples() -> None:
    """Attribution reads segments merged from compressed cells; they must say what one digest would."""
    rng = np.random.default_rng(1)
    digests = StageDigests(max_centroids=2000, segment_max_centroids=200, num_sub_windows=12)
    direct = new_digest(200)
    for _ in range(6):  # sub-windows
        for bucket in ("1", "2", "3-4", "5-8"):
            values_s = rng.lognormal(np.log(0.02), 0.5, 3000)
            digests.add(cell(bucket, "miss"), values_s)
            direct.batch_update(values_s)
            digests.add(cell(bucket, "hit"), rng.lognormal(np.log(0.002), 0.5, 3000))
        digests.rotate(1, into_baseline=False)
    window, _ = digests.segment_pairs()[("cache", "miss")]
    assert window.n_values == direct.n_values == 6 * 4 * 3000
    assert window.max_centroids == 200
    assert ks_distance(window, direct) < 0.005
