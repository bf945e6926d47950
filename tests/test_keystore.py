import tracemalloc

import pytest

from admitgate.core.errors import ConfigError
from admitgate.core.keystore import BoundedExpiringMap


def test_expiry_and_pop() -> None:
    m: BoundedExpiringMap[int] = BoundedExpiringMap(10)
    m.put("a", 1, expires_at=5.0, now=0.0)
    assert m.get("a", 4.9) == 1
    assert m.get("a", 5.0) is None
    assert len(m) == 0
    m.put("b", 2, expires_at=5.0, now=0.0)
    assert m.pop("b", 1.0) == 2
    assert m.pop("b", 1.0) is None


def test_size_cap_evicts_oldest_insertion() -> None:
    m: BoundedExpiringMap[int] = BoundedExpiringMap(3)
    for i in range(5):
        m.put(i, i, expires_at=100.0, now=0.0)
    assert len(m) == 3 and m.evicted == 2
    assert m.get(0, 1.0) is None and m.get(4, 1.0) == 4


def test_inserts_sweep_expired_entries() -> None:
    m: BoundedExpiringMap[int] = BoundedExpiringMap(1000)
    for i in range(100):
        m.put(i, i, expires_at=1.0, now=0.0)
    for i in range(100, 200):
        m.put(i, i, expires_at=10.0, now=2.0)
    assert len(m) == 100  # every insert swept up to two expired ones


@pytest.mark.slow
def test_a_million_distinct_keys_stay_bounded() -> None:
    tracemalloc.start()
    m: BoundedExpiringMap[tuple[float, float]] = BoundedExpiringMap(10_000)
    for i in range(1_000_000):
        m.put(f"client-{i}", (float(i), 0.01), expires_at=1e9, now=0.0)
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(m) == 10_000
    assert current < 8 * 1024 * 1024  # about 3 MB for 10,000 keys; a million would be ~300 MB


def test_bad_size() -> None:
    with pytest.raises(ConfigError, match="max_keys"):
        BoundedExpiringMap(0)


def test_sweep_drops_expired_entries_from_the_old_end_and_counts_what_is_left() -> None:
    m: BoundedExpiringMap[int] = BoundedExpiringMap(100)
    for k in range(10):
        m.put(k, k, expires_at=10.0 + k, now=0.0)  # insertion order is expiry order
    m.put("late", 0, expires_at=11.5, now=0.0)  # inserted last, expires among the first
    assert m.sweep(9.0) == 11  # nothing expired yet
    assert m.sweep(12.5) == 8  # 0, 1 and 2 expired (10, 11, 12), from the old end
    assert m.get(2, 12.5) is None and m.get(3, 12.5) == 3
    assert len(m) == 8  # "late" expired too but waits behind live older entries: counted until it is reached
    assert m.sweep(30.0) == 0


def test_data_shows_each_key_with_its_expiry_expired_ones_until_dropped() -> None:
    store: BoundedExpiringMap[str] = BoundedExpiringMap(10)
    store.put("a", "x", expires_at=5.0, now=0.0)
    assert store.data.get("a") == (5.0, "x")
    assert store.data.get("a") is not None and store.get("a", now=6.0) is None  # expired: get drops it
    assert store.data.get("a") is None
