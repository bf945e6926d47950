"""The scenario matrix's table (markdown: every figure beside its target, the ways side by side) and its one
results file (``bench/results/matrix.json``: a run's cells replace those cells, the others are kept)."""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path
from typing import Any

#: Each figure's label in the table.
LABELS = {
    "req_per_s": "req/s", "req_ratio": "req/s ÷ bare", "p50_ms": "p50 ms", "p50_ratio": "p50 ÷ bare",
    "p99_ms": "p99 ms", "paced": "paced holds", "rejected": "rejected", "non_2xx": "not 2xx",
    "offered_ratio": "offered ÷ asked", "lag_p99_s": "sent late by, p99 s", "goodput_window": "goodput 3–15 s, /s",
    "goodput_ratio": "goodput ÷ C",
    "served_share_window": "served ÷ sent, 3–15 s", "ok_p50_s": "p50 of 200s, s", "ok_p99_s": "p99 of 200s, s",
    "timeout_share": "timeouts ÷ sent", "rejected_429": "429s", "no_retry_after": "429s without Retry-After",
    "server_5xx_after_1s": "5xx sent after 1 s", "drain_vs_bound": "drain ÷ ∫H bound", "drain_s": "drain, s",
    "new_served": "new served 1st try", "server_5xx": "5xx", "server_5xx_outside_cut": "5xx outside a cut's second",
    "server_5xx_cut_second": "5xx sent in a cut's second", "edge_peak_to_avg": "edge peak/avg",
    "attempts": "herd tries", "settle_s": "settle, s", "worst_after_settle": "worst second after ÷ C",
    "lowest_after_step": "lowest second after step ÷ C", "loop_lag_p99_s": "generator's timers late by, p99 s",
    "fresh_connections": "connections opened", "connect_p99_s": "connect, p99 s",
    "unconnected": "gave up before connected", "server_cpu_share": "server on its core ÷ run",
    "server_wait_share": "server waiting for its core ÷ run", "generator_wait_share": "generator waiting ÷ run",
}  # fmt: skip
#: Figures shown per kind of load (and after a change); a figure with a target is shown whether listed or not.
ROWS: dict[str, list[str]] = {
    "closed32": ["req_per_s", "req_ratio", "p50_ms", "p50_ratio", "p99_ms", "paced", "rejected", "non_2xx"],
    "open": ["offered_ratio", "lag_p99_s", "loop_lag_p99_s", "goodput_window", "goodput_ratio",
             "served_share_window", "ok_p50_s", "ok_p99_s", "timeout_share", "rejected_429", "no_retry_after",
             "server_5xx_after_1s", "non_2xx", "fresh_connections", "connect_p99_s", "unconnected",
             "server_cpu_share"],
    "herd": ["drain_vs_bound", "drain_s", "new_served", "server_5xx", "edge_peak_to_avg", "attempts",
             "loop_lag_p99_s"],
    "event": ["settle_s", "worst_after_settle", "lowest_after_step"],
}  # fmt: skip
#: The simulator's figures shown beside a cell.
SIMULATED = ["drain_vs_bound", "new_served", "server_5xx", "edge_peak_to_avg", "settle_s"]


def _value(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def _figure(way: dict[str, Any] | None, key: str) -> str:
    if way is None:
        return ""
    text = _value(way["median"].get(key))
    if key in way["met"]:
        text += " ✓" if way["met"][key] else " ✗"
    return text


def _targets(ways: dict[str, Any]) -> dict[str, str]:
    """Each figure's target as the default gate is held to it, and another way's where it differs."""
    out: dict[str, str] = {}
    for name, way in sorted(ways.items(), key=lambda item: item[0] != "default"):
        for key, target in way["targets"].items():
            if key not in out:
                out[key] = target
            elif not out[key].startswith(target) and target not in out[key]:
                out[key] += f" ({name} {target})"
    return out


def _rows(cell_id: str, cell: dict[str, Any], ways: list[str]) -> list[str]:
    load = cell.get("load", "")
    keys = ROWS.get(load, []) + (ROWS["event"] if cell.get("event") else [])
    targeted = _targets(cell["ways"])
    keys += [k for k in targeted if k not in keys]
    head = f"**{cell_id}** (C {cell['capacity']:g}/s)"
    if any(w["median"].get("offered_short") for w in cell["ways"].values()):
        head += " ⚠ the generator offered < 95 % of the rate asked"
    late = [w["median"] for w in cell["ways"].values() if w["median"].get("generator_short")]
    if late:
        head += f" ⚠ the generator's timers ran > {late[0].get('loop_lag_bound_s', 0.1):g} s late (p99)"
    if any(w["median"].get("contended") for w in cell["ways"].values()):
        head += " ⚠ the server or the generator waited for its core > 10 % of the run (other work)"
    errors = sum(1 for w in cell["ways"].values() for r in w["runs"] if r.get("error"))
    if errors:
        head += f" ⚠ {errors} run(s) failed"
    lines = []
    for i, key in enumerate(keys):
        row = [head if i == 0 else "", LABELS.get(key, key), targeted.get(key, "")]
        row += [_figure(cell["ways"].get(w), key) for w in ways]
        lines.append("| " + " | ".join(row) + " |")
    sim = cell.get("simulated") or {}
    for key in [k for k in SIMULATED if any(figures.get(k) is not None for figures in sim.values())]:
        label = "simulated: " + LABELS[key]
        lines.append("| " + " | ".join(["", label, "", *(_value(sim.get(w, {}).get(key)) for w in ways)]) + " |")
    return lines


def table(result: dict[str, Any]) -> str:
    """The markdown table of ``result`` (:func:`matrix.main`'s): one block of rows per cell."""
    ran = {w for cell in result["cells"].values() for w in cell["ways"]}
    ways = [w for w in ("default", "bdp", "typed", "metrics", "bare") if w in ran]
    cpu = ", ".join(f"{s} {c['capacity']:g}/s" for s, c in result["calibration"].items())
    sched = result.get("scheduler", {})
    priority = (f"own scheduler autogroup at nice {sched['nice']}" if sched.get("applied")
                else "no autogroup of its own" if sched.get("autogroup") else "no scheduler autogroups")  # fmt: skip
    lines = [f"Medians of {result['rounds']} round(s); {result['cores']} cores; {priority}; calibrated C: "
             f"{cpu or '–'}; ✓ target met, ✗ not; wall time {result['wall_s']:.0f} s", "",
             "| cell | figure | target | " + " | ".join(ways) + " |", "|" + "---|" * (3 + len(ways))]  # fmt: skip
    for cell_id, cell in result["cells"].items():
        lines += _rows(cell_id, cell, ways)
    verdicts = [c["met"] for c in result["cells"].values() if c["met"] is not None]
    lines += ["", f"default gate: {sum(verdicts)} of {len(verdicts)} cells with targets meet all of them"]
    return "\n".join(lines)


def _commit() -> str:
    out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent)  # fmt: skip
    return out.stdout.strip() or "unknown"


def save(result: dict[str, Any], path: Path) -> None:
    """Merge ``result``'s cells and calibration into the results file at ``path``, each stamped with the date,
    the commit and the machine's cores; cells this run did not run are kept as they were."""
    stored: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    stamp = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": _commit(),
             "cores": result["cores"], "rounds": result["rounds"], "scheduler": result.get("scheduler")}  # fmt: skip
    stored.setdefault("cells", {}).update({k: {**v, "ran": stamp} for k, v in result["cells"].items()})
    stored.setdefault("calibration", {}).update({k: {**v, "ran": stamp} for k, v in result["calibration"].items()})
    stored["cells"] = dict(sorted(stored["cells"].items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stored, indent=1) + "\n")
