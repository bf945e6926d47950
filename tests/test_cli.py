"""The command line: exit codes, strict JSON, plain words where a run or a plan falls short."""

from __future__ import annotations

import json

import pytest

from admitgate import __version__
from admitgate.cli import build_parser, main
from admitgate.sim.engine import stderr_progress


def strict_json(text: str):
    """Parse as RFC 8259 JSON: Infinity, -Infinity and NaN are errors, as in strict parsers."""

    def refuse(constant: str):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_demo_arguments_parse() -> None:
    args = build_parser().parse_args(["demo", "--herd", "10", "--gate", "none", "--spread", "jitter"])
    assert (args.herd, args.gate, args.spread) == (10, "none", "jitter")


def test_unknown_command_exits_2(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"admitgate {__version__}"


@pytest.mark.parametrize("argv", [["demo"], ["plan", "-M", "1", "-H", "1"], ["simulate"]])
def test_help_shows_every_default(argv, capsys) -> None:
    defaults = vars(build_parser().parse_args(argv))
    with pytest.raises(SystemExit):
        main([argv[0], "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for dest, value in defaults.items():
        if dest in ("command", "func", "clients", "headroom") or value is None or value is False:
            continue
        assert f"(default: {value}" in text, dest


def test_tiny_eps_is_a_clear_error_not_a_traceback(capsys) -> None:
    assert main(["plan", "-M", "50000", "-H", "2000", "--eps", "1e-17"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("admitgate plan: invalid --eps: must be in [1e-12, 1)") and "Traceback" not in err
    assert main(["plan", "-M", "50000", "-H", "2000", "--eps", "1e-12"]) == 0


def test_no_requests_remaining_is_infeasible_with_its_reason(capsys) -> None:
    assert main(["plan", "-M", "100", "-H", "10", "--remaining", "0", "--reset", "10"]) == 1
    out = capsys.readouterr().out
    assert "INFEASIBLE: rate-limit allows no finite window: no requests remaining in the rate limit" in out
    assert "wait for the rate limit to reset (in 10 s)" in out and "W = inf" not in out


def test_plan_json_is_strict_json(capsys) -> None:
    assert main(["plan", "-M", "100", "-H", "10", "--remaining", "0", "--reset", "10", "--json"]) == 1
    doc = strict_json(capsys.readouterr().out)["plan"]
    assert doc["feasible"] is False and doc["lower"] is None and doc["upper"] is None
    assert [b["seconds"] for b in doc["bounds"] if b["name"] == "rate-limit"] == [None]
    assert main(["plan", "-M", "100", "-H", "10", "--json"]) == 0  # no upper bound: upper is null, not Infinity
    assert strict_json(capsys.readouterr().out)["plan"]["upper"] is None


def test_simulate_rejects_negative_edge_cpu(capsys) -> None:
    assert main(["simulate", "--edge-cpu", "-1", "--gate-only"]) == 2
    assert "invalid --edge-cpu: must be a finite number >= 0" in capsys.readouterr().err


def test_simulate_says_when_it_hit_its_time_limit(tmp_path, capsys) -> None:
    path = tmp_path / "short.toml"
    path.write_text('base = "cache-expiry"\nclients = 500\nduration = 4.0\n')  # the herd needs > 2.5 s after 3 s
    assert main(["simulate", str(path), "--gate-only"]) == 0
    out = capsys.readouterr().out
    assert "had not finished when the run stopped at its time limit of 4 simulated seconds" in out
    assert main(["simulate", str(path), "--gate-only", "--json"]) == 0
    (run,) = strict_json(capsys.readouterr().out)
    assert run["finished"] < run["clients"] and run["drain_s"] is None and run["drain_ratio"] is None


def test_a_run_that_finishes_says_nothing_about_a_limit(capsys) -> None:
    assert main(["simulate", "--clients", "200", "--gate-only"]) == 0
    assert "time limit" not in capsys.readouterr().out


def test_progress_line_shows_the_total_and_ends_with_a_newline(capsys) -> None:
    with stderr_progress(300.0) as report:
        report(12.5)
        report(40.0)
    assert capsys.readouterr().err == "\r  simulated     12.5 of at most 300 s\r  simulated     40.0 of at most 300 s\n"
    with stderr_progress(300.0):
        pass
    assert capsys.readouterr().err == ""  # a short run shows no line, so ends none
