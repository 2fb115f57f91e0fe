"""Operator mistakes on the command line: each is refused before anything starts, with exit code 2 and a message
that names the flag (or file) at fault and what was expected. ps-worker runs in this process (main(argv));
ps-server runs as a subprocess, as an operator starts it, because its start-up installs signal handlers."""

from __future__ import annotations

import gzip
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import pytest

from ps.errors import echo
from worker.__main__ import main as worker_main

PY = sys.executable
EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
TINY_RUN = ["--model", "lr", "--synthetic-rows", "2000", "--synthetic-eval-rows", "500", "--no-progress"]


def worker(argv: list[str], capsys) -> tuple[int | None, str]:
    """(exit code, stderr) of `ps-worker ARGV`; an exception that escapes main is exit code None, its
    traceback in stderr."""
    try:
        code = worker_main(argv)
    except SystemExit as e:
        code = e.code
    except Exception:
        code = None
        traceback.print_exc()
    return code, capsys.readouterr().err


def server(argv: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """`ps-server ARGV` as a process; standard input closed, so a server that does start stops at once."""
    env = {**os.environ, **(env or {})}
    return subprocess.run([PY, "-m", "ps", "--stop-with-stdin", *argv], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA; a certificate for 127.0.0.1 and its key; another key; the first key encrypted; a text file."""
    if not shutil.which("openssl"):
        pytest.fail("these tests need the openssl command (Debian: apt install openssl)")
    d = tmp_path_factory.mktemp("pki")

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", *EC, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=ca")
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "other"):
        openssl("req", *EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "2", "-extfile", "server.ext")  # fmt: skip
    openssl("pkey", "-in", "server.key", "-aes256", "-passout", "pass:secret", "-out", "encrypted.key")
    (d / "notes.txt").write_text("not a certificate, not a key\n")
    return d


@pytest.fixture
def dead_address():
    """host:port of a port bound by nobody that listens (held for the test, so no one else takes it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"


# ---- --servers --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, env",
    [
        (["train", "--servers", "", *TINY_RUN], {}),  # `--servers "$SERVERS"` with SERVERS unset
        (["train", "--servers", " , ", *TINY_RUN], {}),
        (["train", *TINY_RUN], {"PS_SERVERS": ""}),
        (["eval", "--servers", "", "--model", "lr", "--synthetic-eval-rows", "500"], {}),
        (["stats", "--servers", ""], {}),
        (["checkpoint", "save", "ckpt", "--servers", ""], {}),
    ],
)
def test_an_empty_server_list_is_an_error_naming_the_flag(argv, env, capsys, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code, err = worker(argv, capsys)
    assert code == 2 and "--servers is empty" in err, err


def test_training_labels_of_one_value_are_refused_before_anything_starts(tmp_path, capsys):
    """A file whose every label is 0 has nothing to teach: train says so, and starts no shard (one worker; of
    several, each sees its share only, and warns)."""
    data = tmp_path / "zeros.csv"
    data.write_text("clicked,city\n" + "".join(f"0,c{i % 7}\n" for i in range(300)))
    code, err = worker(
        ["train", "--local-shards", "1", "--format", "csv", "--data", str(data), "--no-progress"], capsys
    )
    assert code == 2, err
    assert (f"'clicked' is 0 in all 300 examples of {data}: there is nothing to learn but that rate" in err
            and "nothing was trained" in err and "starting" not in err), err  # fmt: skip


def test_labels_of_one_value_without_a_validation_split_are_refused_or_warned_of(tmp_path, capsys, caplog):
    """No split counts the labels: the examples held in memory (--validation-fraction 0) do, so the run is refused
    as with a split; a streamed read (--recipe large) counts them as it trains, and warns at the end."""
    data = tmp_path / "zeros.csv"
    data.write_text("clicked,city\n" + "".join(f"0,c{i % 7}\n" for i in range(300)))
    base = ["train", "--local-shards", "1", "--format", "csv", "--data", str(data), "--no-progress"]
    code, err = worker([*base, "--validation-fraction", "0"], capsys)
    assert code == 2 and f"'clicked' is 0 in all 300 examples of {data}" in err and "nothing was trained" in err, err
    caplog.clear()
    code, err = worker([*base, "--recipe", "large"], capsys)
    assert code == 0, err
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(f"'clicked' is 0 in all 300 examples of {data}" in m and "learned only that rate" in m
               for m in said), said  # fmt: skip


@pytest.mark.parametrize("fmt, line, why", [
    ("criteo", "\t".join(["3"] * 13 + ["a1"] * 26), r"more of its first lines have 39 tab-separated columns than "
                                                      r"40: a Criteo test file, or"),
    ("libsvm", "3:1 7:1", "its lines start with a feature token, not a label"),
])  # fmt: skip
def test_training_or_eval_data_without_labels_is_named_so(tmp_path, capsys, fmt, line, why):
    """A Criteo test file (no label column) or unlabeled libsvm given to train: said to have no labels, with
    predict named, not each line called malformed."""
    unlabeled = tmp_path / f"u.{fmt}"
    unlabeled.write_text((line + "\n") * 50)
    labeled = tmp_path / f"l.{fmt}"
    labeled.write_text(("1\t" + line if fmt == "criteo" else "1 " + line) + "\n" + ("0\t" + line if fmt == "criteo"
                       else "0 " + line) + "\n")  # fmt: skip
    base = ["train", "--local-shards", "1", "--format", fmt, "--no-progress"]
    for flags, flag, path in ((["--data", str(unlabeled)], "--data", unlabeled),
                              (["--data", str(labeled), "--eval-data", str(unlabeled)], "--eval-data", unlabeled)):  # fmt: skip
        code, err = worker([*base, *flags], capsys)
        assert code == 2 and re.search(rf"{flag} {re.escape(str(path))} has no labels \({why}", err), err
        assert "ps-worker predict` scores a file without labels" in err, err


def test_local_shards_start_only_when_asked_for(capsys, monkeypatch):
    code, err = worker(["train", *TINY_RUN], capsys)
    assert code == 2 and "no servers: give --servers" in err and "--local-shards N" in err, err
    code, err = worker(["train", "--servers", "127.0.0.1:5000", "--local-shards", "2", *TINY_RUN], capsys)
    assert code == 2 and "give --servers or --local-shards, not both" in err, err
    monkeypatch.setenv("PS_SERVERS", "127.0.0.1:5000")  # set for the cluster's jobs: the flag alone was typed
    code, err = worker(["train", "--local-shards", "2", *TINY_RUN], capsys)
    assert code == 2 and "not both (either may come from its flag, its variable PS_SERVERS or" in err, err
    monkeypatch.delenv("PS_SERVERS")
    code, err = worker(["train", "--local-shards", "0", *TINY_RUN], capsys)
    assert code == 2 and "argument --local-shards: expected an integer >= 1, got 0" in err, err
    code, err = worker(["train", "--local-shards", "1", "--create-tables-only", *TINY_RUN], capsys)
    assert code == 2 and "--create-tables-only sets up tables on servers that outlive the run" in err, err


@pytest.mark.parametrize("servers, entry", [("a:1,,b:2", "entry 1 ('')"), ("ps-0", "entry 0 ('ps-0')"),
                                            ("ps-0:5000,ps-1:0", "entry 1 ('ps-1:0')")])  # fmt: skip
def test_a_server_that_is_not_host_port_is_named(servers, entry, capsys):
    code, err = worker(["stats", "--servers", servers, "--server-timeout", "1"], capsys)
    assert code == 2 and f"--servers {servers!r}: {entry} is not host:port" in err, err


@pytest.mark.parametrize("name", ["a/b", "x" * 129, "emb table"])
def test_a_shrink_of_a_table_name_no_table_may_have_is_refused_before_any_server_is_asked(name, capsys):
    """Port 1 has no server: a name that reached one would wait --server-timeout for it, not exit 2."""
    code, err = worker(["shrink", "--servers", "127.0.0.1:1", "--server-timeout", "30", "--table", name], capsys)
    said = f"argument --table: table name {echo(name)} is invalid; expected 1-128 characters of [A-Za-z0-9_.-]"
    assert code == 2 and said in err, err


@pytest.mark.parametrize("servers, hint", [("http://127.0.0.1:5611", "(no scheme: 127.0.0.1:5611)"),
                                           ("ps-0:5000/tables", "(no scheme, path or user part: host:port alone)")])  # fmt: skip
def test_a_server_given_as_a_url_is_refused_at_once_saying_what_to_write(servers, hint, capsys):
    code, err = worker(["stats", "--servers", servers, "--server-timeout", "30"], capsys)
    assert code == 2 and "is not host:port with a port in 1..65535 " + hint in err, err


# ---- TLS files ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cert, key, message",
    [
        ("server.pem", "other.key", "TLS key (--tls-key) {d}/other.key is not the private key of TLS certificate "
                                    "(--tls-cert) {d}/server.pem: their public keys differ"),
        ("server.pem", "notes.txt", "TLS key (--tls-key) {d}/notes.txt holds no PEM private key"),
        ("server.pem", "server.pem", "TLS key (--tls-key) {d}/server.pem holds no PEM private key"),
        ("notes.txt", "server.key", "TLS certificate (--tls-cert) {d}/notes.txt holds no PEM certificate"),
    ],
)  # fmt: skip
def test_the_server_names_the_tls_file_that_is_wrong_before_it_binds(pki, tmp_path, cert, key, message):
    data_dir = tmp_path / "shard"
    r = server(["--data-dir", str(data_dir), "--tls-cert", str(pki / cert), "--tls-key", str(pki / key)])
    assert r.returncode == 2 and message.format(d=pki) in r.stderr, r.stderr
    assert "Failed to bind" not in r.stderr and "Traceback" not in r.stderr
    assert not data_dir.exists()  # a refused start-up changes nothing


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--tls-cert", "server.pem", "--tls-key", "other.key"], "{d}/other.key is not the private key of TLS "
                                                                 "certificate (--tls-cert) {d}/server.pem"),
        (["--tls-cert", "server.pem", "--tls-key", "encrypted.key"], "{d}/encrypted.key is encrypted"),
        (["--tls-cert", "server.pem", "--tls-key", "notes.txt"], "{d}/notes.txt holds no PEM private key"),
        (["--tls-ca", "notes.txt"], "TLS CA (--tls-ca) {d}/notes.txt holds no PEM certificate"),
    ],
)  # fmt: skip
def test_the_worker_names_the_tls_file_that_is_wrong_before_it_dials(pki, dead_address, flags, message, capsys):
    """Not a 30 s wait for a connection that cannot come up, then 'did not accept a connection'."""
    flags = [str(pki / f) if i % 2 else f for i, f in enumerate(flags)]
    code, err = worker(["stats", "--servers", dead_address, "--server-timeout", "5", *flags], capsys)
    assert code == 2 and message.format(d=pki) in err, err


# ---- --server-timeout at start-up -----------------------------------------------------------------------


@pytest.mark.parametrize("command", [["stats"], ["train", *TINY_RUN]])
def test_the_start_up_wait_for_the_servers_is_server_timeout(command, dead_address, capsys):
    started = time.monotonic()
    code, err = worker([*command, "--servers", dead_address, "--server-timeout", "1"], capsys)
    assert code == 2 and f"shard 0 at {dead_address} did not accept a connection within 1 s" in err, err
    assert time.monotonic() - started < 29  # the 1 s given, plus start-up: far from a 30 s wait


def test_a_data_dir_this_user_may_not_write_is_said_so_and_left_as_it_was(request):
    """An empty dir, or a shard's data dir, owned by another user. Before: "cannot open RocksDB at DIR:
    Permission denied (os error 13)", not saying whose the dir is or what to do."""
    from ps.engine.shard import Shard
    from ps.server_config import ServerConfig
    from tests import asnobody

    reason = asnobody.why_not()
    if reason:
        pytest.skip(reason)
    reachable = pathlib.Path(tempfile.mkdtemp(prefix="sparseps-nobody-"))  # pytest's tmp_path is root's alone (0700)
    request.addfinalizer(lambda: shutil.rmtree(reachable))
    os.chmod(reachable, 0o755)
    empty = reachable / "empty"
    empty.mkdir()
    shard = reachable / "shard"
    Shard(ServerConfig(data_dir=str(shard))).close()  # a shard's data dir, root's, readable by all (a copy, say)
    for folder, _, names in os.walk(shard):
        os.chmod(folder, 0o755)
        for name in names:
            os.chmod(os.path.join(folder, name), 0o644)
    for data_dir in (empty, shard):
        before = sorted(os.listdir(data_dir))
        r = asnobody.run(["timeout", "120", PY, "-m", "ps", "--data-dir", str(data_dir)], stdin=subprocess.DEVNULL)
        assert (
            r.returncode == 2
            and (
                f"ps-server: error: cannot start on data dir {data_dir}: permission denied on {data_dir} (RocksDB: "
                "Permission denied (os error 13)): run ps-server as the user that owns the data dir (uid "
            )
            in r.stderr
        ), r.stderr
        assert "Traceback" not in r.stderr and sorted(os.listdir(data_dir)) == before


# ---- export's OUT ----------------------------------------------------------------------------------------


def test_an_export_out_that_cannot_be_created_is_named_with_its_flag(tmp_path, dead_address, capsys):
    """Before: "error: [Errno 20] Not a directory: '.../x'", naming no flag, from both export commands."""
    from tests.conftest import one_table_checkpoint

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    out = blocker / "export"
    why = f"cannot be created: Not a directory ({out}); give a path whose parents are directories"
    code, err = worker(["export", "--servers", dead_address, "--server-timeout", "1", str(out)], capsys)
    assert code == 2 and f"ps-worker: error: OUT {out} {why}" in err, err
    checkpoint = one_table_checkpoint(tmp_path, 10)
    r = subprocess.run([PY, "-m", "ps", "export", checkpoint, "--out", str(out), "--no-progress"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and f"ps-server export: error: --out {out} {why}" in r.stderr, r.stderr
    assert blocker.read_text() == "not a directory\n"


# ---- data files -----------------------------------------------------------------------------------------


def test_a_directory_given_as_a_file_is_called_a_directory(tmp_path, capsys):
    code, err = worker(["train", "--local-shards", "1", "--table-config", str(tmp_path), *TINY_RUN], capsys)
    assert code == 2 and f"--table-config {tmp_path} is a directory; expected a" in err, err


@pytest.mark.parametrize("flag", ["--data", "--eval-data", "--validation-data"])
def test_a_data_directory_without_data_files_says_so(flag, tmp_path, capsys):
    data = tmp_path / "train.txt"
    data.write_text("")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "_SUCCESS").write_text("")
    extra = ["--data", str(data)] if flag != "--data" else []
    code, err = worker(["train", "--local-shards", "1", *extra, flag, str(tmp_path / "empty"), *TINY_RUN], capsys)
    assert code == 2 and f"{flag}: {tmp_path / 'empty'} is a directory holding no data file" in err, err


def test_a_missing_data_file_says_so_and_what_is_expected(tmp_path, capsys):
    code, err = worker(["eval", "--servers", "127.0.0.1:5000", "--data", str(tmp_path / "nope.txt")], capsys)
    assert code == 2 and f"--data {tmp_path / 'nope.txt'} does not exist; expected a data file (.gz" in err, err
    code, err = worker(["eval", "--servers", "127.0.0.1:5000", "--data", str(tmp_path / "nope.txt"), "--format",
                        "criteo"], capsys)  # fmt: skip
    assert code == 2 and f"--data {tmp_path / 'nope.txt'} does not exist; expected a criteo data file" in err, err


def _gzip_cases(tmp_path) -> dict[str, bytes]:
    good = gzip.compress(b"1\t" + b"2\t" * 13 + b"a\t" * 25 + b"b\n" * 200)
    flipped = bytearray(good)
    flipped[-6] ^= 0xFF  # in the CRC of the trailer
    return {"text": b"1\t2\t3\n", "cut short": good[: len(good) // 2], "bad crc": bytes(flipped)}


@pytest.mark.parametrize("case", ["text", "cut short", "bad crc"])
def test_a_gz_file_that_is_not_gzip_is_named(case, tmp_path, capsys):
    path = tmp_path / "day_0.gz"
    path.write_bytes(_gzip_cases(tmp_path)[case])
    code, err = worker(["train", "--local-shards", "1", "--data", str(path), *TINY_RUN], capsys)
    said = "the gzip file is cut short" if case == "cut short" else "its name ends in .gz, but it does not read as gzip"
    assert code == 2 and f"{path}: {said}" in err, err


# ---- counts, times, ports -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["--threads", "0"], {}, "argument --threads: expected an integer >= 1, got 0"),
        ([], {"PS_THREADS": "0"}, "PS_THREADS (for --threads): expected an integer >= 1, got 0"),
        (["--port", "70000"], {}, "argument --port: expected an integer in 0..65535, got 70000"),
        (["--num-shards", "0"], {}, "argument --num-shards: expected an integer >= 1, got 0"),
        (["--metrics-port", "-1"], {}, "argument --metrics-port: expected an integer in 0..65535, got -1"),
        (["--flush-interval-s", "nan"], {}, "--flush-interval-s: expected a number > 0 and <= 1e+07, got 'nan'"),
        (["--flush-interval-s", "1e10"], {}, "--flush-interval-s: expected a number > 0 and <= 1e+07, got '1e10'"),
        (["--flush-interval-s", "0"], {}, "--flush-interval-s: expected a number > 0 and <= 1e+07, got '0'"),
        (["--port", "47999", "--metrics-port", "47999"], {}, "--metrics-port 47999 is --port too"),
        (["--data-dir", ""], {}, "--data-dir is empty"),
        # `--restore "$CKPT"` with CKPT unset: not a new shard with no tables, as if no --restore were given
        (["--restore", ""], {}, "--restore is empty (''): give the checkpoint to fill the data dir from"),
        ([], {"PS_RESTORE": " "}, "--restore is empty (' '): give the checkpoint"),
        (["--checkpoint-root", __file__], {}, f"--checkpoint-root {__file__} is not a directory"),
        (["--cache-bytes", "0"], {}, "argument --cache-bytes: expected a size of at least 1 byte"),
        (
            ["--cache-bytes", "infG"],
            {},
            "argument --cache-bytes: expected a whole number of bytes or a size such as 512M or 2G",
        ),
        (
            ["--cache-bytes", "1e30"],
            {},
            "--cache-bytes must be at least 1 byte and at most 1024T (1,125,899,906,842,624 "
            "bytes, beyond any machine's memory), got 1,000,000,000,000,000,000,000,000,000,000",
        ),
        (["--memory-bytes", "1025T"], {}, "--memory-bytes must be at least 1 byte and at most 1024T"),
        (["--host", ""], {}, "--host is empty (''): give an address of this machine (127.0.0.1: this machine only"),
        ([], {"PS_HOST": "[]"}, "--host is empty ('[]'): give an address of this machine"),
        (["--cache-bytes", "1"], {}, "--cache-bytes 1 B is less than any table can use"),
        (["--cache-bytes", "20K"], {"PS_MEMORY_BYTES": "1G"}, "--cache-bytes 20.0 KiB is less than any table"),
        (["--reply-bytes", "-1"], {}, "argument --reply-bytes: expected a size of at least 0 bytes"),
        (["--reply-read-timeout-s", "-1"], {}, "--reply-read-timeout-s: expected a number >= 0 and <= 1e+07, got"),
        ([], {"PS_REPLY_READ_TIMEOUT_S": "nan"}, "expected a number >= 0 and <= 1e+07, got 'nan'"),
        (
            ["--reply-read-timeout-s", "1e-9"],
            {},
            "--reply-read-timeout-s must be 0 (no limit) or from 1 to 1e+07 s (a shorter limit cancels the calls of "
            "large replies their callers are still reading), got 1e-09",
        ),
        (
            ["--reply-bytes", "64M"],
            {},
            "--reply-bytes 64.0 MiB is too small for one reply: ps-worker asks this server for up to 64.0 MiB of "
            "rows a request (its largest message), and a reply is held 2 times while it is sent; give --reply-bytes "
            "128.0 MiB (134,217,888 bytes) or more (0: no bound)",
        ),
        (
            ["--reply-bytes", "16M"],
            {"PS_MEMORY_BYTES": "1G"},
            "for up to 8.0 MiB of rows a request (1/16 of the server's request room, the `requests` part of "
            "--memory-bytes), and a reply is held 2 times while it is sent; give --reply-bytes 16.0 MiB (16,777,376 "
            "bytes) or more",
        ),
    ],
)
def test_server_counts_and_times_are_checked_and_name_their_flag(argv, env, message, tmp_path):
    r = server(["--data-dir", str(tmp_path / "shard"), *argv], env)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not (tmp_path / "shard").exists()


@pytest.mark.parametrize("argv, env", [(["--reply-bytes", "0"], {}), ([], {"PS_REPLY_BYTES": "0"})])
def test_a_reply_room_of_0_is_no_bound_and_starts(argv, env, tmp_path):
    r = server(["--data-dir", str(tmp_path / "shard"), "--log-level", "INFO", *argv], env)
    assert r.returncode == 0, r.stderr
    assert "reply_bytes" in r.stderr or "reply-bytes" in r.stderr, r.stderr  # the setting given, as logged


@pytest.mark.parametrize("flag", ["--data-dir", "--restore", "--checkpoint-root"])
def test_a_path_that_is_no_utf8_is_refused_before_anything_is_made(flag, tmp_path):
    """A name of bytes that are not UTF-8 (Python's os.fsdecode gives it surrogates, which rocksdict cannot take)."""
    odd = os.fsencode(tmp_path) + b"/caf\xe9"  # latin-1's e acute
    given = [odd] if flag == "--data-dir" else [os.fsencode(tmp_path / "shard"), flag, odd]
    r = subprocess.run([PY, "-m", "ps", "--stop-with-stdin", "--data-dir", *given], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=120)  # fmt: skip
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 2 and "is no UTF-8 path name: RocksDB takes UTF-8 paths only" in err and flag in err, err
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--local-shards", "1", "--batch-size", "0"], "argument --batch-size: expected an integer >= 1, got 0"),
        (["train", "--local-shards", "1", "--embedding-dim", "0"], "--embedding-dim: expected an integer >= 1, got 0"),
        (["train", "--local-shards", "1", "--num-workers", "0"], "--num-workers: expected an integer >= 1, got 0"),
        (["train", "--local-shards", "1", "--timeout-s", "nan"], "--timeout-s: expected a number > 0 and <= 1e+07, got 'nan'"),
        (["train", "--local-shards", "1", "--server-timeout", "-1"], "--server-timeout: expected a number >= 0 and <= 1e+07, got '-1'"),
        (["train", "--local-shards", "1", "--barrier-timeout", "1e10"], "--barrier-timeout: expected a number > 0 and <= 3600"),
        (["train", "--local-shards", "1", "--metrics-port", "70000"], "--metrics-port: expected an integer in 0..65535"),
        (["train", "--local-shards", "1", "--metrics-out", "/nonexistent-dir/m.json"],
         "--metrics-out /nonexistent-dir/m.json: its directory /nonexistent-dir does not exist"),
        (["checkpoint", "save", "ckpt", "--servers", "127.0.0.1:5000", "--hold-timeout-s", "nan"],
         "argument --hold-timeout-s: expected a number > 0 and <= 3600, got 'nan'"),
        (["checkpoint", "save", "ckpt", "--servers", "127.0.0.1:5000", "--hold-timeout-s", "5000"],
         "argument --hold-timeout-s: expected a number > 0 and <= 3600, got '5000'"),  # the servers' bound
        (["export", "out", "--servers", "127.0.0.1:5000", "--since", "-1"], "argument --since: expected an integer >= 0, got -1"),
        (["train", "--local-shards", "1", "--hidden", "64,,32"], "--hidden '64,,32': expected comma-separated integers"),
    ],
)  # fmt: skip
def test_worker_counts_and_times_are_checked_and_name_their_flag(argv, message, capsys):
    code, err = worker([*argv, *(TINY_RUN if argv[0] == "train" else [])], capsys)
    assert code == 2 and message in err, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "fm", "--embedding-dim", "4096"],
         "--embedding-dim 4096: expected 1..4095 for --model fm (its rows hold the 4096 floats of an embedding and 1 "
         "of the linear term: 4097, and a server holds rows of at most 4096)"),
        (["--model", "deepfm", "--embedding-dim", "5000"], "--embedding-dim 5000: expected 1..4095 for --model deepfm"),
        (["--model", "dnn", "--embedding-dim", "4097"],
         "--embedding-dim 4097: expected 1..4096 for --model dnn (its rows hold the 4097 floats of an embedding, and"),
        (["--model", "dnn", "--hidden", "64,5000"],
         "--hidden 64,5000: expected widths in 1..4096 (a layer's parameters are rows of its width, and a server "
         "holds rows of at most 4096 floats)"),
        (["--model", "deepfm", "--hidden", "64,0"], "--hidden 64,0: expected widths in 1..4096"),
    ],
)  # fmt: skip
def test_an_embedding_dim_or_hidden_width_past_a_servers_rows_is_refused_naming_its_flag_before_servers_are_asked(
    argv, message, dead_address, capsys, tmp_path
):
    (tmp_path / "d.tsv").write_text("1\t2\n")
    predict = ["predict", "--data", str(tmp_path / "d.tsv"), "--out", str(tmp_path / "p.tsv")]
    for command in (["train", "--synthetic-rows", "100"], ["eval"], predict, ["launch", "--workers", "2"]):
        code, err = worker([*command, "--servers", dead_address, "--server-timeout", "0", "--timeout-s", "1", *argv],
                           capsys)  # fmt: skip
        assert code == 2 and message in err and "accept a connection" not in err, (command, err)
    from worker.train_config import TrainConfig

    for model, dim in (("fm", 4095), ("deepfm", 4095), ("dnn", 4096), ("lr", 10_000)):  # the widest a server holds
        TrainConfig(servers=("h:1",), model=model, embedding_dim=dim, hidden=(4096, 1)).validate()


@pytest.mark.parametrize("model", ["fm", "deepfm"])
def test_a_schema_dim_past_the_models_rows_is_refused_naming_the_file_and_table_before_servers_are_asked(
    model, dead_address, capsys, tmp_path
):
    data, schema = tmp_path / "d.csv", tmp_path / "s.toml"
    data.write_text("label,a\n1,x\n0,y\n1,x\n0,y\n")
    schema.write_text('label = "label"\n[tables.wide]\ndim = 4096\n[[columns]]\nname = "a"\nkind = "categorical"\n'
                      'table = "wide"\n')  # fmt: skip
    message = (f"{schema}: [tables.wide]: dim 4096: expected 1..4095 for --model {model} (its rows hold the 4096 "
               "floats of an embedding and 1 of the linear term: 4097, and a server holds rows of at most 4096)")  # fmt: skip
    hidden = ["--hidden", "4"] if model == "deepfm" else []
    for command in (["train"], ["eval"], ["launch", "--workers", "2"]):
        code, err = worker([*command, "--servers", dead_address, "--server-timeout", "0", "--timeout-s", "1",
                            "--data", str(data), "--schema", str(schema), "--model", model, *hidden], capsys)  # fmt: skip
        assert code == 2 and message in err and "accept a connection" not in err, (command, err)


MLP_ONLY = "is the MLP's (--model deepfm, dnn) setting; this run has --model"
ALL_MODEL_COMMANDS = ("train", "eval", "predict", "launch")


@pytest.mark.parametrize(
    "argv, commands, message",
    [
        (["--model", "lr", "--hidden", "8,4"], ALL_MODEL_COMMANDS, f"--hidden 8,4 {MLP_ONLY} lr, which would ignore it"),
        (["--hidden", "400,400,400"], ALL_MODEL_COMMANDS, f"--hidden 400,400,400 {MLP_ONLY} fm, which would ignore it"),
        (["--model", "fm", "--dropout", "0"], ("train", "launch"), f"--dropout 0.0 {MLP_ONLY} fm, which would ignore it"),
        (["--model", "lr", "--dropout", "0.3"], ("train", "launch"), f"--dropout 0.3 {MLP_ONLY} lr, which would ignore it"),
        (["--model", "lr", "--dense-l2", "0.5"], ("train", "launch"), f"--dense-l2 0.5 {MLP_ONLY} lr, which would"),
        (["--dense-l2", "1"], ("train", "launch"), f"--dense-l2 1.0 {MLP_ONLY} fm, which would"),
    ],
)  # fmt: skip
def test_a_model_flag_the_model_would_ignore_is_refused_naming_it_before_servers_are_asked(
    argv, commands, message, dead_address, capsys, tmp_path
):
    """lr and fm have no MLP: --hidden, --dropout and --dense-l2 (on the MLP's weights only) would change nothing.
    Refused as given, even as the default's value, by every command that takes the flag, before any server is
    asked."""
    where = {"train": ["train", "--synthetic-rows", "100"], "eval": ["eval"], "launch": ["launch", "--workers", "2"],
             "predict": ["predict", "--predict-data", str(tmp_path / "p.csv"), "--out", str(tmp_path / "o.csv")]}  # fmt: skip
    for command in commands:
        code, err = worker([*where[command], "--servers", dead_address, "--server-timeout", "0", "--timeout-s", "1",
                            *argv], capsys)  # fmt: skip
        assert code == 2 and message in err and "accept a connection" not in err, (command, err)
    assert os.listdir(tmp_path) == []


def test_model_flags_the_model_uses_or_that_are_left_unset_are_taken():
    from worker.cli_train_config import train_config_from_argv
    from worker.train_config import TrainConfig
    from worker.train_config_ignored import check_model_settings

    for model in ("lr", "fm", "deepfm", "dnn"):  # unset: each model's defaults, nothing refused
        cfg = train_config_from_argv(["--servers", "h:1", "--model", model], environ={})
        assert (cfg.hidden, cfg.dropout, cfg.dense_l2) == ((400, 400, 400), None, None)
    for model in ("deepfm", "dnn"):
        given = ["--servers", "h:1", "--model", model, "--hidden", "8,4", "--dropout", "0.2", "--dense-l2", "0.5"]
        cfg = train_config_from_argv(given, environ={})
        assert (cfg.hidden, cfg.dropout, cfg.dense_l2) == ((8, 4), 0.2, 0.5)
    with pytest.raises(ValueError, match="--dense-l2 0.5 is the MLP's"):  # a --schema's projections take none
        check_model_settings(TrainConfig(model="fm", schema="tables.toml", dense_l2=0.5))
    for model in ("lr", "fm"):  # the recipe's dropout and dense L2 are the MLP's: not filled in, so not refused
        resolved, _, _ = TrainConfig(model=model, local_shards=1).with_recipe(1000)
        assert (resolved.dropout, resolved.dense_l2) == (None, None)
        check_model_settings(resolved)
    resolved, _, _ = TrainConfig(model="deepfm", local_shards=1).with_recipe(1000)
    assert resolved.dropout and resolved.dense_l2
    with pytest.raises(ValueError, match=r"--dense-l2 0.5 is the MLP's"):
        check_model_settings(TrainConfig(model="fm", dense_l2=0.5))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dim", "0"], "argument --dim: expected an integer in 1..4096, got 0"),
        (["--dim", "100000"], "argument --dim: expected an integer in 1..4096, got 100000"),  # a server takes none
        (["--servers", "0"], "argument --servers: expected an integer >= 1, got 0"),
        (["--ids", "inf"], "argument --ids: expected a whole number (1e9 is fine), got 'inf'"),
        (["--ids", "1e30"], "argument --ids: expected a whole number in 1..18446744073709551616, got '1e30'"),
        (["--hot-fraction", "2"], "argument --hot-fraction: expected a number >= 0 and <= 1, got '2'"),
    ],
)
def test_size_checks_its_counts_and_names_the_flag(argv, message):
    r = subprocess.run([PY, "-m", "ps", "size", "--ids", "1e6", "--dim", "8", *argv], capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_a_mistyped_server_command_is_named_and_touches_nothing(tmp_path):
    r = subprocess.run([PY, "-m", "ps", "verfy", str(tmp_path / "d")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown command 'verfy': the commands are export, size, verify, health" in r.stderr
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_port_another_process_listens_on_is_refused_naming_it(host, tmp_path):
    """localhost is ::1 and 127.0.0.1 where the host has IPv6: gRPC alone would listen on ::1 only, and clients of
    127.0.0.1 would reach the other process."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = server(["--data-dir", str(tmp_path / "d"), "--host", host, "--port", str(port)])
    assert r.returncode == 2, r.stderr
    assert (f"ps-server: error: cannot listen on {host}:{port} (--host, --port): port {port} of 127.0.0.1 is in use "
            "(Address already in use): stop what listens there, or give another --port") in r.stderr  # fmt: skip
    assert "Traceback" not in r.stderr and not (tmp_path / "d").exists()


@pytest.mark.parametrize("host, message", [
    ("192.0.2.1", "192.0.2.1 port 0: Cannot assign requested address: is --host an address of this machine?"),
    ("no such host!", "the host 'no such host!' is no address or name that resolves"),
])  # fmt: skip
def test_a_host_the_server_cannot_listen_on_says_why(host, message, tmp_path):
    r = server(["--data-dir", str(tmp_path / "d"), "--host", host])
    assert r.returncode == 2 and f"ps-server: error: cannot listen on {host}:0 (--host, --port): {message}" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "d").exists()


@pytest.mark.parametrize("command", [[], ["size"], ["health"], ["verify"], ["export"]])
def test_server_help_states_each_default_once(command):
    r = subprocess.run([PY, "-m", "ps", *command, "--help"], capture_output=True, text=True, timeout=60)
    text = " ".join(r.stdout.split())
    assert r.returncode == 0 and "(default: None)" not in text and "(default: False)" not in text, text
    assert not re.search(r"default[^()]*\)\s*\(default:", text), text


def test_a_memory_bound_past_the_machines_ram_is_warned_of(tmp_path):
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    r = server(["--data-dir", str(tmp_path / "shard"), "--memory-bytes", str(physical * 4)])
    assert r.returncode == 0, r.stderr
    assert re.search(r"WARNING .*--memory-bytes [\d,.]+ [GT]iB is more than this (machine's RAM|container's memory "
                     r"limit \(cgroup\)) of [\d,.]+ [KMGT]iB", r.stderr)  # fmt: skip
    r = server(["--data-dir", str(tmp_path / "shard"), "--memory-bytes", "1G"])
    assert r.returncode == 0 and "is more than this" not in r.stderr, r.stderr


def test_the_memory_limit_is_a_containers_cgroup_limit_where_lower_than_the_ram(tmp_path):
    """A pod's limits.memory (cgroup v2 memory.max, v1 memory.limit_in_bytes) bounds what --memory-bytes may
    take; "max", or v1's huge number, leaves the machine's RAM."""
    from ps.cli_server import memory_limit

    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    v2.write_text("max\n")
    v1.write_text(f"{2**63 - 4096}\n")
    assert memory_limit((str(v2), str(v1), str(tmp_path / "none"))) == (physical, "this machine's RAM of")
    v2.write_text(f"{10 << 30}\n")
    assert memory_limit((str(v2), str(v1))) == (min(10 << 30, physical), "this container's memory limit (cgroup) of"
                                                if physical > 10 << 30 else "this machine's RAM of")  # fmt: skip
    v2.write_text("1073741824\n")
    assert memory_limit((str(tmp_path / "none"), str(v2))) == (1 << 30, "this container's memory limit (cgroup) of")


def test_a_checkpoint_root_this_user_cannot_write_is_warned_of_at_start(tmp_path, monkeypatch, caplog):
    from ps.server import Server
    from ps.server_config import ServerConfig

    root = tmp_path / "ckpt"
    root.mkdir()
    real_access = os.access
    monkeypatch.setattr("ps.server.os.access", lambda p, mode: p != str(root) and real_access(p, mode))  # as for
    server = Server(ServerConfig(data_dir=str(tmp_path / "d"), port=0, checkpoint_root=str(root)))  # another user
    server.stop(grace_s=1)
    assert f"--checkpoint-root {root} is not writable by this user: checkpoint saves" in caplog.text, caplog.text


@pytest.mark.parametrize(
    "argv",
    [["-m", "ps", "size", "--ids", "1e6", "--dim", "8", "--optimizer", "adagrad", "--servers", "2"],
     ["-m", "worker", "synth", "--rows", "10", "--out", "{tmp}/s.tsv"]],
)  # fmt: skip
def test_a_command_whose_output_reader_left_exits_quietly(argv, tmp_path):
    """`ps-server size | head -1`: the pipe's reader gone, the command stops as other tools do (exit 141, no
    traceback), not with Python's BrokenPipeError."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # gone before the first write
    try:
        argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
        done = subprocess.run([sys.executable, *argv], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert done.returncode == 141 and done.stderr == "", done.stderr


@pytest.mark.parametrize("address", ["127.0.0.1:99999", "nohost", "host:"])
def test_a_health_probe_of_an_address_that_is_not_host_port_is_refused(address):
    """A port past 65535 was probed modulo 65536 (another process's port): refused, as the worker refuses it."""
    r = subprocess.run([sys.executable, "-m", "ps", "health", address], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"expected host:port with a port in 1..65535, got {address!r}" in r.stderr, r.stderr


def test_addresses_of_every_form_a_cluster_uses_are_taken():
    from worker.flags import server_list

    forms = ["127.0.0.1:5000", "[::1]:5000", "my_host:5000", "ps-0.ps.default.svc.cluster.local:5000",
             "dns:///ps-0:5000"]  # fmt: skip
    assert server_list(",".join(forms)) == tuple(forms)


@pytest.mark.parametrize("given, refused", [("64M", False), ("0", False), ("1024T", False), ("1025T", True),
                                            ("1e30", True), ("-1", True)])  # fmt: skip
def test_a_workers_row_cache_bytes_beyond_any_machines_memory_is_refused_naming_the_flag(given, refused, capsys):
    """--row-cache-bytes takes the servers' bound (MAX_MEMORY_BYTES): a typo of 64T for 64G is no silent "no bound"."""
    from worker.__main__ import build_parser

    if not refused:
        assert build_parser().parse_args(["train", "--row-cache-bytes", given]).row_cache_bytes >= 0
        return
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--row-cache-bytes", given])
    err = capsys.readouterr().err
    assert "argument --row-cache-bytes: expected bytes from 0 to 1024T (" in err and f", got {given!r}" in err
