import pytest

from admitgate.cli import build_parser, main


def test_demo_arguments_parse() -> None:
    args = build_parser().parse_args(["demo", "--herd", "10", "--gate", "none", "--spread", "jitter"])
    assert (args.herd, args.gate, args.spread) == (10, "none", "jitter")


def test_unknown_command_exits_2(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2
