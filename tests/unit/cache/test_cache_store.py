"""The per-modality store: partitions, stats, events, clear, thread safety."""

from __future__ import annotations

import random
import threading

import pytest

from cache import Modality, SegmentStore

from segment_fixtures import EventLog, image_key, text_key


def test_modalities_have_separate_budgets_and_never_evict_each_other(event_log: EventLog) -> None:
    store: SegmentStore[str] = SegmentStore(image_budget_bytes=100, text_budget_bytes=10, on_event=event_log)
    assert store.put(text_key("t0"), "T0", 6)
    assert store.put(image_key("i0"), "I0", 60)
    assert store.put(image_key("i1"), "I1", 40)
    assert store.put(image_key("i2"), "I2", 70)  # evicts i0 and i1, not the text
    assert store.keys(Modality.IMAGE) == (image_key("i2"),)
    assert store.keys(Modality.TEXT) == (text_key("t0"),)
    assert event_log.totals() == {
        ("text", "insert"): 1,
        ("image", "insert"): 3,
        ("image", "eviction"): 2,
    }
    assert ("image", "eviction", 2) in event_log.calls  # one call per put, with the exact count


def test_stats_are_exact() -> None:
    store: SegmentStore[str] = SegmentStore(image_budget_bytes=100, text_budget_bytes=50)
    store.put(image_key("a"), "A", 30)
    store.put(image_key("b"), "B", 25)
    store.put(text_key("x"), "X", 7)
    store.put(image_key("a"), "A again", 30)  # already present: no change in bytes
    stats = store.stats()
    assert (stats.image.size_bytes, stats.image.num_entries, stats.image.budget_bytes) == (55, 2, 100)
    assert (stats.text.size_bytes, stats.text.num_entries, stats.text.budget_bytes) == (7, 1, 50)
    assert stats.of(Modality.TEXT) is stats.text
    assert (stats.size_bytes, stats.num_entries) == (62, 3)


def test_get_refreshes_recency_across_the_store() -> None:
    store: SegmentStore[str] = SegmentStore(image_budget_bytes=30, text_budget_bytes=0)
    a, b, c, d = (image_key(name) for name in "abcd")
    for key in (a, b, c):
        store.put(key, key.hex, 10)
    assert store.get(a) == a.hex
    store.put(d, d.hex, 10)
    assert store.keys(Modality.IMAGE) == (c, a, d)
    assert store.get(b) is None


def test_zero_budget_disables_one_modality_only(event_log: EventLog) -> None:
    store: SegmentStore[str] = SegmentStore(image_budget_bytes=0, text_budget_bytes=100, on_event=event_log)
    assert not store.is_enabled(Modality.IMAGE)
    assert store.is_enabled(Modality.TEXT)
    assert store.put(image_key("a"), "A", 1) is False
    assert store.get(image_key("a")) is None
    assert store.put(text_key("a"), "A", 1) is True
    assert store.stats().image.num_entries == 0
    assert event_log.totals() == {("text", "insert"): 1}  # a disabled modality reports nothing


def test_oversize_is_refused_and_reported(event_log: EventLog) -> None:
    store: SegmentStore[str] = SegmentStore(image_budget_bytes=100, text_budget_bytes=100, on_event=event_log)
    store.put(image_key("small"), "S", 90)
    assert store.put(image_key("big"), "B", 101) is False
    assert store.keys(Modality.IMAGE) == (image_key("small"),)
    assert event_log.totals() == {("image", "insert"): 1, ("image", "refused"): 1}


def test_none_values_are_rejected() -> None:
    store: SegmentStore[None] = SegmentStore(image_budget_bytes=10, text_budget_bytes=10)
    with pytest.raises(ValueError):
        store.put(text_key("a"), None, 1)


def test_clear_empties_both_modalities() -> None:
    store: SegmentStore[str] = SegmentStore(image_budget_bytes=100, text_budget_bytes=100)
    store.put(image_key("a"), "A", 10)
    store.put(text_key("a"), "A", 10)
    store.put(text_key("b"), "B", 10)
    assert store.clear() == 3
    stats = store.stats()
    assert (stats.size_bytes, stats.num_entries) == (0, 0)
    assert store.get(text_key("a")) is None


def test_random_inserts_never_exceed_budget_after_any_op() -> None:
    rng = random.Random(7)
    budgets = {Modality.IMAGE: 5_000, Modality.TEXT: 700}
    store: SegmentStore[int] = SegmentStore(budgets[Modality.IMAGE], budgets[Modality.TEXT])
    for step in range(3000):
        is_image = rng.random() < 0.5
        key = (image_key if is_image else text_key)(f"k{rng.randint(0, 80)}")
        size_bytes = rng.randint(1, 2_000 if is_image else 300)
        store.put(key, step, size_bytes)
        if rng.random() < 0.3:
            store.get((image_key if rng.random() < 0.5 else text_key)(f"k{rng.randint(0, 80)}"))
        stats = store.stats()
        for modality, budget_bytes in budgets.items():
            assert stats.of(modality).size_bytes <= budget_bytes
            assert stats.of(modality).num_entries == len(store.keys(modality))


def test_concurrent_get_put_from_threads_keeps_invariants(event_log: EventLog) -> None:
    """Several threads hammer one store; byte totals stay exact and within budget."""
    budget_bytes = 4_000
    store: SegmentStore[int] = SegmentStore(budget_bytes, budget_bytes, on_event=event_log)
    keys = [(image_key if i % 2 else text_key)(f"k{i}") for i in range(64)]
    size_of = {key: 50 + 37 * i for i, key in enumerate(keys)}  # every key always has the same size
    errors: list[BaseException] = []
    start = threading.Barrier(5)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            start.wait(timeout=10)
            for _ in range(3000):
                key = rng.choice(keys)
                if rng.random() < 0.5:
                    value = store.get(key)
                    assert value is None or value == size_of[key]
                else:
                    store.put(key, size_of[key], size_of[key])
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    def observer() -> None:
        try:
            start.wait(timeout=10)
            for _ in range(500):
                stats = store.stats()
                assert stats.image.size_bytes <= budget_bytes
                assert stats.text.size_bytes <= budget_bytes
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    threads.append(threading.Thread(target=observer))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []

    stats = store.stats()
    for modality in (Modality.IMAGE, Modality.TEXT):
        resident = store.keys(modality)
        assert stats.of(modality).size_bytes == sum(size_of[key] for key in resident)
        assert stats.of(modality).size_bytes <= budget_bytes
        assert stats.of(modality).num_entries == len(resident)
        totals = event_log.totals()
        # Every insert is either still resident or was evicted exactly once.
        assert totals[(modality.value, "insert")] - totals[(modality.value, "eviction")] == len(resident)
