"""Every command-line flag can also come from a PS_* environment variable or a TOML file.

Precedence, highest first:
    1. the command line                       --cache-bytes 4G
    2. the environment                        PS_CACHE_BYTES=4G      (PS_ + the flag's name, upper case, _ for -)
    3. a TOML file, --config FILE or PS_CONFIG=FILE (an empty one is an error, not no file):
           log_level = "INFO"                 # top-level keys: every command (each must know them)
           [server]                           # ps-server
           cache_bytes = "4G"
           [train]                            # ps-worker train (and [eval], [stats], ...); wins over the top
           model = "deepfm"                   # level; a command reads only its own section
    4. the built-in default
Values from the environment and the file are checked as a command-line value would be (type, choices); a key
the command does not know is an error, so are a section that is no command's (CONFIG_SECTIONS) and a value that
does not parse. Flags that take no value (--sync)
accept true/false, 1/0, yes/no. Positional arguments (a checkpoint dir) only come from the command line.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tomllib
from collections.abc import Mapping

from ps.emptyflags import refuse_empty_path

CONFIG_ENV = "PS_CONFIG"
CONFIG_SECTIONS = ("server", "train", "eval", "predict", "launch", "stats", "shrink", "checkpoint", "export",
                   "synth", "schema")  # fmt: skip
"""The sections a config file may hold: ps-server's, and ps-worker's commands (one file can serve both). Another
is an error, not ignored: a misspelled [Server] would have dropped its settings (a token file, --sync) silently."""
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}
LIST_FLAGS = frozenset({"servers", "data", "eval_data", "validation_data", "predict_data", "drop_columns",
                        "numeric_columns", "keep_columns", "hidden", "backends", "tables"})  # fmt: skip
"""The flags (by dest) whose value is a comma-separated list, for which a config file may give a TOML array; an
array or a table for any other flag is an error, not a value joined into one (data_dir = ["a", "b"]: "a,b")."""
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")  # --log-level of both CLIs


def env_name(dest: str) -> str:
    return "PS_" + dest.upper()


def _flag(action: argparse.Action) -> str:
    return max(action.option_strings, key=len)


def _convert(action: argparse.Action, value, source: str):
    """A value from the environment (a string) or the file (any TOML type), checked as argparse would."""
    where = f"{source} (for {_flag(action)})"
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise ValueError(f"{where}: expected true or false, got {value!r}")
    if action.choices is not None and {"on", "off"} <= set(action.choices):  # TOML's true/false, as for a switch
        text = str(value).strip().lower()
        if isinstance(value, bool) or text in _TRUE or (text and text in _FALSE):
            value = "on" if (value if isinstance(value, bool) else text in _TRUE) else "off"
    if isinstance(value, bool):  # a switch and an on/off flag took theirs above; str(True) is no value of this one
        raise ValueError(f"{where}: expected a value, got true/false ({str(value).lower()}): {_flag(action)} is "
                         "no switch")  # fmt: skip
    if isinstance(value, (list, dict)):
        if not (isinstance(value, list) and action.dest in LIST_FLAGS):
            kind = "an array" if isinstance(value, list) else "a table"
            raise ValueError(f"{where}: expected one value, got {kind}: {value!r}")
        value = ",".join(str(v) for v in value)  # a comma-separated list flag: a TOML array is fine too
    if action.type is not None and not (isinstance(value, (int, float)) and action.type in (int, float)):
        try:
            value = action.type(str(value))
        except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
            raise ValueError(f"{where}: {e}") from None
    elif action.type in (int, float):
        value = action.type(value)
    elif action.type is None and not isinstance(value, str):
        value = str(value)
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"{where}: {value!r} is not one of {sorted(action.choices)}")
    return value


def _settable(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The flags the environment and the file may set: not --help, --config, nor a hidden flag (a subcommand's copy
    of a top-level flag, which must stay unset unless given on the command line)."""
    return {
        a.dest: a
        for a in parser._actions
        if a.option_strings
        and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
        and a.dest != "config"
        and a.help != argparse.SUPPRESS
    }


def command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of subcommand `command` of parser (its usage is the one an error about its flags shows)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _subparser(parser: argparse.ArgumentParser, argv: list[str]):
    """(command name, its parser) if parser has subcommands and argv names one, else (None, None)."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for token in argv:
                if token in a.choices:
                    return token, a.choices[token]
    return None, None


def _refuse_abbreviations(parser: argparse.ArgumentParser) -> None:
    """Turns off argparse's abbreviated flags in parser and its subcommands' parsers: `--conf FILE` would be taken
    as --config by the parse but not by _config_path, and the file's settings (TLS, a token) silently dropped; an
    abbreviation is an unrecognized argument instead."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _refuse_abbreviations(sub)


def _config_path(argv: list[str], environ) -> str | None:
    """The config file argv's last --config names (the one argparse keeps, as for any flag given twice), else
    PS_CONFIG's; None where neither is given. ValueError for an empty or blank one (an unset variable in a
    template, `--config "$CONFIG"`): taken as no file, it would drop the file's settings (TLS, a token) without a
    word."""
    path, source = environ.get(CONFIG_ENV), f"environment variable {CONFIG_ENV}"
    for i, token in enumerate(argv):
        if token == "--":  # what follows is positional arguments only
            break
        if token == "--config" and i + 1 < len(argv):
            path, source = argv[i + 1], "--config"
        elif token.startswith("--config="):
            path, source = token.split("=", 1)[1], "--config"
    refuse_empty_path(source, path, "the config file's path", "drop the file's settings")
    return path


def apply_defaults(
    parser: argparse.ArgumentParser,
    argv: list[str],
    environ: Mapping[str, str] | None = None,
    section: str | None = None,
) -> None:
    """Sets the defaults of parser (and of the subcommand argv names) from the environment and the config file,
    before parser.parse_args(argv) lets the command line override them. The file's section is the subcommand's
    name, or `section` for a parser without subcommands (ps-server: "server"). ValueError for a bad value or
    key."""
    environ = os.environ if environ is None else environ
    _refuse_abbreviations(parser)
    path = _config_path(argv, environ)
    doc: dict = {}
    if path:
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except OSError as e:
            raise ValueError(f"config file {path}: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"config file {path}: not valid TOML: {e}") from None
    command, sub = _subparser(parser, argv)
    parsers = [(parser, None)] + ([(sub, command)] if sub is not None else [])
    command = command or section
    known = set()
    for p, _ in parsers:
        known |= set(_settable(p))
    sections = {k for k, v in doc.items() if isinstance(v, dict)}
    unknown = sorted(sections - set(CONFIG_SECTIONS))
    if unknown:
        raise ValueError(f"config file {path}: section [{unknown[0]}] is not one of ps-server's or ps-worker's; "
                         f"the sections are [server] (ps-server) and {', '.join(f'[{c}]' for c in CONFIG_SECTIONS[1:])} "
                         "(ps-worker's commands)")  # fmt: skip
    top = {k: v for k, v in doc.items() if k not in sections}
    section = doc.get(command, {}) if command else {}
    for key in list(top) + list(section):
        if key.replace("-", "_") not in known:
            raise ValueError(_unknown_key(path, key, command if key in section else None, known))
    for p, _ in parsers:
        for dest, action in _settable(p).items():
            value, source = None, None
            for mapping, name in ((top, "top level"), (section, f"[{command}]")):
                spellings = [key for key in dict.fromkeys((dest, dest.replace("_", "-"))) if key in mapping]
                if len(spellings) > 1:  # which one wins would be a guess
                    raise ValueError(f"config file {path} {name}: {spellings[0]!r} and {spellings[1]!r} are one "
                                     f"setting ({_flag(action)}): give it once")  # fmt: skip
                for key in spellings:
                    value, source = mapping[key], f"config file {path} {name} {key!r}"
            if env_name(dest) in environ:
                value, source = environ[env_name(dest)], f"environment variable {env_name(dest)}"
            if source is not None:
                action.default = _convert(action, value, source)
                action.required = False


ENVIRONMENT_ONLY = {
    CONFIG_ENV: "the config file (--config)",
    "PS_KERNEL_THREADS": "threads a server splits one batch's per-id work over (ps/rows/parallel.py)",
}
"""PS_* variables read from the environment that are no flag's."""


def unknown_environment(environ: Mapping[str, str]) -> dict[str, list[str]]:
    """{name: the closest known names (_closest)} of environ's PS_* variables that set nothing: no flag of
    ps-server or of a ps-worker command (ps/settings_names.py), nor one of ENVIRONMENT_ONLY. Both programs' names
    count for each: a local shard runs in the environment of the worker that started it."""
    from ps.settings_names import SERVER, WORKER

    known = SERVER | WORKER | set(ENVIRONMENT_ONLY)
    unknown = sorted(name for name in environ if name.startswith("PS_") and name not in known)
    return {name: _closest(name, known) for name in unknown}


def unknown_arguments(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """parser.parse_known_args(argv) with no argument required, in the parser and its subcommands' parsers: the
    arguments no parser knows are found even where a required one is missing (argparse says only that it is
    missing, and `--data-dr x` would leave `--data-dir` missing without naming the flag mistyped). With -h or
    --help in argv it is the plain parse, which prints the help: relaxed, its usage line would show the required
    flags as optional."""
    if "-h" in argv or "--help" in argv:
        return parser.parse_known_args(argv)
    relaxed = []

    def relax(p: argparse.ArgumentParser) -> None:
        for action in p._actions:
            if action.required:
                relaxed.append(action)
                action.required = False
            if isinstance(action, argparse._SubParsersAction):
                for sub in set(action.choices.values()):
                    relax(sub)

    relax(parser)
    try:
        return parser.parse_known_args(argv)
    finally:
        for action in relaxed:
            action.required = True


def unknown_before_command(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """The flags before argv's command word (the first of parser's subcommand names) that parser does not know,
    whole or as the prefix argparse accepts: `ps-worker --log-levl X train` would otherwise be told only that X
    is no command."""
    commands = {name for a in parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices}
    flags = _long_flags(parser)
    unknown = []
    for token in argv:
        if token in commands or token == "--":
            break
        name = token.split("=", 1)[0]
        if name.startswith("--") and not any(flag.startswith(name) for flag in flags):
            unknown.append(token)
    return unknown


def unrecognized(parser: argparse.ArgumentParser, rest: list[str]) -> str:
    """argparse's message for arguments no parser knows (rest), with the closest flags of `parser` to each
    mistyped one."""
    flags = _long_flags(parser)
    hints = []
    for token in rest:
        name = token.split("=", 1)[0]
        if name.startswith("--") and name not in flags:
            closest = _closest(name, flags)
            hints += [f"{name}: did you mean {' or '.join(closest)}?"] if closest else []
    return f"unrecognized arguments: {' '.join(rest)}" + (f" ({'; '.join(hints)})" if hints else "")


def _long_flags(parser: argparse.ArgumentParser) -> set[str]:
    """The --flags of parser itself (not of its subcommands)."""
    return {o for action in parser._actions for o in action.option_strings if o.startswith("--")}


def warn_unknown_environment(prog: str, environ: Mapping[str, str] | None = None) -> None:
    """One warning line on stderr for each PS_* variable that sets nothing (unknown_environment), naming the
    closest known ones: a misspelled variable would otherwise be ignored silently."""
    environ = os.environ if environ is None else environ
    for name, closest in unknown_environment(environ).items():
        hint = f"; did you mean {' or '.join(closest)}?" if closest else ""
        print(f"{prog}: warning: environment variable {name} is no setting of ps-server or ps-worker and is "
              f"ignored{hint}", file=sys.stderr)  # fmt: skip


def _closest(name: str, known: set[str]) -> list[str]:
    """The known names closest to a misspelled one, at most 2 (difflib's ratio 0.75 or more)."""
    import difflib

    return difflib.get_close_matches(name, known, n=2, cutoff=0.75)


def _unknown_key(path: str, key: str, section: str | None, known: set[str]) -> str:
    """The error of a config file's key that the command does not know (in [section], or at the top level, which
    every command reading the file must know): the closest known keys, else all of them."""
    close = _closest(key.replace("-", "_"), known)
    where = f"[{section}] " if section else ""
    hint = f"did you mean {' or '.join(close)}?" if close else f"known: {', '.join(sorted(known))}"
    if not section:
        hint += " (a top-level key is read by every command that reads the file: put a command's own under its section)"
    if section == "launch":  # the flags launch passes on to its workers are train's
        hint += " (the settings launch gives its workers' train, such as epochs, go under [train], which they read)"
    return f"config file {path}: {where}{key!r} is not a setting of this command; {hint}"


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help=f"TOML file of settings (also {CONFIG_ENV}); precedence: "
                        "command line > PS_* environment variables > this file > defaults")  # fmt: skip


def settings_table(parser: argparse.ArgumentParser) -> list[tuple[str, str, str, str]]:
    """(flag, environment variable, default, help) of every settable flag, for documentation."""
    return [(_flag(a), env_name(d), repr(a.default) if a.default is not None else "", a.help or "")
            for d, a in _settable(parser).items()]  # fmt: skip


def reader_gone() -> int:
    """For both CLIs' `except BrokenPipeError`: the reader of stdout left (`| head`); the command ends quietly, as
    other command-line tools do (stdout pointed at /dev/null: Python's flush at exit would fail too). Returns the
    exit code, 141 (SIGPIPE's)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE
