"""`ps-worker` / `python -m worker`: command-line arguments in, a training run (or a data file) out."""

from __future__ import annotations

from ps.terminate import exit_code, interrupt_exits, sigterm_raises

with interrupt_exits("ps-worker"):  # a Ctrl-C while these load (most of a start's first 0.3 s)
    import argparse
    import logging
    import sys

    from ps.accel.malloc import tune_malloc
    from ps.errors import PsError
    from ps.flagtypes import HelpFormatter
    from ps.settings import (
        LOG_LEVELS,
        add_config_flag,
        apply_defaults,
        command_parser,
        reader_gone,
        unknown_arguments,
        unknown_before_command,
        unrecognized,
        warn_unknown_environment,
    )
    from worker.cli_cluster import run_checkpoint, run_export, run_shrink, run_stats
    from worker.cli_cluster_flags import add_cluster_parsers
    from worker.cli_data import add_schema_parser, add_synth_parser, run_schema, run_synth
    from worker.cli_predict import add_predict_parser, run_predict
    from worker.cli_train import run_eval, run_train
    from worker.cli_train_flags import add_eval_parser, add_train_parser
    from worker.flags import check_not_an_input
    from worker.launch import run_launch
    from worker.launch_plan import add_launch_parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ps-worker",
        description="sparseps worker: train CTR models on parameter servers.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=LOG_LEVELS,
        help="what to log (any case; before or after the command)",
    )
    sub = p.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    add_eval_parser(sub)
    add_predict_parser(sub)
    add_launch_parser(sub)
    add_synth_parser(sub)
    add_schema_parser(sub)
    add_cluster_parsers(sub)
    for command in sub.choices.values():
        add_config_flag(command)
        # also after the command (`ps-worker train --log-level INFO`); unset there, the value before it stands
        command.add_argument(
            "--log-level", default=argparse.SUPPRESS, type=str.upper, choices=LOG_LEVELS, help=argparse.SUPPRESS
        )
    return p


_OUTPUTS = ("out", "metrics_out")  # the dests of the flags that name a file a command writes


def _check_config_not_written(args) -> None:
    """ValueError when an output flag names the --config file (each command checks its other inputs)."""
    for dest in _OUTPUTS:
        check_not_an_input(f"--{dest.replace('_', '-')}", getattr(args, dest, None), {"--config": args.config})


def main(argv: list[str] | None = None) -> int:
    """ps-worker and its commands; the exit code. A Ctrl-C (or, in a command, a SIGTERM: sigterm_raises) ends it
    with 'ps-worker: interrupted' (or 'terminated') and 130 (143), its cleanups run; one while the imports load
    ends it so too (interrupt_exits)."""
    return exit_code("ps-worker", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    warn_unknown_environment(parser.prog)
    try:
        apply_defaults(parser, argv)
    except ValueError as e:
        parser.error(str(e))
    # flags no parser knows, found before a missing required one is (settings.unknown_arguments); launch passes
    # the flags it does not know to each worker's train
    if early := unknown_before_command(parser, argv):
        parser.error(unrecognized(parser, early))
    loose, rest = unknown_arguments(parser, argv)
    if rest and loose.command not in (None, "launch"):  # the usage of the part of the command line they were given in
        before = argv[: argv.index(loose.command)] if loose.command in argv else []
        where = parser if all(token in before for token in rest) else command_parser(parser, loose.command)
        where.error(unrecognized(where, rest))
    args, rest = parser.parse_known_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_malloc()
    try:
        with sigterm_raises():
            return _run_command(args, rest)
    except BrokenPipeError:
        return reader_gone()
    except (ValueError, PsError, OSError) as e:
        print(f"ps-worker: error: {e}", file=sys.stderr)
        return 2


def _run_command(args, rest: list[str]) -> int:
    _check_config_not_written(args)
    if args.command == "launch":
        return run_launch(args, rest)
    commands = {"train": run_train, "eval": run_eval, "predict": run_predict, "synth": run_synth,
                "schema": run_schema, "stats": run_stats, "shrink": run_shrink, "checkpoint": run_checkpoint,
                "export": run_export}  # fmt: skip
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
