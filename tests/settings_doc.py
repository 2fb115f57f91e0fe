"""The flag tables of docs/configuration.md, rendered from the parsers of both CLIs (ps.settings.settings_table).

`python -m tests.settings_doc` rewrites every table in that file in place: the rows of flags (lines starting
"| `--") under each "### <command>" heading, where <command> is `ps-server`, `ps-server <command>` or `ps-worker
<subcommand>`; the text around them is left as it is. tests/test_settings.py checks that the file is current.

    row := "| `" flag "` | " env " | " default " | " help " |"     # help's '|' written as '\\|'
    env := "`" PS_NAME "`" | "-"                                    # "-": ps-server's commands read no environment
"""

from __future__ import annotations

import argparse
import pathlib
import re

from ps.settings import settings_table

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def sections() -> dict[str, argparse.ArgumentParser]:
    """Heading -> parser: ps-server and its commands, then ps-worker's subcommands in their order."""
    from ps.__main__ import COMMAND_PARSERS
    from ps.__main__ import build_parser as server_parser
    from worker.__main__ import build_parser as worker_parser

    out = {"ps-server": server_parser()}
    out.update({f"ps-server {name}": build() for name, build in COMMAND_PARSERS.items()})
    sub = next(a for a in worker_parser()._actions if isinstance(a, argparse._SubParsersAction))
    out.update({f"ps-worker {name}": p for name, p in sub.choices.items()})
    return out


def rows(parser: argparse.ArgumentParser, environment: bool = True) -> list[str]:
    return [f"| `{flag}` | {f'`{env}`' if environment else '-'} | {default} | {help.replace('|', chr(92) + '|')} |"
            for flag, env, default, help in settings_table(parser)]  # fmt: skip


def render(text: str) -> str:
    """text (the doc) with the flag rows of each command's section replaced by the parser's; ValueError naming a
    command without a section (or a section without a table)."""
    for name, parser in sections().items():
        heading = re.search(rf"^### {re.escape(name)}\n", text, re.M)
        if heading is None:
            raise ValueError(f"{DOC.name} has no '### {name}' section")
        end = re.compile(r"^### ", re.M).search(text, heading.end())
        stop = end.start() if end else len(text)
        lines = text[heading.end() : stop].split("\n")
        flags = [i for i, line in enumerate(lines) if line.startswith("| `--")]
        table = rows(parser, environment=not name.startswith("ps-server "))
        if not flags and not table:  # a command without flags (ps-server verify)
            continue
        if not flags:
            raise ValueError(f"the '### {name}' section of {DOC.name} has no table of flags")
        lines[flags[0] : flags[-1] + 1] = table
        text = text[: heading.end()] + "\n".join(lines) + text[stop:]
    return text


if __name__ == "__main__":
    DOC.write_text(render(DOC.read_text()))
    print(f"rewrote the flag tables of {DOC}")
