"""One LRU partition: exact eviction order, recency, budget bound, refusals."""

from __future__ import annotations

import random

import pytest

from cache import InvalidSizeError
from cache.lru import ByteBoundedLru


def test_evicts_in_lru_order_and_reports_exact_keys() -> None:
    lru: ByteBoundedLru[str, str] = ByteBoundedLru(budget_bytes=8)
    assert lru.put("k0", "v0", 3) == ()
    assert lru.put("k1", "v1", 1) == ()
    assert lru.put("k2", "v2", 2) == ()
    assert lru.put("k3", "v3", 1) == ()
    assert lru.keys() == ("k0", "k1", "k2", "k3")
    assert lru.used_bytes == 7

    # 7 + 3 > 8: k0 (3 bytes) goes, 4 + 3 fits.
    assert lru.put("k4", "v4", 3) == ("k0",)
    # 7 + 5 > 8: k1 then k2 then k3 go (4 bytes freed), 3 + 5 fits.
    assert lru.put("k5", "v5", 5) == ("k1", "k2", "k3")
    assert lru.keys() == ("k4", "k5")
    assert lru.used_bytes == 8


def test_get_refreshes_recency() -> None:
    lru: ByteBoundedLru[str, str] = ByteBoundedLru(budget_bytes=3)
    for name in ("a", "b", "c"):
        lru.put(name, name.upper(), 1)
    assert lru.get("a") == "A"
    assert lru.keys() == ("b", "c", "a")
    assert lru.put("d", "D", 1) == ("b",)
    assert lru.get("b") is None
    assert lru.put("e", "E", 2) == ("c", "a")
    assert lru.keys() == ("d", "e")


def test_existing_key_keeps_first_value_and_becomes_mru() -> None:
    lru: ByteBoundedLru[str, str] = ByteBoundedLru(budget_bytes=10)
    lru.put("a", "first", 4)
    lru.put("b", "B", 4)
    assert lru.put("a", "second", 6) == ()
    assert lru.get("a") == "first"
    assert lru.used_bytes == 8
    assert lru.keys() == ("b", "a")


def test_oversize_value_is_refused_without_evicting() -> None:
    lru: ByteBoundedLru[str, str] = ByteBoundedLru(budget_bytes=10)
    lru.put("a", "A", 6)
    assert lru.put("huge", "H", 11) is None
    assert lru.keys() == ("a",)
    assert lru.used_bytes == 6
    # Exactly the budget fits, evicting everything else.
    assert lru.put("full", "F", 10) == ("a",)
    assert lru.used_bytes == 10


def test_zero_budget_stores_nothing() -> None:
    lru: ByteBoundedLru[str, str] = ByteBoundedLru(budget_bytes=0)
    assert lru.put("a", "A", 1) is None
    assert lru.num_entries == 0
    assert lru.used_bytes == 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_value_size_must_be_a_positive_int(bad) -> None:
    lru: ByteBoundedLru[str, str] = ByteBoundedLru(budget_bytes=10)
    with pytest.raises(InvalidSizeError):
        lru.put("a", "A", bad)


@pytest.mark.parametrize("bad", [-1, 2.0, None])
def test_budget_must_be_a_non_negative_int(bad) -> None:
    with pytest.raises(InvalidSizeError):
        ByteBoundedLru(bad)


def test_random_ops_never_exceed_budget_and_match_a_model() -> None:
    """Seeded random puts/gets; after every op the partition equals a plain reference model."""
    rng = random.Random(1234)
    budget_bytes = 1000
    lru: ByteBoundedLru[int, int] = ByteBoundedLru(budget_bytes)
    model: list[tuple[int, int]] = []  # (key, size_bytes), LRU first
    sizes = {key: rng.randint(1, 400) for key in range(60)}
    sizes[60] = budget_bytes + 1  # always refused
    num_evicted = 0
    for _ in range(5000):
        key = rng.randint(0, 60)
        if rng.random() < 0.4:
            got = lru.get(key)
            position = next((i for i, (k, _) in enumerate(model) if k == key), None)
            assert (got is None) == (position is None)
            if position is not None:
                assert got == key * 10
                model.append(model.pop(position))
        else:
            evicted = lru.put(key, key * 10, sizes[key])
            if sizes[key] > budget_bytes:
                assert evicted is None
            elif any(k == key for k, _ in model):
                assert evicted == ()
                model.append(model.pop(next(i for i, (k, _) in enumerate(model) if k == key)))
            else:
                expected: list[int] = []
                while sum(s for _, s in model) + sizes[key] > budget_bytes:
                    expected.append(model.pop(0)[0])
                model.append((key, sizes[key]))
                assert evicted == tuple(expected)
                num_evicted += len(expected)
        assert lru.used_bytes <= budget_bytes
        assert lru.used_bytes == sum(s for _, s in model)
        assert lru.keys() == tuple(k for k, _ in model)
    assert num_evicted > 100  # the run really exercised eviction
