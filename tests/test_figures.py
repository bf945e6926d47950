"""The README's figures are the ones the results files hold, so a figure cannot drift from its evidence.

Each row of the README's figures table is computed here from its benchmark's file in ``bench/results/`` and
compared with the cell as written: a benchmark run that changes a figure fails this test until the README says
what the file now holds, and a row no results file backs fails it too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def results(name: str) -> Any:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def thousands(n: float) -> str:
    return f"{n:,.0f}"


def share(x: float) -> str:
    return f"{100 * x:.1f} %"


def span(values: list[float], digits: int = 3) -> str:
    return f"{min(values):.{digits}f}–{max(values):.{digits}f}"


def herd(scenario: str, target: str | None) -> Callable[[], str]:
    def cell() -> str:
        m = results("herd.json")["median"][scenario]
        drain = f"{m['drain_ratio']:.3f}" + (f" (target ≤ {target})" if target else "")
        five = f"{m['server_5xx']}" if target else f"{thousands(m['server_5xx'])} 5xx"
        return f"{drain}, {five}, {share(m['new_served'])}"

    return cell


def fleet_herd() -> str:
    median = results("fleet_herd.json")["this"]["median"]
    return f"{median['drain_ratio']:.3f} (target ≤ 1.15), {median['promised_peak_ratio']:.2f} (target ≤ 1.2), " \
           f"{median['server_5xx']}"  # fmt: skip


def fair_share() -> str:
    shares = results("fairness.json")["abuse"]["share_of_H"]
    obedient = [v for k, v in shares.items() if k != "abuser"]
    return f"abuser {shares['abuser']:.3f} of H, obedient {span(obedient)}"


def tenant_herd() -> str:
    runs = results("tenant_herd.json")["runs"]
    first = min(r["small_first_try"] for r in runs)
    return f"{span([r['herd_drain_ratio'] for r in runs])}, {100 * first:.0f} %"


def schedule_matrix() -> str:
    drains = [cell["drain_ratio"] for cell in results("schedule.json")["matrix"].values()]
    return f"{span(drains)} (target ≤ 1.2)"


def shared_ratio() -> str:
    rows = (RESULTS / "shared.txt").read_text(encoding="utf-8").splitlines()
    return next(line.split()[2] for line in rows if line.startswith("admitgate_redis "))


def matrix_met() -> str:
    """Per way, the cells of the scenario matrix whose every target is met, of those with targets."""
    counts: dict[str, list[int]] = {}
    for cell in results("matrix.json")["cells"].values():
        for way, judged in cell["ways"].items():
            if judged["met"]:
                counts.setdefault(way, [0, 0])[1] += 1
                counts[way][0] += all(judged["met"].values())
    (met, of), (bdp, bdp_of), (typed, typed_of) = counts["default"], counts["bdp"], counts["typed"]
    return f"{met} of {of} (bdp {bdp} of {bdp_of}, typed-in {typed} of {typed_of})"


def matrix_cell(cell: str, way: str, *keys: str) -> str:
    median = results("matrix.json")["cells"][cell]["ways"][way]["median"]
    return ", ".join(f"{median[key]:.3f}" for key in keys)


#: The README's figures table: each row's first cell, and the figure cell its results file gives.
ROWS: dict[str, Callable[[], str]] = {
    "the default `AdmitGate(app)` on the scenario matrix: cells meeting every target": matrix_met,
    "hello world, 32 connections, default gate: req/s ÷ bare (bdp)": lambda: "{} ({})".format(
        matrix_cell("cpu-0/closed32", "default", "req_ratio"), matrix_cell("cpu-0/closed32", "bdp", "req_ratio")),
    "2 ms of CPU a request at 2× capacity, default gate: goodput ÷ C, p99 s (bdp)": lambda: "{} ({})".format(
        matrix_cell("cpu-2/open2", "default", "goodput_ratio", "ok_p99_s"),
        matrix_cell("cpu-2/open2", "bdp", "goodput_ratio", "ok_p99_s")),
    "herd of 2,000 at μ = 200/s, `rate=200`: drain / (M/H), 5xx, new arrivals served":
        herd("admitgate static rate=200", "1.10"),
    "the same herd, no gate": herd("no gate", None),
    "the same herd behind slowapi at 200/s": herd("slowapi 200/s", None),
    "the same herd, capacity learnt live (`bdp`)": herd("admitgate live (no hint)", "1.15"),
    "four replicas sharing Redis behind one 400/s service, 5,000 clients beside 40/s new: drain / (M/H_fleet), most "
    "told the same second / H, 5xx": fleet_herd,
    "four replicas, one budget of 200/s offered 500/s: admitted / budget":
        lambda: f"{results('fleet_rate.json')['ratio_median']:.3f}",
    "fair share: a tenant ignoring Retry-After beside 5 obedient ones (H/6 = 0.167)": fair_share,
    "a herd in one tenant beside a small one: drain / (M/(μ − 10/s)), small served first try": tenant_herd,
    "1,013,999 distinct tenant keys against a real server: memory after the first 100,000":
        lambda: f"+{results('tenant_keys.json')['rss_growth_after_100k_mb']:.1f} MB",
    "simulated herds, 4 scenarios × static/live × obeying/20 % ignoring: drain / ∫H bound": schedule_matrix,
    "simulated herds of 20,000–100,000 at H = 180/s: drain / (M/H)":
        lambda: span([b["drain_ratio"] for b in results("schedule.json")["big"]]),
    "time added per request to a Starlette app, in process, `rate=` typed in":
        lambda: f"{results('inprocess.json')['admitgate_added_over_starlette_us_median']:.2f} µs",
    "time added per request to a trivial app, in process, default gate (target ≤ 2 µs)":
        lambda: f"{results('inprocess.json')['admitgate_default_added_us_median']:.2f} µs",
    "req/s over HTTP, ratio to bare Starlette": lambda: "{admitgate:.3f} (slowapi {slowapi:.3f})".format(
        **results("overhead.json")["ratio_to_bare_median"]),
    "Redis budget against the in-memory gate, req/s": shared_ratio,
}  # fmt: skip


def readme_figures() -> dict[str, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("## Figures", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split(" | ") for line in table.splitlines() if line.startswith("| ")]
    return {row[0].strip(): row[1].strip() for row in rows[1:]}  # (after the header; its rule starts "|-")


def test_every_readme_figure_is_what_its_results_file_holds() -> None:
    figures = readme_figures()
    assert figures, "the README has a figures table"
    unbacked = sorted(set(figures) - set(ROWS))
    assert not unbacked, f"README rows with no results file computed in tests/test_figures.py: {unbacked}"
    for row, compute in ROWS.items():
        assert row in figures, f"{row!r}: no such README row"
        assert figures[row] == compute(), f"{row!r}: the README says {figures[row]!r}, the file {compute()!r}"


def test_a_figure_cell_is_short() -> None:
    for row, figure in readme_figures().items():
        assert len(figure) <= 120, row
