import pytest

from frspec import cli
from frspec.errors import FrspecError


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    assert "frspec" in capsys.readouterr().out


def test_frspec_error_is_one_line_and_exit_2(monkeypatch, capsys):
    def boom(args):
        raise FrspecError("the map is for another vocabulary")

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    p = sub.add_parser("boom")
    p.set_defaults(func=boom)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert cli.main(["boom"]) == 2
    err = capsys.readouterr().err
    assert err == "frspec: error: the map is for another vocabulary\n"


def test_every_dtype_choice_parses():
    from frspec.commands.options import DTYPE_CHOICES
    from frspec.models.loading import parse_dtype

    assert DTYPE_CHOICES[0] == "auto" and parse_dtype("auto") is None
    assert all(parse_dtype(name) is not None for name in DTYPE_CHOICES[1:])
