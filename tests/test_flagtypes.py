"""byte_size's bounds on a size's exponent: a number too small or too large is refused from its exponent at once, and
one too large says so, naming the bound, through both CLIs' size flags; a size other than 0 that comes to less than
one byte is refused, not taken as 0 (no bound, no cache). Every number flag type refuses digits other than ASCII's
and underscores, on the command line and in a config file."""

from __future__ import annotations

import argparse
import decimal
import re

import pytest

from ps import flagtypes
from ps.cli_server_flags import bound_bytes, build_parser, parse_bytes, seconds
from ps.flagtypes import SIZE_DIGITS, byte_size, size_flag
from worker.cli_train_config import hidden_widths
from worker.cli_train_flags import _size


class _Unworked(decimal.Decimal):
    """A number whose bytes must not be worked out: its as_integer_ratio (10**N for the exponent N) raises."""

    def as_integer_ratio(self) -> tuple[int, int]:
        raise AssertionError(f"the bytes of {self} were worked out")


def _forbid_working_out(monkeypatch) -> None:
    """byte_size's numbers (flagtypes.exact_number's) made _Unworked: a size whose bytes it works out fails."""
    exact = flagtypes.exact_number
    monkeypatch.setattr(flagtypes, "exact_number", lambda text: None if (v := exact(text)) is None else _Unworked(v))


@pytest.fixture
def unworked(monkeypatch):
    _forbid_working_out(monkeypatch)


def test_unworked_catches_a_size_whose_bytes_are_worked_out(unworked):
    with pytest.raises(AssertionError, match="the bytes of 0.00001 were worked out"):
        byte_size("1e-5K")


@pytest.mark.parametrize("text", ["1e-10000000", "1e-100000000K", "-1e-100000000G", "1e-100", "5e-101K"])
def test_a_size_with_a_tiny_exponent_is_refused_before_its_bytes_are_worked_out(text, unworked):
    """Working out the bytes of 1e-10000000 computes 10**10000000 (seconds; 1e-100000000K far longer); the exponent
    refuses it first."""
    with pytest.raises(ValueError, match="^expected a whole number of bytes or a size such as 512M") as refused:
        byte_size(text)
    assert "too large" not in str(refused.value)


@pytest.mark.parametrize(("text", "size"), [("0e-100000000", 0), ("0.0K", 0), ("0e100000000G", 0), ("-0", 0)])
def test_a_size_at_the_small_bound_or_zero_of_any_exponent_is_taken(text, size):
    assert byte_size(text) == size


@pytest.mark.parametrize("text", ["1e300", "1e100", "1e100000000", "1e99T", "9765625e90K"])
def test_a_size_of_1e100_bytes_or_more_is_refused_as_too_large_naming_the_bound(text):
    """9765625e90K is exactly 1e100 bytes (9765625 * 1024 = 10**10): the bound is on bytes, units included."""
    with pytest.raises(ValueError) as refused:
        byte_size(text)
    assert str(refused.value) == f"size too large: {text!r} (sizes are below 1e{SIZE_DIGITS} bytes)"
    with pytest.raises(argparse.ArgumentTypeError) as server:
        parse_bytes(text)
    assert str(server.value) == str(refused.value)  # not "expected a whole number of bytes"
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected bytes from 0 to 1024T \(.*\), got '"):
        _size(text)


def test_the_largest_size_taken_is_one_byte_below_the_bound():
    assert byte_size("9" * SIZE_DIGITS) == 10**SIZE_DIGITS - 1
    assert byte_size("9765624.999e90K") == 10**SIZE_DIGITS - 1024 * 10**87


@pytest.mark.parametrize("text", ["1e-99K", "0.0001K", "1e-99G", "0.5e-3K", "1e-13T"])
def test_a_size_other_than_0_that_comes_to_less_than_one_byte_is_refused_not_taken_as_0(text, capsys):
    """--reply-bytes 0.0001K would be 0 once the fraction of a byte is dropped: no bound at all, the opposite of what
    was asked (and --row-cache-bytes no cache). 1e-99K passes the exponent's bound (not "not a size") and is refused
    for its bytes."""
    with pytest.raises(ValueError) as refused:
        byte_size(text)
    expected = f"size below one byte: {text!r} (a size other than 0 comes to 1 byte or more; 0 is written 0)"
    assert str(refused.value) == expected
    for parse in (parse_bytes, bound_bytes, _size):
        with pytest.raises(argparse.ArgumentTypeError) as flag:
            parse(text)
        assert str(flag.value) == expected
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--data-dir", "d", f"--reply-bytes={text}"])
    assert f"--reply-bytes: {expected}" in capsys.readouterr().err
    assert bound_bytes("0") == _size("0") == 0 and bound_bytes("0.001K") == 1  # 0 itself, and a byte, are taken


@pytest.mark.parametrize(
    ("text", "worked_out"),
    [("-5", True), ("-1e200", False), ("-1e100000000", False), ("-1e99T", True), ("-9765625e90K", True),
     ("-0.0001K", True)],
)  # fmt: skip
def test_a_negative_size_of_any_magnitude_is_refused_by_byte_size_with_each_flags_range(text, worked_out, monkeypatch):
    """A negative size is no size too large and no size below one byte: byte_size refuses it by its sign
    (-1e100000000 without working out its bytes), naming the range of the flag asked."""
    if not worked_out:  # a number of 1e100 or more: refused by its sign alone
        _forbid_working_out(monkeypatch)
    with pytest.raises(ValueError, match=r"^expected a size of at least 0 bytes, such as 512M or 2G, got '-"):
        byte_size(text)
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected a size of at least 1 byte, such as 512M"):
        parse_bytes(text)
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected bytes from 0 to 1024T \(.*\), got '-"):
        _size(text)


@pytest.mark.parametrize(
    ("least", "most", "text", "said"),
    [(0, 100, "101", "expected bytes from 0 to 100, got '101'"), (5, 100, "4", "expected bytes from 5 to 100, got '4'"),
     (5, 2048, "3K", "expected bytes from 5 to 2K, got '3K'"), (2, SIZE_DIGITS, "1", "expected bytes from 2 to 100, got '1'"),
     (1, 10**SIZE_DIGITS - 1, "0", "expected a size of at least 1 byte, such as 512M or 2G, got '0'")],
)  # fmt: skip
def test_size_flag_refuses_a_size_outside_its_range_and_takes_its_ends(least, most, text, said):
    """One type for both CLIs' size flags: its ends are taken, a size past either is refused naming the range."""
    parse = size_flag(least, most, "2K" if most == 2048 else "")
    assert (parse(str(least)), parse(str(most))) == (least, most)
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse(text)
    assert str(refused.value) == said


@pytest.mark.parametrize(("least", "most"), [(-1, 5), (6, 5), (0, 10**SIZE_DIGITS)])
def test_size_flag_refuses_a_range_no_size_fits(least, most):
    with pytest.raises(ValueError, match=r"expected 0 <= least <= most <= LARGEST_SIZE"):
        size_flag(least, most)


NOT_ASCII_DIGITS = ["١٠٠", "１００", "1_0_0", "1_0K", "٣G", "1e1_0", "0x_1"]  # Arabic-Indic, fullwidth, separators


@pytest.mark.parametrize("text", NOT_ASCII_DIGITS)
def test_every_number_flag_type_refuses_other_digits_and_underscores_naming_the_text(text):
    """Python's int(), float() and Decimal() read "١٠٠" and "1_0_0" as 100: each flag type refuses them, saying so."""
    types = {"size_flag": size_flag(0), "integer": flagtypes.integer(0), "plain_int": flagtypes.plain_int,
             "whole_number": flagtypes.whole_number(0, 10**12), "number": flagtypes.number(0), "seconds": seconds,
             "parse_bytes": parse_bytes, "bound_bytes": bound_bytes, "--row-cache-bytes": _size}  # fmt: skip
    for name, parse in types.items():
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            parse(text)
        assert str(refused.value).endswith(f"got {text!r} (digits 0-9, no '_')"), (name, str(refused.value))
    assert flagtypes.exact_number(text) is None
    with pytest.raises(ValueError, match=re.escape(f"--hidden '64,{text}': expected comma-separated integers")):
        hidden_widths(f"64,{text}", "dnn")


@pytest.mark.parametrize(
    ("argv", "flag"),
    [(["--data-dir", "d", "--cache-bytes", "١٠٠M"], "--cache-bytes"), (["--data-dir", "d", "--port", "5_000"], "--port"),
     (["--data-dir", "d", "--flush-interval-s", "１"], "--flush-interval-s")],
)  # fmt: skip
def test_a_server_flag_of_other_digits_is_refused_naming_the_flag_and_text(argv, flag, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert f"argument {flag}: expected " in (err := capsys.readouterr().err) and f"got {argv[-1]!r} (digits" in err, err


def test_worker_and_launch_flags_and_toml_values_of_other_digits_are_refused_naming_the_flag_and_text(tmp_path, capsys):
    from ps.settings import apply_defaults
    from worker.__main__ import build_parser as worker_parser

    for argv, flag in [(["train", "--batch-size", "1_024"], "--batch-size"),
                       (["launch", "--workers", "٢"], "--workers"), (["launch", "--workers", "2", "--local-shards",
                        "1_0"], "--local-shards"), (["launch", "--workers", "2", "--barrier-timeout", "6_0"],
                       "--barrier-timeout")]:  # fmt: skip
        with pytest.raises(SystemExit):
            worker_parser().parse_args(argv)
        assert f"argument {flag}: expected " in (err := capsys.readouterr().err), err
        assert f"got {argv[-1]!r} (digits 0-9, no '_')" in err, err
    config = tmp_path / "c.toml"
    config.write_text('[server]\ncache_bytes = "1_0_0M"\n')
    said = f"config file {config} [server] 'cache_bytes' (for --cache-bytes): expected a whole number of bytes"
    with pytest.raises(ValueError, match=re.escape(said) + r".* got '1_0_0M' \(digits 0-9, no '_'\)"):
        apply_defaults(build_parser(), ["--data-dir", "d", "--config", str(config)], {}, section="server")
    config.write_text("[server]\ncache_bytes = 1_000_000\n")  # a TOML integer: its underscores are TOML's own
    apply_defaults(parser := build_parser(), argv := ["--data-dir", "d", "--config", str(config)], {}, section="server")
    assert parser.parse_args(argv).cache_bytes == 1_000_000
