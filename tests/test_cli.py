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


def test_the_librarys_progress_notes_are_one_line_each_on_stderr(monkeypatch, capsys):
    import logging

    def note(args):
        logging.getLogger("frspec.decode.cost_measure").info("measuring this machine's step costs (%s)", "once")
        logging.getLogger("frspec.decode.cost_measure").debug("not shown")

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    sub.add_parser("note").set_defaults(func=note)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert cli.main(["note"]) == 0
    assert cli.main(["note"]) == 0  # a second run in the process adds no second handler
    captured = capsys.readouterr()
    assert captured.err == "frspec: measuring this machine's step costs (once)\n" * 2 and captured.out == ""


def test_no_progress_hides_the_bars_of_the_libraries_frspec_calls(tmp_path, monkeypatch, capfd):
    """`--no-progress` reaches transformers' weight-loading bar too (frspec.progress), not only frspec's own."""
    import transformers
    from transformers.utils import logging as hf_logging

    import frspec.progress

    config = transformers.Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1)
    transformers.Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    monkeypatch.setattr(frspec.progress, "_shown", True)
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    hf_logging.enable_progress_bar()
    transformers.Qwen2ForCausalLM.from_pretrained(tmp_path)
    assert "Loading weights" in capfd.readouterr().err  # the bar this test is about, drawn by default

    def hide(args):
        transformers.Qwen2ForCausalLM.from_pretrained(tmp_path)
        return 0

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    p = sub.add_parser("load")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=hide)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    try:
        assert cli.main(["load", "--no-progress"]) == 0
        assert "Loading weights" not in capfd.readouterr().err
        assert not frspec.progress.progress_shown()
    finally:
        hf_logging.enable_progress_bar()
