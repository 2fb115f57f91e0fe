"""ps.emptyflags: a flag given empty is refused naming it, by one rule for ps-server's --host and --restore, the
secret files' flags and ps-worker's --metrics-host."""

from __future__ import annotations

import pytest

from ps.emptyflags import refuse_empty_host, refuse_empty_path
from ps.secretfiles import refuse_empty
from ps.server_config import ServerConfig
from worker.train_config_ignored import DEFAULT_METRICS_HOST, check_given_metrics_host

EMPTY_HOSTS = ["", " ", "\t", "[]", "[ ]"]
HOSTS = ["127.0.0.1", "0.0.0.0", "::1", "[::1]", "localhost", "h"]


@pytest.mark.parametrize("host", EMPTY_HOSTS)
def test_both_host_flags_refuse_an_empty_host_in_the_same_words(host):
    with pytest.raises(ValueError) as server:
        ServerConfig("d", host=host).validate()
    with pytest.raises(ValueError) as worker:
        check_given_metrics_host(host, 9100)
    assert str(server.value) == (f"--host is empty ({host!r}): give an address of this machine (127.0.0.1: this "
                                 "machine only; 0.0.0.0: all of its addresses)")  # fmt: skip
    assert str(worker.value) == (f"--metrics-host is empty ({host!r}): give an address of this machine "
                                 f"({DEFAULT_METRICS_HOST}, the default: this machine only; 0.0.0.0: all of its "
                                 "addresses)")  # fmt: skip


@pytest.mark.parametrize("host", HOSTS)
def test_a_host_with_characters_passes_both(host):
    ServerConfig("d", host=host).validate()
    check_given_metrics_host(host, 9100)
    refuse_empty_host("--host", host)


def test_a_host_not_given_passes():
    refuse_empty_host("--metrics-host", None, DEFAULT_METRICS_HOST)
    check_given_metrics_host(None, None)


@pytest.mark.parametrize("path", ["", " ", "\t"])
def test_restore_and_the_secret_files_refuse_an_empty_path_by_one_rule(path):
    with pytest.raises(ValueError) as restore:
        ServerConfig("d", restore_dir=path).validate()
    assert str(restore.value) == (f"--restore is empty ({path!r}): give the checkpoint to fill the data dir from, or "
                                  "leave the flag out (an empty path is not taken as the flag left out, which would "
                                  "start the shard with no tables without a word)")  # fmt: skip
    with pytest.raises(ValueError) as secret:
        refuse_empty(("--tls-ca", None), ("--tls-cert", path))
    assert str(secret.value) == (f"--tls-cert is empty ({path!r}): give its file's path, or leave the flag out (an "
                                 "empty path is not taken as the flag left out, which would turn TLS or the token off "
                                 "without a word)")  # fmt: skip


@pytest.mark.parametrize("path", [None, "ckpt", " ckpt"])
def test_a_path_not_given_or_with_characters_passes(path):
    refuse_empty_path("--restore", path, "the checkpoint", "start the shard with no tables")
    ServerConfig("d", restore_dir=path).validate()
