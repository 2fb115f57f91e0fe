"""`ps-server` / `python -m ps`: command-line arguments in, a running shard out."""

from __future__ import annotations

from ps.terminate import exit_code, interrupt_exits, sigterm_raises

with interrupt_exits("ps-server"):  # a Ctrl-C while these load (most of a start's first 0.3 s)
    import sys

    from ps.cli_commands import export_main, health_main, parse_strictly, size_main, verify_main
    from ps.cli_server import run_server
    from ps.cli_server_flags import build_parser
    from ps.settings import apply_defaults, reader_gone, warn_unknown_environment


COMMANDS = ("export", "size", "verify", "health")


def main(argv: list[str] | None = None) -> int:
    """ps-server and its commands; the exit code. Once its arguments are read, a SIGTERM before the server's own
    handler is in place (its imports, ps.server_run.serve) or during `export` or `verify` ends the program with its
    cleanups run (a read-only view's temporary folder, an export's temporary files), 'ps-server: terminated' and
    EXIT_CODE (143): with no handler a process dies at once, or, as PID 1 of a container without an init, ignores
    the signal. (sigterm_raises imports numba for its guard: not before `--help`.)"""
    return exit_code("ps-server", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"export": export_main, "size": size_main, "verify": verify_main, "health": health_main}
    if argv[:1] and argv[0] in commands:
        try:
            return commands[argv[0]](argv[1:])
        except BrokenPipeError:
            return reader_gone()
    parser = build_parser()
    if argv and not argv[0].startswith("-"):  # a mistyped command would otherwise be told to give --data-dir
        parser.error(f"unknown command {argv[0]!r}: the commands are {', '.join(COMMANDS)}; without one, "
                     "ps-server runs a shard (flags only)")  # fmt: skip
    warn_unknown_environment(parser.prog)
    try:
        apply_defaults(parser, argv, section="server")
    except ValueError as e:
        parser.error(str(e))
    args = parse_strictly(parser, argv)
    with sigterm_raises():  # until serve() puts its own handler in place (ps.terminate; main() says it)
        return run_server(args)


if __name__ == "__main__":
    sys.exit(main())
