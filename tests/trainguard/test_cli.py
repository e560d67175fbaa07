"""The command-line convention every tool shares (trainguard.cli): strict, two spellings, one-line cloud errors."""

import pytest

from trainguard.cli import (
    StrictArgumentParser,
    canonical_argv,
    cloud_failure,
    comma_separated,
    comma_separated_ints,
    missing_credentials,
    nearest_option,
)


def parser():
    p = StrictArgumentParser(prog="tool")
    p.add_argument("--alerts_file", default="alerts.jsonl", help="where alerts go")
    p.add_argument("--out_dir", "--out", default="out", help="a directory")
    p.add_argument("--quiet", action="store_true")
    return p


def test_a_dashed_spelling_is_the_underscore_option():
    assert parser().parse_args(["--alerts-file=x.jsonl"]).alerts_file == "x.jsonl"
    assert parser().parse_args(["--alerts-file", "y.jsonl"]).alerts_file == "y.jsonl"


def test_an_old_name_kept_as_an_alias_still_works():
    assert parser().parse_args(["--out", "d"]).out_dir == "d"


def test_arguments_after_a_double_dash_are_left_alone():
    assert canonical_argv(["--alerts-file=a", "--", "--alerts-file=b"], ["--alerts_file"]) == [
        "--alerts_file=a", "--", "--alerts-file=b"]


def test_an_unknown_option_exits_2_naming_it_and_the_nearest_known_one(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parser().parse_args(["--alerts_fle=x"])
    assert exit_info.value.code == 2
    assert "unknown option --alerts_fle (did you mean --alerts_file?)" in capsys.readouterr().err


def test_a_misspelled_required_option_is_named_with_its_nearest_not_reported_missing(capsys):
    p = parser()
    p.add_argument("--logdir", required=True)
    commands = p.add_subparsers(dest="command")
    commands.add_parser("mute").add_argument("--until", required=True)
    for argv, hint in ((["--log_dir", "x"], "--log_dir (did you mean --logdir?)"),
                       (["--logdir", "x", "mute", "--untl", "3"], "--untl (did you mean --until?)")):
        with pytest.raises(SystemExit) as exit_info:
            p.parse_args(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and f"unknown option {hint}" in err and "required" not in err
    assert p.parse_args(["--logdir", "x", "mute", "--until", "3"]).until == "3"


def test_an_abbreviation_is_not_taken_for_an_option(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--alerts=x"])
    assert "unknown option --alerts" in capsys.readouterr().err


def test_an_option_far_from_every_known_one_gets_no_guess():
    assert nearest_option("--zzz", ["--alerts_file", "--out_dir"]) is None


def test_help_shows_the_defaults_and_the_underscore_spelling():
    text = parser().format_help()
    assert "(default: alerts.jsonl)" in text and "--alerts_file" in text and "--alerts-file" not in text


def test_help_gives_no_default_for_a_flag():
    p = parser()
    p.add_argument("--no_progress", dest="progress", action="store_false", help="never show progress")
    text = " ".join(p.format_help().split())
    assert "--no_progress never show progress" in text and "default: True" not in text


def test_comma_separated_options_strip_their_parts_and_a_bad_integer_exits_2_naming_the_option(capsys):
    assert comma_separated(" test, metric,,") == ["test", "metric"]
    p = parser()
    p.add_argument("--seeds", type=comma_separated_ints, default="1,2")
    assert p.parse_args([]).seeds == [1, 2] and p.parse_args(["--seeds", "3, 4"]).seeds == [3, 4]
    with pytest.raises(SystemExit) as exit_info:
        p.parse_args(["--seeds", "1,x"])
    assert exit_info.value.code == 2 and "--seeds" in capsys.readouterr().err


class DefaultCredentialsError(Exception):
    """Named as google.auth's: cloud_failure recognises errors by class name."""


def test_missing_credentials_are_one_line_even_when_wrapped():
    try:
        try:
            raise DefaultCredentialsError("Your default credentials were not found.\nSee https://...")
        except DefaultCredentialsError as e:
            raise RuntimeError("while starting") from e
    except RuntimeError as wrapped:
        line = cloud_failure(wrapped)
    assert line.startswith("no Google Cloud credentials") and "\n" not in line
    assert missing_credentials(DefaultCredentialsError())


def test_an_unreachable_endpoint_is_one_line_and_other_errors_are_not_cloud_failures():
    assert cloud_failure(ConnectionRefusedError(111, "Connection refused")).startswith("cannot reach the endpoint")
    assert cloud_failure(KeyError("x")) is None
