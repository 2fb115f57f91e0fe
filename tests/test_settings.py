"""Every flag from the command line, a PS_* environment variable or a TOML file, in that order of precedence
(ps/settings.py); bad values and unknown keys are errors that name their source."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from ps.cli_server_flags import build_parser as server_parser
from ps.config import check_hyperparameter
from ps.errors import InvalidArgumentError
from ps.settings import apply_defaults, settings_table
from worker.__main__ import build_parser as worker_parser


def parse(parser, argv, environ):
    apply_defaults(parser, argv, environ)
    return parser.parse_args(argv)


def test_command_line_beats_environment_beats_file_section_beats_file_top_level_beats_default(tmp_path):
    cfg = tmp_path / "ps.toml"
    cfg.write_text('model = "lr"\nbatch_size = 100\nlearning_rate = 0.5\n\n[train]\nbatch_size = 200\n'
                   'hidden = "16,8"\ndrop_columns = ["a", "b"]\n')  # fmt: skip
    argv = ["train", "--config", str(cfg), "--learning-rate", "0.3"]
    env = {"PS_MODEL": "deepfm", "PS_LEARNING_RATE": "0.9"}
    args = parse(worker_parser(), argv, env)
    assert args.learning_rate == 0.3  # command line
    assert args.model == "deepfm"  # environment over the file
    assert args.batch_size == 200  # the [train] section over the top level
    assert args.hidden == "16,8" and args.drop_columns == "a,b"  # a TOML array for a comma-separated flag
    assert args.epochs is None  # default: the recipe's
    assert parse(worker_parser(), ["train"], {"PS_CONFIG": str(cfg)}).model == "lr"  # the file named by PS_CONFIG


def test_server_settings_from_the_environment_are_typed_and_satisfy_required_flags(tmp_path):
    env = {"PS_DATA_DIR": str(tmp_path), "PS_CACHE_BYTES": "1G", "PS_SYNC": "true", "PS_PORT": "5001",
           "PS_LOG_LEVEL": "DEBUG"}  # fmt: skip
    args = parse(server_parser(), [], env)
    assert (args.data_dir, args.cache_bytes, args.sync, args.port, args.log_level) == (
        str(tmp_path),
        1 << 30,
        True,
        5001,
        "DEBUG",
    )
    assert parse(server_parser(), ["--port", "7"], env).port == 7
    flags = {row[0]: row[1] for row in settings_table(server_parser())}
    assert flags["--cache-bytes"] == "PS_CACHE_BYTES" and flags["--auth-token-file"] == "PS_AUTH_TOKEN_FILE"


@pytest.mark.parametrize("env, toml, message", [
    ({"PS_PORT": "http"}, "", r"environment variable PS_PORT \(for --port\): expected an integer, got .http."),
    ({"PS_CACHE_BYTES": "lots"}, "", r"PS_CACHE_BYTES \(for --cache-bytes\): expected a whole number of bytes or a size"),
    ({"PS_SYNC": "maybe"}, "", r"PS_SYNC \(for --sync\): expected true or false"),
    ({"PS_LOG_LEVEL": "LOUD"}, "", "'LOUD' is not one of"),
    ({}, "cache_bytes = 12\nwarp_speed = 9\n", "'warp_speed' is not a setting of this command"),
    ({}, "port = [", "not valid TOML"),
    ({}, '[Server]\nsync = true\nauth_token_file = "t"\n', r"section \[Server\] is not one of ps-server's or ps-worker's"),
    ({}, "[serve]\nsync = true\n", r"section \[serve\] is not one of"),
    ({}, 'tls_cert = ["a.pem", "b.pem"]\n', r"top level 'tls_cert' \(for --tls-cert\): expected one value, got an array"),
    ({}, 'cache_bytes = "1G"\ncache-bytes = "2G"\n',
     r"top level: 'cache_bytes' and 'cache-bytes' are one setting \(--cache-bytes\): give it once"),
])  # fmt: skip
def test_bad_values_and_unknown_keys_name_their_source(tmp_path, env, toml, message):
    argv = ["--data-dir", str(tmp_path)]
    if toml:
        (tmp_path / "c.toml").write_text(toml)
        argv += ["--config", str(tmp_path / "c.toml")]
    with pytest.raises(ValueError, match=message):
        apply_defaults(server_parser(), argv, env)


@pytest.mark.parametrize("toml, message", [
    ('data_dir = ["a", "b"]', r"\[server\] 'data_dir' \(for --data-dir\): expected one value, got an array"),
    ('host = { name = "x" }', r"\[server\] 'host' \(for --host\): expected one value, got a table"),
    ("cluster = true", r"\[server\] 'cluster' \(for --cluster\): expected a value, got true/false \(true\): --cluster is no"),
    ("port = false", r"\[server\] 'port' \(for --port\): expected a value, got true/false \(false\)"),
    ('sync = true\nsync-x = 1', "'sync-x' is not a setting"),
    ('port = 1\nport = 2', "not valid TOML"),  # TOML itself refuses a key given twice
    ('flush_interval_s = 5\nflush-interval-s = 9', r"\[server\]: 'flush_interval_s' and 'flush-interval-s' are one"),
])  # fmt: skip
def test_a_server_section_value_that_is_no_single_value_or_is_given_twice_is_refused(tmp_path, toml, message):
    (tmp_path / "c.toml").write_text(f"[server]\n{toml}\n")
    with pytest.raises(ValueError, match=message):
        apply_defaults(server_parser(), ["--config", str(tmp_path / "c.toml")], {}, section="server")


@pytest.mark.parametrize("env, toml, message", [
    ({"PS_EPOCHS": "abc"}, "", r"environment variable PS_EPOCHS \(for --epochs\): expected an integer, got 'abc'"),
    ({"PS_BATCH_SIZE": "-3"}, "", r"PS_BATCH_SIZE \(for --batch-size\): expected an integer >= 1, got -3"),
    ({"PS_LEARNING_RATE": "-1"}, "", r"PS_LEARNING_RATE \(for --learning-rate\): a learning rate must be finite, >= 1e-30 and <= 1e\+30, got -1.0"),
    ({}, "[train]\nbatch_size = 0\n", r"c.toml \[train\] 'batch_size' \(for --batch-size\): expected an integer >= 1"),
    ({}, "dropout = 2.0\n", r"c.toml top level 'dropout' \(for --dropout\): expected a number >= 0 and <= 0.95"),
])  # fmt: skip
def test_bad_worker_values_name_their_source(tmp_path, env, toml, message):
    argv = ["train"]
    if toml:
        (tmp_path / "c.toml").write_text(toml)
        argv += ["--config", str(tmp_path / "c.toml")]
    with pytest.raises(ValueError, match=message):
        apply_defaults(worker_parser(), argv, env)


def test_a_config_file_may_hold_the_section_of_every_command_of_both_clis(tmp_path):
    """One file for a cluster: [server] and each ps-worker command's section, each read by its command only."""
    from ps.settings import CONFIG_SECTIONS

    commands = set(worker_parser()._subparsers._group_actions[0].choices)
    assert {"server", *commands} == set(CONFIG_SECTIONS)
    (tmp_path / "c.toml").write_text(
        "".join(f"[{c}]\n" + ("sync = true\n" if c == "server" else "") for c in CONFIG_SECTIONS)
    )
    parser = server_parser()
    apply_defaults(parser, ["--data-dir", str(tmp_path), "--config", str(tmp_path / "c.toml")], {}, section="server")
    assert parser.parse_args(["--data-dir", str(tmp_path)]).sync is True


WHOLE_CONFIG_REFUSAL = (
    ": give the config file's path, or leave the flag out (an empty path is not taken as the "
    "flag left out, which would drop the file's settings without a word)"
)  # ps.emptyflags' words


@pytest.mark.parametrize("argv, env, said", [
    (["--config", ""], {}, "--config is empty ('')"),
    (["--config=  "], {}, "--config is empty ('  ')"),
    ([], {"PS_CONFIG": ""}, "environment variable PS_CONFIG is empty ('')"),
])  # fmt: skip
def test_an_empty_config_path_is_refused_not_taken_as_no_file(tmp_path, argv, env, said):
    """`--config "$CONFIG"` with CONFIG unset: read as no file, it would drop the file's TLS and token settings,
    and a server on 0.0.0.0 would serve in the clear without a word."""
    for parser, command in ((server_parser(), ["--data-dir", str(tmp_path)]), (worker_parser(), ["stats"])):
        with pytest.raises(ValueError, match=re.escape(said + WHOLE_CONFIG_REFUSAL)):
            apply_defaults(parser, command + argv, env, section="server" if command[0] != "stats" else None)
    r = subprocess.run([sys.executable, "-m", "ps", "--data-dir", str(tmp_path / "d"), *argv], stdin=subprocess.DEVNULL,
                       env={**env, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and f"ps-server: error: {said}" in r.stderr, r.stderr
    assert not (tmp_path / "d").exists()
    file = tmp_path / "c.toml"
    file.write_text("sync = true\n")  # --config given beside an empty PS_CONFIG: the flag names the file
    assert parse(server_parser(), ["--data-dir", "x", "--config", str(file)], {"PS_CONFIG": ""}).sync is True


def test_a_config_flag_given_twice_reads_the_last_file_as_argparse_keeps_the_last(tmp_path):
    """--config a.toml --config b.toml: args.config is b.toml (what the worker checks its outputs against), and
    b.toml's settings are the ones read, as for any flag given twice; never a.toml's beside b.toml's name."""
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    first.write_text('sync = true\ncache_bytes = "1G"\n')
    second.write_text('cache_bytes = "3G"\n')
    for argv in (["--config", str(first), "--config", str(second)], [f"--config={first}", f"--config={second}"],
                 ["--config", str(first), f"--config={second}"]):  # fmt: skip
        args = parse(server_parser(), ["--data-dir", "x", *argv], {"PS_CONFIG": str(first)})
        assert (args.config, args.cache_bytes, args.sync) == (str(second), 3 << 30, False), argv
    (tmp_path / "w.toml").write_text('[stats]\nservers = "h:1"\n')
    args = parse(
        worker_parser(), ["stats", "--config", str(tmp_path / "no.toml"), "--config", str(tmp_path / "w.toml")], {}
    )
    assert (args.config, args.servers) == (str(tmp_path / "w.toml"), "h:1")  # the first, never read, need not exist


def test_a_bad_worker_value_on_the_command_line_names_its_flag(capsys):
    with pytest.raises(SystemExit) as stopped:
        parse(worker_parser(), ["train", "--learning-rate", "-1"], {})
    assert stopped.value.code == 2
    assert (
        "argument --learning-rate: a learning rate must be finite, >= 1e-30 and <= 1e+30, got -1.0"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize("flag", ["--learning-rate", "--dense-learning-rate"])
@pytest.mark.parametrize("given", ["1e-320", "1e-31", "1e-35", "-1e-320", "inf", "2e30"])
def test_a_learning_rate_the_tables_refuse_is_refused_at_its_flag_and_in_a_train_config(capsys, flag, given):
    """A learning rate below 1e-30 (ps.config.MIN_POSITIVE_HYPERPARAMETER: 1e-35, a normal float32, as well as
    1e-320, 0 in float32) or above 1e30 is refused by the flag and by TrainConfig.validate in the words of the
    tables' check (ps.config.check_hyperparameter), naming the flag; 1e-30 passes both."""
    import dataclasses

    from worker.train_config import TrainConfig

    with pytest.raises(SystemExit) as stopped:
        parse(worker_parser(), ["train", f"{flag}={given}"], {})
    assert stopped.value.code == 2
    bounds = f"must be finite, >= 1e-30 and <= 1e+30, got {float(given)!r}"
    assert f"argument {flag}: a learning rate {bounds}\n" in capsys.readouterr().err
    field = flag.lstrip("-").replace("-", "_")
    with pytest.raises(ValueError) as refused:
        dataclasses.replace(TrainConfig(local_shards=1), **{field: float(given)}).validate()
    assert str(refused.value) == f"{flag} {bounds}"
    with pytest.raises(InvalidArgumentError) as tables:
        check_hyperparameter(flag, float(given), low_inclusive=False)
    assert str(tables.value) == str(refused.value)
    assert getattr(parse(worker_parser(), ["train", flag, "1e-30"], {}), field) == 1e-30
    dataclasses.replace(TrainConfig(local_shards=1), **{field: 1e-30}).validate()


def test_log_level_goes_before_or_after_the_command_and_the_command_line_beats_the_environment():
    environ = {"PS_LOG_LEVEL": "INFO"}
    out = "--out=/nonexistent/x.csv"
    assert parse(worker_parser(), ["--log-level", "DEBUG", "synth", out], environ).log_level == "DEBUG"
    assert parse(worker_parser(), ["synth", "--log-level", "ERROR", out], environ).log_level == "ERROR"
    assert parse(worker_parser(), ["synth", out], environ).log_level == "INFO"
    assert parse(worker_parser(), ["synth", out], {}).log_level == "WARNING"


def test_an_unknown_flag_gets_the_usage_of_its_command():
    r = subprocess.run([sys.executable, "-m", "worker", "train", "--epochz", "3"], capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    assert r.returncode == 2
    assert (
        "usage: ps-worker train" in r.stderr
        and "ps-worker train: error: unrecognized arguments: --epochz 3" in r.stderr
    )
    r = subprocess.run([sys.executable, "-m", "worker", "--bogus", "train"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "ps-worker: error: unrecognized arguments: --bogus" in r.stderr  # before the command


@pytest.mark.parametrize("cli, argv, said", [
    ("ps", ["--port", "0", "--data-dr", "x"], "ps-server: error: unrecognized arguments: --data-dr x (--data-dr: did "
                                              "you mean --data-dir?)"),
    ("ps", ["export", "ckpt", "--ot", "x"], "ps-server export: error: unrecognized arguments: --ot x (--ot: did you "
                                           "mean --out?)"),
    ("worker", ["predict", "--dta", "x"], "ps-worker predict: error: unrecognized arguments: --dta x (--dta: did you "
                                          "mean --data?)"),
    # before the command word its value would be taken for the command: named before argparse says X is none
    ("worker", ["--log-levl", "X", "train"], "ps-worker: error: unrecognized arguments: --log-levl (--log-levl: did "
                                             "you mean --log-level?)"),
    ("worker", ["--log-levl", "X"], "ps-worker: error: unrecognized arguments: --log-levl (--log-levl: did you mean "
                                    "--log-level?)"),
    # an abbreviation is refused: --conf read as --config by the parse, its file unread (TLS and a token dropped)
    ("ps", ["--conf", "c.toml", "--data-dir", "x"], "ps-server: error: unrecognized arguments: --conf c.toml (--conf: "
                                                    "did you mean --config?)"),
    ("worker", ["stats", "--conf", "c.toml"], "ps-worker stats: error: unrecognized arguments: --conf c.toml (--conf: "
                                              "did you mean --config?)"),
    ("worker", ["train", "--synthetic-r", "10"], "ps-worker train: error: unrecognized arguments: --synthetic-r 10"),
    ("ps", ["size", "--di", "8", "--ids", "10"], "ps-server size: error: unrecognized arguments: --di 8 (--di: did you "
                                                 "mean --dim?)"),
])  # fmt: skip
def test_a_mistyped_flag_is_named_even_where_a_required_one_is_missing(cli, argv, said):
    """`--data-dr x` leaves the required --data-dir missing: the mistyped flag is what the message names."""
    r = subprocess.run([sys.executable, "-m", cli, *argv], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and said in r.stderr and "are required" not in r.stderr, r.stderr


def test_the_clis_take_settings_from_the_environment(tmp_path):
    env = {"PS_MODEL": "lr", "PS_SYNTHETIC_ROWS": "20000", "PS_SYNTHETIC_EVAL_ROWS": "5000", "PS_NO_PROGRESS": "1",
           "PS_LOCAL_SHARDS": "2", "PS_RECIPE": "large", "PATH": "/usr/bin:/bin"}  # fmt: skip
    r = subprocess.run([sys.executable, "-m", "worker", "train"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "trained lr (numpy" in r.stdout and "on 20,000 examples" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "ps"], env={"PS_DATA_DIR": str(tmp_path), "PS_PORT": "x", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "PS_PORT" in bad.stderr and "Traceback" not in bad.stderr


def test_the_flag_tables_of_docs_configuration_md_are_the_parsers_own():
    from tests.settings_doc import DOC, NAMES, render, render_names

    text = DOC.read_text()
    assert render(text) == text, f"{DOC}'s flag tables are stale: run python -m tests.settings_doc"
    assert render_names() == NAMES.read_text(), f"{NAMES} is stale: run python -m tests.settings_doc"
    assert render(text.replace("| `--cache-bytes` |", "| `--cache-byte` |")) == text  # a stale row is rewritten


def test_the_servers_settings_line_gives_what_differs_from_the_defaults_as_flags(tmp_path):
    from ps.cli_server import _given_settings

    parser = server_parser()
    argv = ["--data-dir", str(tmp_path), "--sync"]
    env = {"PS_CACHE_BYTES": "64M", "PS_AUTH_TOKEN_FILE": "/run/token", "PS_REPLY_BYTES": "1000000"}
    apply_defaults(parser, argv, env, section="server")
    line = _given_settings(parser.parse_args(argv))
    reply = "--reply-bytes 976.6 KiB (1,000,000 bytes)"  # the exact count where the figure is rounded
    assert line == f"--data-dir {tmp_path} {reply} --sync --cache-bytes 64.0 MiB --auth-token-file /run/token", line


def test_a_ps_variable_that_sets_nothing_is_warned_of_with_the_closest_names(tmp_path):
    from ps.settings import unknown_environment

    environ = {"PS_MODLE": "fm", "PS_MODEL": "fm", "PS_CACHE_BYTES": "1G", "PS_KERNEL_THREADS": "2",
               "PS_CONFIG": "x.toml", "PS_ZZZ": "1", "PATH": "/bin"}  # fmt: skip
    # a server flag counts in a worker's environment (its local shards read it), and a worker's in a server's
    assert unknown_environment(environ) == {"PS_MODLE": ["PS_MODE", "PS_MODEL"], "PS_ZZZ": []}
    env = {"PS_DATA_DIR": str(tmp_path), "PS_PORT": "x", "PS_CAHCE_BYTES": "1G", "PATH": "/usr/bin:/bin"}
    bad = subprocess.run([sys.executable, "-m", "ps"], env=env, capture_output=True, text=True, timeout=60)
    assert ("ps-server: warning: environment variable PS_CAHCE_BYTES is no setting of ps-server or ps-worker and is "
            "ignored; did you mean PS_CACHE_BYTES") in bad.stderr  # fmt: skip
    assert bad.returncode == 2 and "PS_PORT" in bad.stderr  # the warning comes first; the bad value still stops it


def test_an_on_off_choice_takes_true_and_false_too(tmp_path):
    from worker.cli_train_config import train_config_from_argv

    config = tmp_path / "c.toml"
    config.write_text("[train]\nshuffle = false\n")
    assert train_config_from_argv(["--local-shards", "1", "--config", str(config)]).shuffle is False
    config.write_text("[train]\nshuffle = true\n")
    assert train_config_from_argv(["--local-shards", "1", "--config", str(config)]).shuffle is True
    config.write_text('[train]\nshuffle = "auto"\n')
    assert train_config_from_argv(["--local-shards", "1", "--config", str(config)]).shuffle is None


def test_a_misspelled_config_key_gets_the_closest_names(tmp_path):
    from ps.settings import apply_defaults
    from worker.__main__ import build_parser

    config = tmp_path / "c.toml"
    config.write_text("[train]\nshufle = true\n")
    with pytest.raises(
        ValueError, match=r"\[train\] 'shufle' is not a setting of this command; did you mean shuffle\?$"
    ):
        apply_defaults(build_parser(), ["train", "--config", str(config)], environ={})
    config.write_text("shuffle = true\n")  # a train key at the top level: ps-worker synth does not know it
    with pytest.raises(ValueError, match=r"'shuffle' is not a setting of this command; known: .* put a command's own"):
        apply_defaults(build_parser(), ["synth", "--config", str(config)], environ={})
    config.write_text("[launch]\nepochs = 2\n")  # a setting for launch's workers: [train] is where they read it
    with pytest.raises(
        ValueError, match=r"\[launch\] 'epochs' is not a setting .* go under \[train\], which they read"
    ):
        apply_defaults(build_parser(), ["launch", "--config", str(config)], environ={})


@pytest.mark.parametrize("value", ["abc", "0", "-3"])
def test_a_bad_ps_kernel_threads_names_the_variable(tmp_path, value):
    r = subprocess.run([sys.executable, "-m", "ps", "--data-dir", str(tmp_path / "d"), "--port", "0"],
                       env={"PS_KERNEL_THREADS": value, "PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and f"PS_KERNEL_THREADS is {value!r}, expected a whole number >= 1" in r.stderr, r.stderr
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    "text, size",
    [("67108864", 67108864), ("1e9", 10**9), ("2.5e9", 2_500_000_000), ("512M", 512 << 20), ("64MiB", 64 << 20),
     ("64mb", 64 << 20), ("1.5G", 3 << 29), ("1.1G", 1181116006), ("2e3K", 2_048_000), (" 4T ", 4 << 40),
     ("99999999999999999999", 99999999999999999999)],
)  # fmt: skip
def test_a_size_is_bytes_or_a_number_with_a_binary_unit_and_takes_exponents(text, size):
    import argparse

    from ps.cli_server_flags import parse_bytes
    from ps.config import MAX_MEMORY_BYTES
    from worker.cli_train_flags import _size

    assert parse_bytes(text) == size  # ps-server's sizes and ps-worker's are spelled alike
    if size <= MAX_MEMORY_BYTES:
        assert _size(text) == size
    else:  # the server's bound is its config's (ServerConfig.validate), the worker's its flag's
        with pytest.raises(argparse.ArgumentTypeError, match="expected bytes from 0 to 1024T"):
            _size(text)


def test_the_servers_and_the_workers_size_bound_is_said_alike_and_parses_back_to_the_bound():
    """The servers' --cache-bytes and ps-worker's --row-cache-bytes refuse a size over MAX_MEMORY_BYTES in one
    wording: the size each message spells (1024T) is the bound as a size flag reads it, and so is its figure."""
    import argparse
    import re

    from ps.config import MAX_MEMORY_BYTES
    from ps.flagtypes import byte_size
    from ps.server_config import ServerConfig
    from worker.cli_train_flags import _size

    over = str(MAX_MEMORY_BYTES + 1)
    with pytest.raises(ValueError) as server:
        ServerConfig(data_dir="d", cache_bytes=MAX_MEMORY_BYTES + 1).validate()
    with pytest.raises(argparse.ArgumentTypeError) as worker:
        _size(over)
    said = [re.search(r"(?:to|most) (\S+) \(([\d,]+) bytes, beyond any machine's memory\)", str(e.value))
            for e in (server, worker)]  # fmt: skip
    assert all(said), (str(server.value), str(worker.value))
    assert len({m.string[m.start(1) : m.end()] for m in said}) == 1  # one wording
    for m in said:
        assert byte_size(m.group(1)) == int(m.group(2).replace(",", "")) == MAX_MEMORY_BYTES


@pytest.mark.parametrize("text", ["lots", "infG", "nan", "1E", "", "G", "1e999", "1e100", "1.5", "300000.9", "2.5e-1"])
def test_a_size_that_is_no_number_is_refused(text):
    from ps.flagtypes import byte_size

    with pytest.raises(ValueError):
        byte_size(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [("9.007199254740993e15", 9_007_199_254_740_993), ("9007199254740993", 9_007_199_254_740_993),
     ("1.5G", 3 << 29), ("1.1G", 1_181_116_006), ("1.000000001K", 1024),
     ("12345678901234567890.5e10", 123456789012345678905 * 10**9),
     ("8.000000000000000000000000000001e30", 8 * 10**30 + 1)],
)  # fmt: skip
def test_a_size_in_scientific_notation_or_with_a_fraction_is_taken_exactly(text, size):
    """No float rounds a size: 9.007199254740993e15 is 2**53 + 1 bytes (a float reads 2**53), and a unit's fraction
    of a byte is dropped from the exact product."""
    from ps.flagtypes import byte_size

    assert byte_size(text) == size


@pytest.mark.parametrize(
    ("text", "value"),
    [("9.007199254740993e15", 2**53 + 1), ("1.2345678901234567890123456789012e31", 12345678901234567890123456789012),
     ("18446744073709551615", 2**64 - 1)],
)  # fmt: skip
def test_a_whole_number_in_scientific_notation_is_taken_exactly(text, value):
    from ps.flagtypes import whole_number

    assert whole_number(0, 2**128)(text) == value


def test_every_list_flag_is_a_flag_that_takes_a_comma_separated_list():
    import argparse

    from ps.settings import LIST_FLAGS

    actions = {}

    def walk(parser):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub in a.choices.values():
                    walk(sub)
            elif a.option_strings:
                actions.setdefault(a.dest, a)

    walk(worker_parser())
    walk(server_parser())
    assert set(actions) >= LIST_FLAGS, LIST_FLAGS - set(actions)
    assert all(actions[d].type is None and actions[d].nargs is None for d in LIST_FLAGS)
    comma_separated = {d for d, a in actions.items() if "comma-separated" in (a.help or "")} - {"format"}  # one value
    assert comma_separated <= LIST_FLAGS, comma_separated - LIST_FLAGS  # a config file may give each as an array


@pytest.mark.parametrize("cli, argv, required", [
    ("worker", ["stats", "--help"], ["--servers SERVERS"]),
    ("worker", ["synth", "-h"], ["--out OUT"]),
    ("worker", ["launch", "--help"], ["--workers N"]),
    ("ps", ["size", "--help"], ["--ids IDS", "--dim DIM"]),
    ("ps", ["export", "--help"], ["--out OUT"]),
])  # fmt: skip
def test_help_shows_a_required_flag_as_required(cli, argv, required):
    """--help's usage line marks a required flag as argparse does, without brackets: the search for mistyped flags
    (settings.unknown_arguments), which parses with none required, does not print the help."""
    r = subprocess.run([sys.executable, "-m", cli, *argv], capture_output=True, text=True, timeout=60)
    usage = r.stdout.split("\n\n")[0]
    assert r.returncode == 0 and usage.startswith("usage:"), r.stdout + r.stderr
    for flag in required:
        assert flag in usage and f"[{flag}]" not in usage, usage
