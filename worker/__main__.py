"""`ps-worker` / `python -m worker`: command-line arguments in, a training run (or a data file) out."""

from __future__ import annotations

import argparse
import logging
import math
import sys

from ps.accel.malloc import tune_malloc
from ps.errors import PsError
from ps.settings import add_config_flag, apply_defaults
from worker.flags import server_list


def _add_train(sub) -> None:
    from worker.train import TrainConfig

    d = TrainConfig()
    p = sub.add_parser(
        "train",
        help="train a CTR model against parameter servers",
        description="Train a CTR model (LR, FM, DeepFM or DNN; numpy on the CPU or PyTorch on the CPU or a GPU) on "
        "Criteo, CSV or libsvm files, or on synthetic data with a planted model. Sparse rows and dense (MLP) "
        "parameters live on the servers, so workers of either backend can train one model together. With "
        "--local-shards N instead of --servers it starts N server processes on 127.0.0.1 and stops them, with the "
        "model, at the end. Prints eval AUC / logloss / examples per second (and the oracle's, for synthetic data).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    where = p.add_argument_group("servers")
    where.add_argument("--servers", default=None, help="comma-separated host:port list, in shard order")
    where.add_argument(
        "--local-shards", type=int, default=None,
        help="instead of --servers: train on N throwaway shards started on 127.0.0.1 (the model goes with them)",
    )  # fmt: skip
    where.add_argument("--timeout-s", type=float, default=d.timeout_s, help="deadline of every server call")
    _add_security_args(p)
    where.add_argument(
        "--server-timeout",
        type=float,
        default=d.server_timeout_s,
        help="how long to wait for a server that is down (retrying, and logging which one) before exiting with an error",
    )
    _add_data_args(p, d)
    work = p.add_argument_group("workers")
    work.add_argument(
        "--worker-id", type=int, default=d.worker_id, help="this worker's index: it trains on its share of the data"
    )
    work.add_argument("--num-workers", type=int, default=d.num_workers, help="workers sharing the data and the tables")
    work.add_argument(
        "--prefetch",
        type=int,
        default=d.prefetch,
        help="batches whose rows are pulled ahead on a thread while one computes; rows the last pushes returned are laid over them, so training sees the rows a pull just before computing would (0: pull in the step)",
    )
    _add_model_args(p, d)
    model = p.add_argument_group("optimizer")
    model.add_argument(
        "--optimizer",
        default=None,
        choices=["adagrad", "adam", "ftrl", "sgd"],
        help="server-side optimizer of the sparse tables (default: the recipe's: ftrl with l2 300 for small data, "
        "adagrad for large)",
    )
    model.add_argument("--learning-rate", type=float, default=None,
                       help="sparse optimizer step size (default: the recipe's, or 0.02 adagrad, 0.05 ftrl, 0.001 "
                       "adam, 0.01 sgd)")  # fmt: skip
    model.add_argument(
        "--dense-optimizer",
        default=d.dense_optimizer,
        choices=["adam", "sgd", "adagrad"],
        help="server-side optimizer of the MLP",
    )
    model.add_argument(
        "--dense-learning-rate", type=float, default=d.dense_learning_rate, help="dense optimizer step size"
    )
    model.add_argument(
        "--dense-sync-every",
        type=int,
        default=d.dense_sync_every,
        help="push summed dense gradients and pull new MLP weights every k steps",
    )
    model.add_argument(
        "--l2",
        type=float,
        default=None,
        help="lazy L2 of the sparse tables: a row's embedding decays by (1 - learning rate * l2) per clock step, "
        "applied by the servers when the row is next pushed (not with ftrl, which has its own; default: the recipe's)",
    )
    model.add_argument("--dense-l2", type=float, default=None,
                       help="L2 penalty on the MLP weights (default: the recipe's: 1 for small data, 0 for large)")  # fmt: skip
    model.add_argument(
        "--dropout",
        type=float,
        default=None,
        help="dropout rate of the MLP's hidden units in training (default: the recipe's, 0)",
    )
    fit = p.add_argument_group(
        "schedule and validation",
        "Unset flags here come from a recipe for the data's size: small data (under 1M training examples) "
        "trains in batches of 256 for up to 20 epochs, validates on a 10%% split after each and stops after 2 "
        "without improvement; large data trains one epoch in batches of 2048. The run prints its choice.",
    )
    fit.add_argument(
        "--recipe",
        default=d.recipe,
        choices=["auto", "small", "large"],
        help="auto: small or large by the number of training examples",
    )
    fit.add_argument("--batch-size", type=int, default=None, help="examples per step (small: 256, large: 2048)")
    fit.add_argument(
        "--epochs", type=int, default=None, help="passes over the training data, at most (small: 20, large: 1)"
    )
    fit.add_argument(
        "--validation-fraction",
        type=float,
        default=None,
        help="share of the training examples held out to validate on (small: 0.1, large: 0)",
    )
    fit.add_argument("--validation-data", default=None, help="a file to validate on instead of a split")
    fit.add_argument(
        "--eval-every", type=int, default=d.eval_every, help="steps between validations (0: after every epoch)"
    )
    fit.add_argument(
        "--early-stop",
        type=int,
        default=None,
        help="stop after this many validations without a better logloss (0: never; small: 2)",
    )
    model.add_argument(
        "--table-config", help="TOML file with table settings (optimizer and its parameters, initializer, weight "
        "bound, admission, eviction) that override the model's defaults; see docs/tables.md",
    )  # fmt: skip
    out = p.add_argument_group("output")
    out.add_argument("--metrics-out", help="write the final figures as one JSON object to this file")
    out.add_argument(
        "--create-tables-only",
        action="store_true",
        help="create the model's tables on the servers (idempotent) and exit: a one-shot setup job",
    )
    out.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics of the run at http://HOST:PORT/metrics, plain HTTP with no token (0: a free "
        "port; HOST: --metrics-host)",
    )
    out.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address the --metrics-port endpoint listens on (0.0.0.0: every interface; see docs/security.md)",
    )
    out.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_data_args(p, d) -> None:
    data = p.add_argument_group("data")
    data.add_argument("--data", help="training file (for eval: the evaluation file); .gz is read transparently")
    data.add_argument("--eval-data", help="evaluation file, same format")
    data.add_argument(
        "--schema",
        default=None,
        help="TOML feature schema: columns, kinds (categorical, multi_hot, weighted, numeric), tables "
        "and widths, pooling, transforms (worker/schema.py; `ps-worker schema --data FILE` writes a "
        "starting one); without it --format and the column flags make a built-in one",
    )
    data.add_argument("--format", default=d.format, choices=["criteo", "csv", "libsvm"],
                      help="criteo: tab-separated label, 13 ints, 26 hex; csv: a header, see the column flags; "
                      "libsvm: 'label id:value ...' (labels 0/1 or -1/+1)")  # fmt: skip
    data.add_argument("--label-column", help="csv: the label column (default: the first)")
    data.add_argument("--drop-columns", default="", help="csv: comma-separated columns to ignore")
    data.add_argument(
        "--numeric-columns",
        default="",
        help="csv: comma-separated numeric columns (dense features); the others are categorical",
    )
    data.add_argument(
        "--libsvm-fields",
        type=int,
        default=None,
        help="libsvm: the number of fields K (default: the feature count of the first line of --data; give the training file's K to eval)",
    )
    data.add_argument(
        "--max-bad-lines",
        type=int,
        default=d.max_bad_lines,
        help="malformed lines skipped (and reported) before the run fails",
    )
    data.add_argument(
        "--synthetic-rows", type=int, default=d.synthetic_rows, help="synthetic training rows (no --data)"
    )
    data.add_argument("--synthetic-eval-rows", type=int, default=d.synthetic_eval_rows, help="synthetic eval rows")
    data.add_argument(
        "--synthetic-interactions", type=float, default=d.synthetic_interactions,
        help="strength of the planted pairwise field interactions (0 = a purely linear planted model)",
    )  # fmt: skip
    data.add_argument(
        "--synthetic-history", type=float, default=d.synthetic_history,
        help="strength of a planted multi-hot history column (0 = no such column)",
    )  # fmt: skip
    data.add_argument("--synthetic-seed", type=int, default=d.synthetic_seed, help="seed of the synthetic data")


def _add_model_args(p, d) -> None:
    model = p.add_argument_group("model")
    model.add_argument("--model", default=d.model, choices=["lr", "fm", "deepfm", "dnn"],
                       help="lr: logistic regression; fm: factorization machine; deepfm: FM + MLP; dnn: embeddings + MLP")  # fmt: skip
    model.add_argument(
        "--backend",
        default=d.backend,
        choices=["numpy", "torch"],
        help="where forward/backward run: numpy (CPU) or PyTorch",
    )
    model.add_argument(
        "--device", default=d.device, choices=["cpu", "cuda"], help="torch device (cuda needs --backend torch)"
    )
    model.add_argument("--embedding-dim", type=int, default=d.embedding_dim, help="embedding (FM latent) floats per id")
    model.add_argument("--hidden", default=",".join(map(str, d.hidden)), help="MLP hidden widths (deepfm, dnn)")


def _add_eval(sub) -> None:
    from worker.train import TrainConfig

    d = TrainConfig()
    p = sub.add_parser(
        "eval",
        help="evaluate the model the servers hold",
        description="Pull the rows and dense parameters the servers hold and report AUC and logloss on --data "
        "(or on the synthetic eval rows). The model flags must be those the model was trained with.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--servers", required=True, help="comma-separated host:port list, in shard order")
    p.add_argument("--timeout-s", type=float, default=d.timeout_s, help="deadline of every server call")
    p.add_argument(
        "--server-timeout",
        type=float,
        default=d.server_timeout_s,
        help="how long to wait for a server that is down before exiting with an error",
    )
    _add_security_args(p)
    p.add_argument("--batch-size", type=int, default=2048, help="examples per pull")
    _add_data_args(p, d)
    _add_model_args(p, d)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _add_synth(sub) -> None:
    p = sub.add_parser(
        "synth",
        help="write synthetic Criteo-format data with a planted model",
        description="Write rows of the synthetic generator: a Criteo-format file (label, 13 ints, 26 hex), or with "
        "--history a CSV with a multi-hot history column and, beside it, the schema that reads it (OUT.schema.toml).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", required=True, help="output file")
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--start", type=int, default=0, help="first row index (use a later range for eval data)")
    p.add_argument("--interactions", type=float, default=0.0, help="strength of the planted pairwise interactions")
    p.add_argument("--history", type=float, default=0.0, help="strength of a planted multi-hot history column")
    p.add_argument(
        "--small",
        action="store_true",
        help="the small-data regime: few rows over 10^5+ values, with interactions (overfits easily)",
    )
    p.add_argument("--seed", type=int, default=0)


def _add_schema(sub) -> None:
    p = sub.add_parser(
        "schema",
        help="print a starting feature schema inferred from a data sample",
        description="Read the first rows of a data file and print a TOML feature schema for --schema: the label, "
        "numeric columns (log or standardized), multi-hot columns, categorical columns. Review it before training.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--data", required=True, help="a data file (.gz read through gzip)")
    p.add_argument("--format", default="csv", choices=["csv", "criteo", "libsvm"], help="the file's format")
    p.add_argument("--delimiter", default=",", help="csv: the column separator")
    p.add_argument("--rows", type=int, default=10_000, help="rows of the sample")
    p.add_argument("--out", default=None, help="write the schema here instead of printing it")


def _add_cluster_commands(sub) -> None:
    for name, help_text in (
        ("stats", "print what each shard holds: rows in RAM and on disk, pending ids, bytes, counters"),
        ("shrink", "run the tables' eviction rules (TTL, decayed score) on every shard; print how many ids went"),
    ):
        p = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
        p.add_argument("--servers", required=True, help="comma-separated host:port list, in shard order")
        p.add_argument("--timeout-s", type=float, default=600.0, help="deadline of each server call")
        _add_server_timeout(p)
        p.add_argument("--json", action="store_true", help="print one JSON object")
        _add_security_args(p)
        if name == "shrink":
            p.add_argument("--table", default="", help="only this table (default: all)")
    help_text = (
        "checkpoint every shard at one cut into DIR (restore with ps-server --restore DIR, onto any number of servers)"
    )
    p = sub.add_parser("checkpoint", help=help_text, description=help_text[0].upper() + help_text[1:] + ". Pushes "
                       "wait (clients retry them) while the shards flush and checkpoint. DIR must lie inside the "
                       "servers' --checkpoint-root, under the same path here (one machine, or a shared volume).",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
    p.add_argument("action", choices=["save"], help="save: write a new checkpoint")
    p.add_argument("dir", help="a new directory for the checkpoint")
    p.add_argument("--servers", required=True, help="comma-separated host:port list, in shard order")
    p.add_argument("--timeout-s", type=float, default=600.0, help="deadline of each server call")
    _add_server_timeout(p)
    p.add_argument(
        "--hold-timeout-s",
        type=float,
        default=120.0,
        help="shards take pushes again after this long even if the save never finished",
    )
    _add_security_args(p)
    help_text = "write the model the servers hold, at one cut, for serving: per table ids and embeddings as .npy"
    p = sub.add_parser("export", help=help_text, description=help_text[0].upper() + help_text[1:] + " (optimizer "
                       "state left out), from a checkpoint taken first into OUT/checkpoint. --since STEP writes only "
                       "the rows pushed at clock step >= STEP: a delta for an online store.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
    p.add_argument("out", help="output directory")
    p.add_argument("--servers", required=True, help="comma-separated host:port list, in shard order")
    p.add_argument("--since", type=int, default=None, help="only rows pushed at this clock step or later")
    p.add_argument(
        "--keep-checkpoint", action="store_true", help="keep OUT/checkpoint (restorable with ps-server --restore)"
    )
    p.add_argument("--timeout-s", type=float, default=600.0, help="deadline of each server call")
    _add_server_timeout(p)
    _add_security_args(p)


def _add_server_timeout(p) -> None:
    p.add_argument(
        "--server-timeout", type=float, default=30.0,
        help="how long to wait for a server that is down (retrying) before exiting with an error",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ps-worker", description="sparseps worker: train CTR models on parameter servers.")
    p.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = p.add_subparsers(dest="command", required=True)
    _add_train(sub)
    _add_eval(sub)
    _add_synth(sub)
    _add_schema(sub)
    _add_cluster_commands(sub)
    for command in sub.choices.values():
        add_config_flag(command)
    return p


def _names(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def _hidden(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in _names(text))
    except ValueError:
        raise ValueError(f"--hidden {text!r}: expected comma-separated integers, e.g. 400,400,400") from None


def _add_security_args(p) -> None:
    g = p.add_argument_group("security (servers started with TLS or a token)")
    g.add_argument("--tls-ca", default=None, help="PEM CA to verify the servers' TLS certificates (turns TLS on)")
    g.add_argument("--tls-cert", default=None, help="PEM client certificate, for servers that require one (mutual TLS)")
    g.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    g.add_argument("--auth-token-file", default=None, help="file holding the token the servers require")


def _client(args):
    """A Client for the servers, deadlines and security flags of a cluster command (stats, checkpoint, ...)."""
    from ps.security import read_token
    from worker.client import Client

    token = read_token(args.auth_token_file) if args.auth_token_file else None
    return Client(list(server_list(args.servers)), timeout_s=args.timeout_s, server_timeout_s=args.server_timeout,
                  tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key, auth_token=token)  # fmt: skip


_POSITIVE = ("timeout_s", "hold_timeout_s", "rows")  # flags' dests whose value must be > 0
_NOT_NEGATIVE = ("server_timeout", "since", "start")  # ... >= 0


def _check_numbers(args) -> None:
    """ValueError naming the flag of a time, count or step of a command out of its range (NaN included)."""
    for dest in _POSITIVE + _NOT_NEGATIVE:
        value = getattr(args, dest, None)
        if value is None:
            continue
        positive = dest in _POSITIVE
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise ValueError(f"--{dest.replace('_', '-')} {value}: expected a number {'>' if positive else '>='} 0")


def _common_config(args) -> dict:
    """TrainConfig fields that train and eval share."""
    return dict(
        servers=server_list(args.servers), data=args.data, eval_data=getattr(args, "eval_data", None),
        format=args.format, label_column=args.label_column, drop_columns=_names(args.drop_columns),
        numeric_columns=_names(args.numeric_columns), max_bad_lines=args.max_bad_lines,
        libsvm_fields=args.libsvm_fields, schema=args.schema, synthetic_history=args.synthetic_history,
        synthetic_rows=args.synthetic_rows, synthetic_eval_rows=args.synthetic_eval_rows,
        synthetic_interactions=args.synthetic_interactions, synthetic_seed=args.synthetic_seed,
        model=args.model, backend=args.backend, device=args.device, embedding_dim=args.embedding_dim,
        hidden=_hidden(args.hidden), batch_size=args.batch_size, timeout_s=args.timeout_s,
        server_timeout_s=args.server_timeout, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
        auth_token_file=args.auth_token_file,
    )  # fmt: skip


def _train(args) -> int:
    from worker.train import TrainConfig, format_results, train

    cfg = TrainConfig(
        **_common_config(args),
        local_shards=args.local_shards,
        worker_id=args.worker_id,
        num_workers=args.num_workers,
        prefetch=args.prefetch,
        optimizer=args.optimizer,
        learning_rate=args.learning_rate,
        dense_optimizer=args.dense_optimizer,
        dense_learning_rate=args.dense_learning_rate,
        dense_sync_every=args.dense_sync_every,
        epochs=args.epochs,
        recipe=args.recipe,
        validation_fraction=args.validation_fraction,
        validation_data=args.validation_data,
        eval_every=args.eval_every,
        early_stop=args.early_stop,
        l2=args.l2,
        dense_l2=args.dense_l2,
        dropout=args.dropout,
        metrics_out=args.metrics_out,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        table_config=args.table_config,
        progress=not args.no_progress,
        create_tables_only=args.create_tables_only,
    )
    print(format_results(train(cfg)), flush=True)
    if cfg.metrics_out:
        print(f"metrics written to {cfg.metrics_out}")
    return 0


def _eval(args) -> int:
    import json

    from worker.train import TrainConfig, evaluate_servers, format_results

    r = evaluate_servers(TrainConfig(**_common_config(args)))
    print(json.dumps(r) if args.json else format_results(r), flush=True)
    return 0


def _synth(args) -> int:
    import dataclasses

    from worker.synthetic import SyntheticConfig, schema_text, small_data_config, write_synthetic

    if args.small:
        cfg = dataclasses.replace(small_data_config(args.seed), rows=args.start + args.rows)
    else:
        cfg = SyntheticConfig(rows=args.start + args.rows, seed=args.seed, interactions=args.interactions)
    if args.history:
        cfg = dataclasses.replace(cfg, history=args.history)
    write_synthetic(args.out, cfg, args.start, args.start + args.rows)
    print(f"wrote rows [{args.start}, {args.start + args.rows}) to {args.out}")
    if cfg.history:
        with open(args.out + ".schema.toml", "w") as f:
            f.write(schema_text(cfg))
        print(
            f"wrote its schema to {args.out}.schema.toml (train with --data {args.out} --schema {args.out}.schema.toml)"
        )
    return 0


def _schema(args) -> int:
    from worker.flags import check_input_file
    from worker.schema_infer import infer_schema_text

    check_input_file("--data", args.data, "a data file")
    if len(args.delimiter) != 1 or args.delimiter in '"\r\n':
        raise ValueError(f"--delimiter {args.delimiter!r}: expected one character other than a quote or a newline")
    text = infer_schema_text(args.data, fmt=args.format, delimiter=args.delimiter, sample_rows=args.rows)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        print(f"wrote a schema inferred from {args.data} to {args.out}")
    else:
        print(text, end="")
    return 0


def _stats(args) -> int:
    import json

    from google.protobuf.json_format import MessageToDict

    with _client(args) as client:
        client.wait_ready()
        shards = client.stats()
    if args.json:
        print(json.dumps([MessageToDict(s, preserving_proto_field_name=True) for s in shards]))
        return 0
    cols = ("num_rows", "pending_ids", "rows_in_ram", "rows_on_disk", "disk_bytes", "ram_bytes", "evictions",
            "admitted", "dropped", "pulls", "pushes")  # fmt: skip
    print(f"{'shard':>5} {'table':<12} " + " ".join(f"{c:>12}" for c in cols))
    for s in shards:
        for t in s.tables:
            print(f"{s.shard_id:>5} {t.name:<12} " + " ".join(f"{getattr(t, c):>12,}" for c in cols))
        print(f"{s.shard_id:>5} clock {s.clock}, RAM {s.ram_used_bytes / 2**20:,.1f} of "
              f"{s.ram_budget_bytes / 2**20:,.0f} MiB, journal {s.journal_bytes / 2**20:,.1f} MiB")  # fmt: skip
    return 0


def _shrink(args) -> int:
    import json

    with _client(args) as client:
        client.wait_ready()
        replies = client.shrink(args.table)
    result = {
        "dropped": sum(r.dropped for r in replies),
        "num_rows": sum(r.num_rows for r in replies),
        "pending_ids": sum(r.pending_ids for r in replies),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for i, r in enumerate(replies):
            print(f"shard {i}: dropped {r.dropped:,} ids; {r.num_rows:,} rows and {r.pending_ids:,} pending ids left")
        print(
            f"all shards: dropped {result['dropped']:,}; {result['num_rows']:,} rows, {result['pending_ids']:,} pending"
        )
    return 0


def _checkpoint(args) -> int:
    from worker.checkpoint import save

    with _client(args) as client:
        client.wait_ready()
        m = save(client, args.dir, args.hold_timeout_s)
    rows = {t["name"]: sum(s["rows"].get(t["name"], 0) for s in m["shards"]) for t in m["tables"]}
    print(f"checkpoint of {m['num_shards']} shards at clock {m['clock']} in {args.dir} ({m['seconds']:.1f} s, pushes "
          f"held {m['pushes_held_s']:.1f} s): " + ", ".join(f"{k} {v:,} rows" for k, v in rows.items()))  # fmt: skip
    return 0


def _export(args) -> int:
    """A checkpoint through the servers, then `ps-server export` of it (the server package reads RocksDB files;
    the worker does not import it)."""
    import os
    import shutil
    import subprocess

    from worker.checkpoint import save

    checkpoint = os.path.join(args.out, "checkpoint")
    with _client(args) as client:
        client.wait_ready()
        save(client, checkpoint)
    command = [sys.executable, "-m", "ps", "export", checkpoint, "--out", args.out]
    command += [] if args.since is None else ["--since", str(args.since)]
    done = subprocess.run(command)
    if done.returncode == 0 and not args.keep_checkpoint:
        shutil.rmtree(checkpoint)
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    try:
        apply_defaults(parser, argv)
    except ValueError as e:
        parser.error(str(e))
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_malloc()
    try:
        _check_numbers(args)
        commands = {"train": _train, "eval": _eval, "synth": _synth, "schema": _schema, "stats": _stats, "shrink": _shrink,
                    "checkpoint": _checkpoint, "export": _export}  # fmt: skip
        return commands[args.command](args)
    except (ValueError, PsError, OSError) as e:
        print(f"ps-worker: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ps-worker: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
