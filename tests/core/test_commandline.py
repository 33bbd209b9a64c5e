"""The command line as a whole (commandline.py, cli.py): token lengths with K = 1024 on every
flag that takes one, --help that says each thing once and truly, and the file system's errors
as one readable line."""

import argparse
import re

import pytest

from memagent_jax.cli import build_parser, main
from memagent_jax.commandline import seed, tokens

GENERATE = ["generate", "--model", "m", "--input", "i", "--out", "o"]
RUN = ["run", "--model", "m", "--doc", "d", "--question", "q"]


def test_token_counts_take_k_and_m_as_the_eval_columns_count():
    assert [tokens(t) for t in ("8192", "8K", "8k", "1M", "1.5K")] == [8192, 8192, 8192,
                                                                      1 << 20, 1536]
    for bad in ("many", "2.5", "1.0001K", "infK", "8X", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="expected a number of tokens"):
            tokens(bad)


@pytest.mark.parametrize("argv, flag", [
    (GENERATE, "--max-new-tokens"), (GENERATE, "--max-len"),
    (RUN, "--chunk-tokens"), (RUN, "--max-memory-tokens"), (RUN, "--max-final-tokens"),
    (["serve", "--model", "m"], "--max-len"),
    (["demo"], "--length"), (["demo"], "--chunk-tokens"), (["demo"], "--max-memory-tokens"),
    (["demo"], "--max-final-tokens"), (["trace"], "--length"),
    (["data", "synthetic", "--task", "multikey", "--out", "o"], "--lengths"),
    (["data", "ruler", "--tasks", "vt", "--tokenizer", "t", "--out", "o"], "--lengths"),
])
def test_every_flag_that_takes_tokens_reads_k_as_1024(argv, flag):
    args = build_parser().parse_args([*argv, flag, "2K"])
    assert getattr(args, flag[2:].replace("-", "_")) in (2048, [2048])


def test_a_length_that_is_no_number_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--length", "many"])
    assert exit_.value.code == 2
    assert ("argument --length: expected a number of tokens such as 8192, 8K or 1M "
            "(K = 1024), got 'many'") in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["demo"], RUN, GENERATE, ["random-model", "--out"],
                                  ["trace"], ["data", "lookup", "--out"]])
def test_a_negative_seed_is_refused_by_the_parser(argv, capsys, tmp_path):
    """(`demo --seed -1` and `run --seed -5` ran.) Every --seed flag."""
    out = [str(tmp_path / "out")] if argv[-1] == "--out" else []  # where, run, it writes
    with pytest.raises(SystemExit) as exit_:
        main([*argv, *out, "--seed", "-1"])
    assert exit_.value.code == 2
    assert "argument --seed: expected a seed, an integer >= 0, got '-1'" in (
        capsys.readouterr().err)


def test_every_seed_flag_takes_seeds_only():
    flags = [(names, action.type) for names, sub in _commands(build_parser())
             for action in sub._actions if "--seed" in action.option_strings]
    assert len(flags) == 11 and all(kind is seed for _, kind in flags), flags


@pytest.mark.parametrize("argv, named", [
    ([*GENERATE[:-2], "--out", "a.jsonl", "--output", "b.jsonl"], "--out a.jsonl, then --output "
                                                                  "b.jsonl"),
    ([*GENERATE[:-2], "--output", "a.jsonl", "--out", "a.jsonl", "--out", "b.jsonl"],
     "--output a.jsonl, then --out b.jsonl"),
    (["convert", "--hf", "a", "--model", "b", "--out", "o"], "--hf a, then --model b")])
def test_one_flag_given_under_two_names_with_two_values_is_refused(argv, named, capsys):
    """argparse keeps the last value silently: `generate --out a --output b` wrote b only."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert f"given twice with two values ({named}): give it once" in capsys.readouterr().err


def test_a_flag_given_again_under_its_name_keeps_argparses_last_one_wins():
    """(A script's defaults, then the user's.) And one value under two names is one."""
    args = build_parser().parse_args([*GENERATE, "--output", "o", "--slots", "4", "--slots",
                                      "2"])
    assert (args.out, args.slots) == ("o", 2) and "_options_given" not in vars(args)


def _commands(parser, names=()):
    """(names, parser) of every subcommand, nested ones too (`data synthetic`)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*names, name), sub
                yield from _commands(sub, (*names, name))


def test_help_says_each_default_once():
    for names, parser in _commands(build_parser()):
        text = " ".join(parser.format_help().split())
        assert not re.search(r"\(default: [^()]*\) \(default:", text), names


def test_the_tokenizer_flag_mentions_url_only_where_there_is_one():
    helps = {names[0]: " ".join(parser.format_help().split())
             for names, parser in _commands(build_parser()) if len(names) == 1}
    assert "tokenizer directory (default: the model's)" in helps["generate"]
    assert "--url" not in helps["generate"] and "--url" not in helps["serve"]
    assert "with --url, the one that chunks the document" in helps["run"]


def test_the_data_entry_of_help_names_every_kind():
    commands = dict(_commands(build_parser()))
    (group,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    data_help = next(a.help for a in group._choices_actions if a.dest == "data")
    kinds = [names[1] for names in commands if len(names) == 2 and names[0] == "data"]
    assert len(kinds) == 6 and all(kind in data_help for kind in kinds), data_help


def test_a_file_system_error_is_one_line_naming_the_path(monkeypatch, capsys, tmp_path):
    def refused(*args, **kwargs):
        raise NotADirectoryError(20, "Not a directory", "sets/eval_1.json")
    monkeypatch.setattr("memagent_jax.data.needle.write_task", refused)
    assert main(["data", "needle", "--out", str(tmp_path / "new")]) == 2
    assert capsys.readouterr().err == "memagent-jax: error: sets/eval_1.json: Not a directory\n"
