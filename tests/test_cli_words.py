"""The command line says what its figures mean: the setting a planned window is, the simulator's rows and
scenarios, and a herd summary whose attempts add up to its status counts."""

from __future__ import annotations

import json

import pytest

from admitgate.cli import SIMULATE_ROWS, main
from admitgate.sim.scenario import SCENARIOS
from admitgate.sim.summary import Attempt, HerdResult, summarise
from lab.herd import _print_summary


def test_plan_names_the_setting_its_window_is(capsys) -> None:
    assert main(["plan", "-M", "2000", "-H", "180"]) == 0
    text = capsys.readouterr().out
    assert 'Settings(spread="jitter", spread_window=13.229)' in text
    assert "ADMITGATE_SPREAD=jitter ADMITGATE_SPREAD_WINDOW=13.229" in text
    assert main(["plan", "-M", "2000", "-H", "180", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["setting"] == {"spread": "jitter", "spread_window": 13.229}


def test_an_infeasible_plan_names_no_setting(capsys) -> None:
    assert main(["plan", "-M", "2000", "-H", "180", "--deadline", "5"]) == 1
    assert "setting:" not in capsys.readouterr().out


def test_simulate_help_names_every_scenario_and_explains_every_row(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in SCENARIOS:
        assert name in text.replace("- ", "-"), name  # (argparse may wrap a name at its hyphen)
    for row, meaning in SIMULATE_ROWS.items():
        assert f"{row} {meaning}" in text, row


def test_simulate_prints_each_rows_meaning_beside_it(capsys) -> None:
    assert main(["simulate", "--clients", "200", "--gate-only"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for row, meaning in SIMULATE_ROWS.items():
        assert any(line.startswith(row) and line.endswith(meaning) for line in lines), row


def test_the_demos_attempts_add_up_to_its_status_counts(capsys) -> None:
    result = HerdResult(clients=2)
    result.attempts = [Attempt(0, 0.0, 0.1, 429, 1), Attempt(0, 1.1, 1.2, 200, None), Attempt(1, 0.0, 0.1, 200, None),
                       Attempt(-1, 0.5, 0.6, 200, None), Attempt(-1, 0.7, 0.8, 503, None)]  # fmt: skip
    result.finished = {0: 1.2, 1: 0.1}
    summary = {**summarise(result, headroom=2.0), "gate": "admitgate"}
    _print_summary(summary, 10.0, 2.0)
    line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("attempts"))
    assert "attempts              5 (herd 3, new arrivals 2)" in line
    assert sum(summary["status_counts"].values()) == 5
