import pytest

from admitgate import ManualClock


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(5.0)
    assert clock() == 5.0
    clock.advance(0.25)
    assert clock() == 5.25
    with pytest.raises(ValueError):
        clock.advance(-1)
