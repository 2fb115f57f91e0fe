"""TLS, mutual TLS and the shared token (ps/security.py): the right credentials work, missing or wrong ones are
refused with a clear error, and health checks need no token. Certificates are made with the openssl CLI."""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections import Counter

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from protos import ps_pb2
from ps.codec import stamp_to_proto
from ps.config import TableConfig
from ps.errors import PsError, ServerUnavailableError
from ps.health import check_health
from ps.listen_address import exposure_warning
from ps.secretfiles import PEM_CERTIFICATE, READ_TOKEN_FILE, optional_token, pem_validity, read_token
from ps.security import READ_ONLY_METHODS, TokenHeader
from ps.server import Server
from ps.server_config import ServerConfig
from ps.stamp import WorkerStamp
from tests.server_process import ServerProcess
from worker.client import Client

EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args, cwd):
    assert shutil.which("openssl"), "these tests need the openssl command (Debian: apt install openssl)"
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate it signed, and a rogue CA's client."""
    d = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "rogue"):
        _openssl(
            "req", "-x509", *EC, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2", "-subj", f"/CN={ca}", cwd=d
        )
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, ca in (("server", "ca"), ("client", "ca"), ("intruder", "rogue")):
        _openssl("req", *EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        ext = "server.ext" if name == "server" else "client.ext"
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", ext, cwd=d)  # fmt: skip
    (d / "token").write_text("s3cret-token\n")
    (d / "wrong-token").write_text("guess\n")
    return d


@pytest.fixture
def start(tmp_path):
    started = []

    def run(**security) -> str:
        server = Server(ServerConfig(data_dir=str(tmp_path / f"shard-{len(started)}"), port=0, **security))
        port = server.start()
        started.append(server)
        return f"127.0.0.1:{port}"

    yield run
    for s in started:
        s.stop(grace_s=1)


def works(address, **kw) -> bool:
    """A table made, pushed and pulled (30 s a call: a fresh server compiles its kernels on the first push)."""
    with Client([address], timeout_s=30, server_timeout_s=0, **kw) as client:
        client.create_table(TableConfig("t", 2))
        ids = np.arange(3, dtype=np.uint64)
        client.push("t", ids, np.ones((3, 2)))
        return client.pull("t", ids).shape == (3, 2)


def test_tls_serves_clients_that_verify_it_and_no_plain_ones(pki, start):
    address = start(tls_cert=str(pki / "server.pem"), tls_key=str(pki / "server.key"))
    assert works(address, tls_ca=str(pki / "ca.pem"))
    with pytest.raises(ServerUnavailableError):  # a plaintext client cannot talk to a TLS server
        works(address)
    with pytest.raises(ServerUnavailableError):  # nor one that trusts another CA
        works(address, tls_ca=str(pki / "rogue.pem"))


def test_mutual_tls_requires_a_client_certificate_signed_by_the_ca(pki, start):
    address = start(tls_cert=str(pki / "server.pem"), tls_key=str(pki / "server.key"), tls_ca=str(pki / "ca.pem"))
    assert works(address, tls_ca=str(pki / "ca.pem"), tls_cert=str(pki / "client.pem"), tls_key=str(pki / "client.key"))
    with pytest.raises(ServerUnavailableError):
        works(address, tls_ca=str(pki / "ca.pem"))  # no client certificate
    with (
        Client([address], tls_ca=str(pki / "ca.pem"), timeout_s=2, server_timeout_s=1) as client,
        pytest.raises(
            ServerUnavailableError, match=r"the shard requires a client certificate \(mutual TLS\): give --tls-cert"
        ),
    ):
        client.wait_ready()  # says what it lacks, as ps-server health does
    with pytest.raises(ServerUnavailableError):
        works(
            address, tls_ca=str(pki / "ca.pem"), tls_cert=str(pki / "intruder.pem"), tls_key=str(pki / "intruder.key")
        )


def test_a_token_is_required_on_every_call_but_health_checks(pki, start):
    address = start(auth_token_file=str(pki / "token"))
    assert works(address, auth_token="s3cret-token")
    for token in (None, "guess"):
        with pytest.raises(PsError, match="UNAUTHENTICATED: missing or wrong auth token"):
            works(address, auth_token=token)
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_a_read_only_token_reads_and_is_refused_every_call_that_changes_something(pki, start, tmp_path):
    """Every method of the service: the read-only token reaches those of READ_ONLY_METHODS and gets
    PERMISSION_DENIED from the rest (a method added to the service is refused it until it is listed); the rows a
    refused push named are as they were."""
    (tmp_path / "read-token").write_text("look-only\n")
    address = start(auth_token_file=str(pki / "token"), read_token_file=str(tmp_path / "read-token"))
    ids = np.arange(3, dtype=np.uint64)
    with Client([address], timeout_s=5, server_timeout_s=0, auth_token="s3cret-token") as trainer:
        trainer.create_table(TableConfig("t", 2))
        trainer.push("t", ids, np.ones((3, 2)))
        trained = trainer.pull("t", ids)
    with Client([address], timeout_s=5, server_timeout_s=0, auth_token="look-only") as reader:
        np.testing.assert_array_equal(reader.pull("t", ids), trained)
        assert [t.name for t in reader.stats()[0].tables] == ["t"]
        with pytest.raises(PsError, match=r"PERMISSION_DENIED: PushBatch is refused to the read-only token "
                                          r"\(--read-token-file\).*nothing was changed"):  # fmt: skip
            reader.push("t", ids, np.full((3, 2), 5.0))
        with pytest.raises(PsError, match="PERMISSION_DENIED: CreateTable is refused"):
            reader.create_table(TableConfig("u", 2))
        np.testing.assert_array_equal(reader.pull("t", ids), trained)
    methods = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"].methods_by_name
    assert set(READ_ONLY_METHODS) < set(methods)
    with grpc.insecure_channel(address) as channel:
        for name in methods:
            call = channel.unary_unary(f"/sparseps.ParameterServer/{name}", request_serializer=None,
                                       response_deserializer=None)  # fmt: skip
            try:
                call(b"", metadata=[("authorization", "Bearer look-only")], timeout=10)
                code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                code = e.code()
            assert (code == grpc.StatusCode.PERMISSION_DENIED) == (name not in READ_ONLY_METHODS), (name, code)
        with pytest.raises(grpc.RpcError) as refused:
            channel.unary_unary("/sparseps.ParameterServer/Stats")(b"", metadata=[("authorization", "Bearer guess")],
                                                                   timeout=10)  # fmt: skip
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        pull = ps_pb2.PullRequest(table="t", ids=ids.astype("<u8").tobytes())
        stamp = stamp_to_proto(WorkerStamp(job=7, worker=0, num_workers=2, step=0))
        pull_batch = channel.unary_unary("/sparseps.ParameterServer/PullBatch")
        for token, request, code in (
            ("look-only", ps_pb2.PullBatchRequest(pulls=[pull], stamp=stamp), grpc.StatusCode.PERMISSION_DENIED),
            ("look-only", ps_pb2.PullBatchRequest(pulls=[pull]), grpc.StatusCode.OK),
        ):
            try:
                pull_batch(request.SerializeToString(), metadata=[("authorization", f"Bearer {token}")], timeout=10)
                seen = grpc.StatusCode.OK
            except grpc.RpcError as e:
                seen = e.code()
                assert "a PullBatch with a worker stamp (a training job's step) is refused" in e.details()
            assert seen == code
    with Client([address], timeout_s=5, server_timeout_s=0, auth_token="s3cret-token") as trainer:
        assert trainer.stats()[0].job == 0  # the refused stamp started no job


def test_the_worker_commands_read_with_the_read_only_token_and_those_that_write_change_nothing(pki, start, tmp_path,
                                                                                               capsys):  # fmt: skip
    """eval and stats work with the read-only token; train, export and shrink are refused PERMISSION_DENIED at their
    first call that would change something: the model, the clock and export's OUT are as they were."""
    from worker.__main__ import main

    (tmp_path / "read-token").write_text("look-only\n")
    root = tmp_path / "root"
    root.mkdir()
    address = start(auth_token_file=str(pki / "token"), read_token_file=str(tmp_path / "read-token"),
                    checkpoint_root=str(root))  # fmt: skip
    run = ["--servers", address, "--no-progress"]
    model = ["--model", "lr", "--synthetic-rows", "2000", "--synthetic-eval-rows", "500"]
    read = ["--auth-token-file", str(tmp_path / "read-token")]
    assert main(["train", *run, *model, "--recipe", "large", "--auth-token-file", str(pki / "token")]) == 0

    def state() -> tuple:
        with Client([address], timeout_s=5, server_timeout_s=0, auth_token="s3cret-token") as trainer:
            shard = trainer.stats()[0]
            return shard.clock, shard.job, sorted((t.name, t.num_rows, t.pushes) for t in shard.tables)

    before = state()
    capsys.readouterr()
    assert main(["eval", *run, *model, *read]) == 0
    assert "AUC" in capsys.readouterr().out
    assert main(["stats", "--servers", address, *read]) == 0
    for command, refused in ((["train", *run, *model, "--recipe", "large"], "CreateTable"),
                             (["export", *run, str(root / "out")], "Checkpoint"),
                             (["shrink", "--servers", address], "Shrink")):  # fmt: skip
        capsys.readouterr()
        assert main([*command, *read]) == 2, command
        err = capsys.readouterr().err
        assert f"PERMISSION_DENIED: {refused} is refused to the read-only token" in err and "Traceback" not in err
    assert state() == before
    assert os.listdir(root) == []  # export's OUT (and its checkpoint folder) made and removed


def test_metrics_answer_the_read_only_token_too(pki, tmp_path):
    (tmp_path / "read-token").write_text("look-only\n")
    server = Server(ServerConfig(data_dir=str(tmp_path / "shard"), port=0, metrics_port=0,
                                 auth_token_file=str(pki / "token"), read_token_file=str(tmp_path / "read-token")))  # fmt: skip
    server.start()
    try:
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        seen = {token: fetch(url, token=token) for token in ("s3cret-token", "look-only", "guess", None)}
        assert seen == {"s3cret-token": 200, "look-only": 200, "guess": 401, None: 401}
    finally:
        server.stop(grace_s=1)


def test_calls_refused_for_their_token_are_counted_in_the_metrics_by_method_and_code(pki, tmp_path):
    """sparseps_requests_total{method, code} counts the token check's refusals as the servicer counts the calls it
    sees: each call made here, by method and status, and nothing else; a path that names no method is counted as
    "other", so that callers without the token cannot add labels."""
    (tmp_path / "read-token").write_text("look-only\n")
    server = Server(ServerConfig(data_dir=str(tmp_path / "shard"), port=0, metrics_port=0,
                                 auth_token_file=str(pki / "token"), read_token_file=str(tmp_path / "read-token")))  # fmt: skip
    server.start()
    stamped = ps_pb2.PullBatchRequest(stamp=stamp_to_proto(WorkerStamp(job=7, worker=0, num_workers=2, step=0)))
    calls = [  # (method path, token, request)
        ("/sparseps.ParameterServer/Stats", None, b""),
        ("/sparseps.ParameterServer/Stats", "guess", b""),
        ("/sparseps.ParameterServer/Push", None, b""),
        ("/sparseps.ParameterServer/Made-up-1", None, b""),
        ("/another.Service/Call", "guess", b""),
        ("/sparseps.ParameterServer/CreateTable", "look-only", b""),
        ("/sparseps.ParameterServer/PullBatch", "look-only", stamped.SerializeToString()),
        ("/sparseps.ParameterServer/Stats", "look-only", b""),
        ("/sparseps.ParameterServer/Stats", "s3cret-token", b""),
    ]
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            seen = Counter()
            for path, token, request in calls:
                metadata = [("authorization", f"Bearer {token}")] if token else []
                try:
                    channel.unary_unary(path)(request, metadata=metadata, timeout=10)
                    code = "OK"
                except grpc.RpcError as e:
                    code = e.code().name
                seen[(path.rpartition("/")[2], code)] += 1
        assert seen == {("Stats", "UNAUTHENTICATED"): 2, ("Push", "UNAUTHENTICATED"): 1,
                        ("Made-up-1", "UNAUTHENTICATED"): 1, ("Call", "UNAUTHENTICATED"): 1,
                        ("CreateTable", "PERMISSION_DENIED"): 1, ("PullBatch", "PERMISSION_DENIED"): 1,
                        ("Stats", "OK"): 2}  # fmt: skip
        counted = {(labels["method"], labels["code"]): value
                   for name, labels, value in metric_samples(server.metrics_port, "s3cret-token")
                   if name == "sparseps_requests_total"}  # fmt: skip
        expected = {("Stats", "UNAUTHENTICATED"): 2, ("Push", "UNAUTHENTICATED"): 1, ("other", "UNAUTHENTICATED"): 2,
                    ("CreateTable", "PERMISSION_DENIED"): 1, ("PullBatch", "PERMISSION_DENIED"): 1,
                    ("Stats", "OK"): 2}  # fmt: skip
        assert counted == expected
    finally:
        server.stop(grace_s=1)


def metric_samples(port: int, token: str) -> list[tuple[str, dict, float]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=15) as reply:
        text = reply.read().decode()
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def test_a_read_only_token_needs_the_auth_token_and_one_of_its_own(pki, tmp_path):
    (tmp_path / "same").write_text("s3cret-token\n")
    with pytest.raises(ValueError, match="--read-token-file admits read-only callers .* give --auth-token-file too"):
        ServerConfig(data_dir=str(tmp_path / "a"), read_token_file=str(pki / "token")).validate()
    with pytest.raises(ValueError, match=r"the read-only token \(--read-token-file\) is the auth token"):
        Server(ServerConfig(data_dir=str(tmp_path / "b"), auth_token_file=str(pki / "token"),
                            read_token_file=str(tmp_path / "same")))  # fmt: skip
    with pytest.raises(ValueError, match=r"cannot read read-only token file \(--read-token-file\) .*missing"):
        Server(ServerConfig(data_dir=str(tmp_path / "c"), auth_token_file=str(pki / "token"),
                            read_token_file=str(tmp_path / "missing")))  # fmt: skip


def test_a_caller_without_the_token_is_refused_before_its_request_is_read(tmp_path):
    """Requests of 64 MiB without the token (4 at once) cost the server no memory: the refusal reads no request,
    so nothing is taken in, decompressed or parsed (a caller may send up to the 512 MiB message limit)."""
    (tmp_path / "token").write_text("s3cret-token\n")
    server = ServerProcess(tmp_path / "data", "--auth-token-file", str(tmp_path / "token"))
    address = server.started()
    try:
        before = server.status_kib("VmHWM")
        big = ps_pb2.PullRequest(table="emb", ids=bytes(64 << 20)).SerializeToString()
        with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 1 << 30)]) as channel:
            pull = channel.unary_unary("/sparseps.ParameterServer/Pull", request_serializer=None,
                                       response_deserializer=None)  # fmt: skip
            codes = []

            def call():
                with pytest.raises(grpc.RpcError) as info:
                    pull(big, timeout=60)
                codes.append(info.value.code())

            threads = [threading.Thread(target=call) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(90)
        assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 4
        grown = (server.status_kib("VmHWM") - before) >> 10
        assert grown < 64, f"the server's peak RSS grew by {grown} MiB for requests it refused"
    finally:
        server.stop_cleanly()


def test_the_worker_cli_passes_tls_and_token(pki, start):
    address = start(
        tls_cert=str(pki / "server.pem"), tls_key=str(pki / "server.key"), auth_token_file=str(pki / "token")
    )
    base = [sys.executable, "-m", "worker", "stats", "--servers", address, "--json", "--tls-ca", str(pki / "ca.pem")]
    ok = subprocess.run([*base, "--auth-token-file", str(pki / "token")], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(
        [*base, "--auth-token-file", str(pki / "wrong-token")], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode != 0 and "UNAUTHENTICATED" in bad.stderr and "Traceback" not in bad.stderr


def test_half_a_key_pair_is_a_clear_error(pki, tmp_path):
    with pytest.raises(ValueError, match="give both --tls-cert and --tls-key"):
        ServerConfig(data_dir=str(tmp_path), tls_cert=str(pki / "server.pem")).validate()
    with pytest.raises(ValueError, match="cannot read TLS key .*missing.key"):
        Server(
            ServerConfig(
                data_dir=str(tmp_path), tls_cert=str(pki / "server.pem"), tls_key=str(tmp_path / "missing.key")
            )
        )


@pytest.mark.parametrize("mode, warned", [(0o644, True), (0o604, True), (0o640, False), (0o600, False)])
def test_a_token_or_key_file_every_user_may_read_is_warned_of_at_start(pki, tmp_path, start, caplog, mode, warned):
    token, key = tmp_path / "token", tmp_path / "server.key"
    shutil.copy(pki / "token", token)
    shutil.copy(pki / "server.key", key)
    for path in (token, key):
        path.chmod(mode)
    start(tls_cert=str(pki / "server.pem"), tls_key=str(key), auth_token_file=str(token))
    for what, path in (("auth token file (--auth-token-file)", token), ("TLS key (--tls-key)", key)):
        line = f"{what} {path} is readable by every user of this machine (mode {mode:04o}): anyone logged in"
        assert (line in caplog.text) == warned, caplog.text
    assert "s3cret-token" not in caplog.text


@pytest.mark.parametrize("mode, warned", [(0o644, True), (0o640, False)])
def test_a_worker_warns_of_a_token_or_key_file_every_user_may_read(pki, tmp_path, caplog, mode, warned):
    """ps-worker's cluster commands and train (worker.cli_cluster._client, worker.job.client_for) warn as a server
    does, and read the token."""
    import argparse

    from worker.channels import client_token
    from worker.cli_cluster import _client
    from worker.job import client_for

    token, key = tmp_path / "token", tmp_path / "client.key"
    shutil.copy(pki / "token", token)
    shutil.copy(pki / "client.key", key)
    for path in (token, key):
        path.chmod(mode)
    tls = {"tls_ca": str(pki / "ca.pem"), "tls_cert": str(pki / "client.pem"), "tls_key": str(key)}
    cluster_command = argparse.Namespace(servers="127.0.0.1:1", timeout_s=1.0, server_timeout=1.0,
                                         auth_token_file=str(token), **tls)  # fmt: skip
    train = argparse.Namespace(local_shards=None, timeout_s=1.0, server_timeout_s=1.0, auth_token_file=str(token),
                               **tls)  # fmt: skip
    for make in (lambda: _client(cluster_command), lambda: client_for(train, ["127.0.0.1:1"])):
        caplog.clear()
        make().close()
        for what, path in (("auth token file (--auth-token-file)", token), ("TLS key (--tls-key)", key)):
            line = f"{what} {path} is readable by every user of this machine (mode {mode:04o}): anyone logged in"
            assert (line in caplog.text) == warned, caplog.text
        assert "s3cret-token" not in caplog.text
    assert client_token(str(token)) == (pki / "token").read_text().strip()


def fetch(url: str, context=None, token: str | None = None) -> object:
    """The HTTP status of a GET (200, 401, 404), or the name of the exception that stopped it."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=15, context=context) as reply:
            body = reply.read().decode()
            return 200 if "sparseps_requests_total" in body else f"200 without metrics: {body[:80]!r}"
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, ConnectionError, http.client.HTTPException, ssl.SSLError, OSError) as e:
        return type(getattr(e, "reason", e)).__name__


def scraper_context(pki) -> ssl.SSLContext:
    """A client context trusting pki's CA and verifying as a Prometheus scraper (Go's TLS) does: without Python
    3.13's VERIFY_X509_STRICT, which refuses pki's CA (no keyUsage extension, as `openssl req -x509` makes it)."""
    context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return context


def test_metrics_of_a_tls_and_token_server_need_the_certificate_and_the_token(pki, tmp_path):
    """The metrics port is guarded as the gRPC port: HTTPS with the server's certificate, a client certificate
    (mutual TLS), the bearer token; and only /metrics answers."""
    server = Server(ServerConfig(data_dir=str(tmp_path / "shard"), port=0, metrics_port=0,
                                 tls_cert=str(pki / "server.pem"), tls_key=str(pki / "server.key"),
                                 tls_ca=str(pki / "ca.pem"), auth_token_file=str(pki / "token")))  # fmt: skip
    server.start()
    try:
        https, http_url = f"https://127.0.0.1:{server.metrics_port}", f"http://127.0.0.1:{server.metrics_port}"
        mutual, server_only, intruder = (scraper_context(pki) for _ in range(3))
        mutual.load_cert_chain(str(pki / "client.pem"), str(pki / "client.key"))
        intruder.load_cert_chain(str(pki / "intruder.pem"), str(pki / "intruder.key"))
        seen = {
            "all credentials": fetch(f"{https}/metrics", mutual, "s3cret-token"),
            "no token": fetch(f"{https}/metrics", mutual),
            "wrong token": fetch(f"{https}/metrics", mutual, "guess"),
            "another path": fetch(f"{https}/", mutual, "s3cret-token"),
            "a path below": fetch(f"{https}/metrics/x", mutual, "s3cret-token"),
        }
        assert seen == {"all credentials": 200, "no token": 401, "wrong token": 401, "another path": 404,
                        "a path below": 404}  # fmt: skip
        for what, outcome in {
            "plain http": fetch(f"{http_url}/metrics", token="s3cret-token"),
            "no client certificate": fetch(f"{https}/metrics", server_only, "s3cret-token"),
            "a rogue CA's client": fetch(f"{https}/metrics", intruder, "s3cret-token"),
        }.items():
            assert not isinstance(outcome, int), (what, outcome)  # refused before any HTTP status
        assert fetch(f"{https}/metrics", mutual, "s3cret-token") == 200  # failed handshakes left it serving
    finally:
        server.stop(grace_s=1)


def health_cli(address: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ps", "health", address, *flags], capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def test_the_health_command_probes_a_mutual_tls_server_with_a_token(pki, start):
    address = start(tls_cert=str(pki / "server.pem"), tls_key=str(pki / "server.key"), tls_ca=str(pki / "ca.pem"),
                    auth_token_file=str(pki / "token"))  # fmt: skip
    ca = ["--tls-ca", str(pki / "ca.pem")]
    client = ["--tls-cert", str(pki / "client.pem"), "--tls-key", str(pki / "client.key")]
    ok = health_cli(address, *ca, *client, "--auth-token-file", str(pki / "token"), "--tls-server-name", "localhost")
    assert (ok.returncode, ok.stdout.strip()) == (0, f"{address}: SERVING"), ok.stderr
    no_cert = health_cli(address, *ca, "--timeout-s", "2")
    assert no_cert.returncode == 1 and "UNAVAILABLE" in no_cert.stderr and "Traceback" not in no_cert.stderr
    wrong_name = health_cli(address, *ca, *client, "--tls-server-name", "ps-9.example", "--timeout-s", "2")
    assert wrong_name.returncode == 1 and "Traceback" not in wrong_name.stderr
    half = health_cli(address, *ca, "--tls-cert", str(pki / "client.pem"))
    assert half.returncode == 2 and "give both --tls-cert and --tls-key" in half.stderr


@pytest.mark.parametrize("host, tls, token, mutual, warns", [
    ("0.0.0.0", False, False, False, "with neither TLS nor a token: anyone who can reach this port can read and "
                                     "overwrite every table"),
    ("10.1.2.3", False, False, False, "with neither TLS nor a token"),
    ("ps-0.example", False, False, False, "with neither TLS nor a token"),
    ("0.0.0.0", True, False, False, "with TLS but no token: TLS keeps the traffic private but admits every client"),
    ("0.0.0.0", False, True, False, "with a token but no TLS: the token crosses the network in plain text"),
    ("0.0.0.0", True, True, False, None),
    ("0.0.0.0", True, False, True, None),
    ("0.0.0.0", True, True, True, None),
    ("127.0.0.1", False, False, False, None),
    ("[::1]", False, False, False, None),
    ("localhost", False, False, False, None),
])  # fmt: skip
def test_a_server_others_may_reach_without_tls_or_a_check_of_its_callers_says_so(host, tls, token, mutual, warns):
    warning = exposure_warning(host, tls, token, mutual)
    assert (warning is None) == (warns is None), warning
    if warns:
        assert f"listening on {host} {warns}" in warning and "docs/security.md" in warning


@pytest.mark.parametrize("servers, token, warns", [
    (["10.1.2.3:5000", "127.0.0.1:5001", "ps-1.example:5000"], "s3cret", "to 10.1.2.3:5000, ps-1.example:5000 (no TLS)"),
    (["127.0.0.1:5000", "[::1]:5001", "localhost:5002"], "s3cret", None),
    (["10.1.2.3:5000"], None, None),
])  # fmt: skip
def test_a_client_sending_its_token_without_tls_to_another_machine_says_so(servers, token, warns, caplog):
    from worker.channels import open_channels

    with caplog.at_level("WARNING", logger="worker.client"):
        channels = open_channels(servers, None, None, None, token)
    for channel in channels:
        channel.close()
    said = [r.getMessage() for r in caplog.records if "plain text" in r.getMessage()]
    assert len(said) == (warns is not None), said
    if warns:
        assert warns in said[0] and "give --tls-ca" in said[0] and "s3cret" not in said[0], said


@pytest.mark.parametrize("security, warns", [
    ({"tls": True}, "with TLS but no token"),
    ({"token": True}, "with a token but no TLS"),
    ({"tls": True, "token": True}, None),
    ({"tls": True, "mutual": True}, None),
])  # fmt: skip
def test_a_server_on_all_interfaces_logs_the_warning_its_security_settings_call_for(pki, tmp_path, caplog,
                                                                                    security, warns):  # fmt: skip
    files = {"tls_cert": str(pki / "server.pem"), "tls_key": str(pki / "server.key")} if "tls" in security else {}
    files |= {"tls_ca": str(pki / "ca.pem")} if "mutual" in security else {}
    files |= {"auth_token_file": str(pki / "token")} if "token" in security else {}
    server = Server(ServerConfig(data_dir=str(tmp_path / "shard"), host="0.0.0.0", port=0, **files))
    try:
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "listening on" in
                    r.getMessage()]  # fmt: skip
        if warns is None:
            assert warnings == []
        else:
            assert len(warnings) == 1 and warns in warnings[0], warnings
    finally:
        server.stop(grace_s=1)


# ---- token files: one line of printable ASCII, or refused at start naming the flag and the file --------------


@pytest.mark.parametrize("content, token", [
    (b"s3cret-token\n", "s3cret-token"),
    (b"  s3cret-token \r\n\n", "s3cret-token"),
    (b"with inner spaces ~!", "with inner spaces ~!"),
])  # fmt: skip
def test_a_token_file_of_one_printable_ascii_line_is_read_without_the_surrounding_whitespace(content, token, tmp_path):
    (tmp_path / "token").write_bytes(content)
    assert read_token(str(tmp_path / "token")) == token


@pytest.mark.parametrize("content, problem", [
    ("h\u00e9llo-token\n".encode(), "byte 2 of the file is not ASCII"),
    (b"\xef\xbb\xbfhello-token\n", "byte 1 of the file is not ASCII (a letter such as \u00e9, a typographic quote, a "
                                      "byte-order mark, or a binary file?)"),
    (b"\xff\xfe\x00hello-token", "byte 1 of the file is not ASCII"),
    (b"hello-token-one\nhello-token-two\n", "it holds more than one line (a line break at byte 16 of the file)"),
    (b"\nhello-token-one\r\nhello-token-two", "it holds more than one line (a line break at byte 17 of the file)"),
    (b"hello\x01token", "byte 6 of the file is a control character (0x01)"),
    (b"hello\ttoken", "byte 6 of the file is a control character (a tab)"),
    (b"hello-token\x00\n", "byte 12 of the file is a control character (a NUL byte)"),
])  # fmt: skip
def test_a_token_file_gRPC_could_not_send_is_refused_naming_the_flag_the_file_and_the_byte(content, problem, tmp_path):
    """Before: accepted (or a bare UnicodeDecodeError), then every call failed with INTERNAL: Invalid metadata."""
    path = tmp_path / "token"
    path.write_bytes(content)
    with pytest.raises(ValueError) as e:
        read_token(str(path))
    message = str(e.value)
    assert message.startswith(f"auth token file (--auth-token-file) {path} does not hold a usable token: "), message
    assert problem in message and message.endswith("the token must be one line of printable ASCII (0x20-0x7E)")
    assert "llo-token" not in message  # the secret itself is never shown


@pytest.mark.parametrize("content, message", [
    (None, "cannot read auth token file (--auth-token-file) {path}: No such file or directory"),
    ("dir", "cannot read auth token file (--auth-token-file) {path}: Is a directory"),
    (b" \n\n", "auth token file (--auth-token-file) {path} is empty"),
])  # fmt: skip
def test_a_missing_directory_or_empty_token_file_is_refused(content, message, tmp_path):
    path = tmp_path / "token"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(message.format(path=path))):
        read_token(str(path))


def test_a_token_from_a_pipe_is_read_and_a_fifo_no_one_writes_to_or_a_device_is_refused_not_waited_on(pki, tmp_path):
    """A token file may be a pipe (`--auth-token-file <(command)`): its bytes are read. A FIFO that no process writes
    to is refused as empty, at once, where opening it would wait for a writer without end; a device, and a TLS file
    that is a FIFO (ssl and gRPC read it more than once), are refused naming what they are."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"s3cret-token\n")
    os.close(write_end)
    try:
        assert read_token(f"/dev/fd/{read_end}") == "s3cret-token"
    finally:
        os.close(read_end)
    with pytest.raises(ValueError, match=re.escape("auth token file (--auth-token-file) /dev/null is a character "
                                                   "device, not a regular file")):  # fmt: skip
        read_token("/dev/null")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    server = [sys.executable, "-m", "ps", "--stop-with-stdin", "--data-dir", str(tmp_path / "shard"), "--port", "0"]
    for flags, expected in (
        (["--auth-token-file", str(fifo)], f"auth token file (--auth-token-file) {fifo} is empty (a FIFO or pipe: "
                                           "no process wrote to it)"),
        (["--tls-cert", str(fifo), "--tls-key", str(pki / "server.key")],
         f"TLS certificate (--tls-cert) {fifo} is a FIFO or pipe, not a regular file"),
    ):  # fmt: skip
        run = subprocess.run([*server, *flags], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and f"ps-server: error: {expected}" in run.stderr, run.stderr
    assert not (tmp_path / "shard").exists()


def test_an_optional_token_is_none_left_out_refused_blank_and_read_as_read_token_reads_it(tmp_path):
    """optional_token: the one path every reader of a token flag takes (server, client, health, deploy)."""
    (tmp_path / "token").write_bytes(b" s3cret-token\n")
    (tmp_path / "bad").write_bytes(b"a\nb")
    assert optional_token("--auth-token-file", None) is None
    assert optional_token("--auth-token-file", str(tmp_path / "token")) == "s3cret-token"
    with pytest.raises(ValueError, match=re.escape("--read-token-file is empty (' '): give its file's path, or leave")):
        optional_token("--read-token-file", " ", READ_TOKEN_FILE)
    bad = f"read-only token file (--read-token-file) {tmp_path / 'bad'} does not hold a usable token"
    with pytest.raises(ValueError, match=re.escape(bad)):
        optional_token("--read-token-file", str(tmp_path / "bad"), READ_TOKEN_FILE)


def test_a_token_given_in_code_is_checked_as_well():
    for token, problem in (("h\u00e9llo", "byte 2 of the token is not ASCII"), ("a\nb", "it holds more than one line"),
                           ("", "it is empty")):  # fmt: skip
        with pytest.raises(ValueError, match=re.escape(f"the auth token is unusable: {problem}")):
            TokenHeader(token)


def test_the_server_worker_and_health_commands_refuse_a_bad_token_file_at_start(tmp_path):
    """Each command that reads --auth-token-file says what is wrong, exit code 2, no traceback."""
    path = tmp_path / "token"
    path.write_bytes(b"abc\ndef\n")
    expected = f"auth token file (--auth-token-file) {path} does not hold a usable token: it holds more than one line"
    commands = {
        "ps-server": [sys.executable, "-m", "ps", "--stop-with-stdin", "--data-dir", str(tmp_path / "shard"),
                      "--port", "0"],
        "ps-worker": [sys.executable, "-m", "worker", "stats", "--servers", "127.0.0.1:1"],
        "ps-server health": [sys.executable, "-m", "ps", "health", "127.0.0.1:1"],
    }  # fmt: skip
    for command, argv in commands.items():
        run = subprocess.run([*argv, "--auth-token-file", str(path)], stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
        assert run.returncode == 2 and f"{command}: error: {expected}" in run.stderr, (command, run.stderr)
        assert "Traceback" not in run.stderr and "listening on" not in run.stdout, (command, run.stderr)


@pytest.mark.parametrize("given, flag", [
    (["--tls-cert=", "--tls-key="], "--tls-cert"),
    (["--tls-ca="], "--tls-ca"),
    (["--auth-token-file="], "--auth-token-file"),
    (["--auth-token-file", "TOKEN", "--read-token-file", " "], "--read-token-file"),
])  # fmt: skip
def test_an_empty_tls_or_token_flag_is_refused_not_taken_as_left_out(pki, tmp_path, given, flag):
    """A secret's flag given an empty path (`--tls-cert "$CERT"` with CERT unset, say): each command refuses it
    (exit 2), where taken as left out it would serve, or call, without TLS or the token. ps-server health takes no
    read-only token, and a server's --tls-ca needs --tls-cert: those cases leave them out."""
    cert = ["--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key")]
    commands = {
        "ps-server": [sys.executable, "-m", "ps", "--stop-with-stdin", "--data-dir", str(tmp_path / "shard"), "--port",
                      "0", *(cert if flag == "--tls-ca" else [])],
        "ps-worker": [sys.executable, "-m", "worker", "stats", "--servers", "127.0.0.1:1", "--timeout-s", "1"],
        "ps-server health": [sys.executable, "-m", "ps", "health", "127.0.0.1:1", "--timeout-s", "1"],
    }  # fmt: skip
    flags = [str(pki / "token") if f == "TOKEN" else f for f in given]
    for command, argv in commands.items():
        if command != "ps-server" and flag == "--read-token-file":
            continue
        run = subprocess.run([*argv, *flags], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and f"{command}: error: {flag} is empty" in run.stderr, (command, run.stderr)
        assert "Traceback" not in run.stderr and "listening on" not in run.stdout, (command, run.stderr)
    assert not (tmp_path / "shard").exists()


# ---- the health probe says which TLS flag is missing or too many ------------------------------------------


def test_a_health_probe_whose_tls_setting_differs_from_the_shards_says_which_flag(pki, start):
    """Before: "UNAVAILABLE: ... Socket closed" and nothing more."""
    ca = {"tls_ca": str(pki / "ca.pem")}
    client = {"tls_cert": str(pki / "client.pem"), "tls_key": str(pki / "client.key")}
    tls = start(tls_cert=str(pki / "server.pem"), tls_key=str(pki / "server.key"))
    mutual = start(tls_cert=str(pki / "server.pem"), tls_key=str(pki / "server.key"), **ca)
    plain = start()
    assert check_health(tls, 5, **ca) == (True, False, "SERVING")
    assert check_health(mutual, 5, **ca, **client) == (True, False, "SERVING")
    cases = {
        "TLS, probed plain": (tls, {}, "; the shard serves TLS: give --tls-ca (the CA that signed its certificate), "
                              "as its clients do"),
        "mutual TLS, probed plain": (mutual, {}, "; the shard serves TLS: give --tls-ca (the CA that signed its "
                                     "certificate) and --tls-cert/--tls-key (it requires a client certificate: "
                                     "mutual TLS), as its clients do"),
        "mutual TLS, no client certificate": (mutual, ca, "; the shard requires a client certificate (mutual TLS): "
                                              "give --tls-cert and --tls-key, a certificate its CA signed"),
        "plain, probed with TLS": (plain, ca, "; something listens there, but it does not serve TLS: if it is the "
                                   "shard, it runs without TLS (drop --tls-ca, --tls-cert and --tls-key)"),
    }  # fmt: skip
    for what, (address, flags, hint) in cases.items():
        serving, starting, text = check_health(address, 5, **flags)
        assert not serving and not starting and text.startswith("UNAVAILABLE: ") and text.endswith(hint), (what, text)


def test_the_probes_verdicts_are_grpcs_under_the_stricter_default_context_of_python_3_13(pki, start, monkeypatch):
    """Python 3.13's ssl.create_default_context adds VERIFY_X509_STRICT and VERIFY_X509_PARTIAL_CHAIN; strict refuses
    this CA (made by `openssl req -x509`: no keyUsage extension), which gRPC takes. The default context is given
    3.13's flags here whatever Python runs the test: the probe still finds what gRPC's handshake finds."""
    from ps.tlsprobe import tls_hint, verified_handshake

    default = ssl.create_default_context

    def as_in_3_13(*args, **kwargs) -> ssl.SSLContext:
        context = default(*args, **kwargs)
        context.verify_flags |= ssl.VERIFY_X509_STRICT | ssl.VERIFY_X509_PARTIAL_CHAIN
        return context

    monkeypatch.setattr(ssl, "create_default_context", as_in_3_13)
    ca = str(pki / "ca.pem")
    server = {"tls_cert": str(pki / "server.pem"), "tls_key": str(pki / "server.key")}
    tls, mutual = start(**server), start(**server, tls_ca=ca)
    strict = ssl.create_default_context(cafile=ca)
    strict.set_alpn_protocols(["h2"])
    host, port = tls.rsplit(":", 1)
    refused = pytest.raises(ssl.SSLCertVerificationError, match="does not include key usage extension")
    with socket.create_connection((host, int(port)), timeout=5) as raw, refused:  # the handshake gRPC's is not
        strict.wrap_socket(raw, server_hostname=host)
    assert check_health(tls, 5, tls_ca=ca) == (True, False, "SERVING")  # gRPC's handshake takes the CA
    assert verified_handshake(tls, ca, None, None) == "ok"
    assert verified_handshake(mutual, ca, str(pki / "client.pem"), str(pki / "client.key")) == "ok"
    assert tls_hint(mutual, ca=ca) == ("; the shard requires a client certificate (mutual TLS): give --tls-cert and "
                                       "--tls-key, a certificate its CA signed")  # fmt: skip


def test_a_probe_with_tls_files_the_shard_does_not_take_names_the_file(pki, start):
    """A CA that did not sign the shard's certificate, or a client certificate its CA did not sign: the worker and
    health name the TLS file at fault; neither says "it did not answer as a sparseps shard (gRPC): it may be another
    service's port", nor that the shard requires a client certificate where one was given or the shard's own did
    not verify."""
    ca, rogue = str(pki / "ca.pem"), str(pki / "rogue.pem")
    client = {"tls_cert": str(pki / "client.pem"), "tls_key": str(pki / "client.key")}
    intruder = {"tls_cert": str(pki / "intruder.pem"), "tls_key": str(pki / "intruder.key")}
    tls = start(tls_cert=str(pki / "server.pem"), tls_key=str(pki / "server.key"))
    mutual = start(tls_cert=str(pki / "server.pem"), tls_key=str(pki / "server.key"), tls_ca=ca)
    untrusted = (f"; the shard's TLS certificate does not verify against --tls-ca {rogue}: unable to get local issuer "
                 "certificate (give --tls-ca the CA that signed the shard's certificate, and dial a name or address "
                 "the certificate names)")  # fmt: skip
    refused = (f"; the shard does not accept the client certificate (--tls-cert) {intruder['tls_cert']}: under mutual "
               "TLS it takes only certificates signed by its own --tls-ca, unexpired")  # fmt: skip
    cases = {
        "TLS, another CA": (tls, {"tls_ca": rogue}, untrusted),
        "mutual TLS, another CA, no client certificate": (mutual, {"tls_ca": rogue}, untrusted),
        "mutual TLS, another CA": (mutual, {"tls_ca": rogue, **client}, untrusted),
        "mutual TLS, a client certificate of another CA": (mutual, {"tls_ca": ca, **intruder}, refused),
        "TLS, a name the certificate does not give": (tls, {"tls_ca": ca, "tls_server_name": "shard.example"},
                                                      "certificate is not valid for 'shard.example'"),
    }  # fmt: skip
    for what, (address, flags, hint) in cases.items():
        serving, starting, text = check_health(address, 5, **flags)
        assert not serving and not starting and text.startswith("UNAVAILABLE: ") and hint in text, (what, text)
        if "tls_server_name" in flags:
            continue  # the worker dials the address's own host
        with (
            Client([address], timeout_s=2, server_timeout_s=1, **flags) as client,
            pytest.raises(ServerUnavailableError) as raised,
        ):
            client.wait_ready()
        assert str(raised.value).endswith(hint), (what, str(raised.value))


def test_a_health_probe_of_a_port_where_nothing_listens_gives_no_tls_hint():
    with socket.socket() as held:  # bound, not listening: connections are refused
        held.bind(("127.0.0.1", 0))
        serving, starting, text = check_health(f"127.0.0.1:{held.getsockname()[1]}", 5)
    assert not serving and not starting and "TLS" not in text, text  # not a TLS setting: nothing listens
    assert text.startswith("UNAVAILABLE: connection refused: nothing listens there (a shard listens within seconds "
                           "of its start"), text  # fmt: skip


def test_local_shards_take_no_server_settings_from_the_workers_config_file_or_host_variable(pki, tmp_path):
    """A config file named by PS_CONFIG whose [server] section is the cluster's servers' (TLS, a token, every
    interface) is the worker's only: its --local-shards listen on 127.0.0.1 with neither TLS nor token."""
    config = tmp_path / "sparseps.toml"
    config.write_text(f'[server]\ntls_cert = "{pki / "server.pem"}"\ntls_key = "{pki / "server.key"}"\n'
                      f'auth_token_file = "{pki / "token"}"\nhost = "0.0.0.0"\n\n[train]\nmodel = "lr"\n')  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "PS_CONFIG": str(config), "PS_HOST": "0.0.0.0"}
    r = subprocess.run([sys.executable, "-m", "worker", "train", "--local-shards", "1", "--synthetic-rows", "3000",
                        "--synthetic-eval-rows", "1000", "--recipe", "large", "--no-progress", "--server-timeout",
                        "20"], env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0 and "trained lr" in r.stdout, r.stderr[-3000:]


def test_local_shards_listen_on_loopback_whatever_ps_host_says(monkeypatch):
    from worker.cluster import LocalCluster

    monkeypatch.setenv("PS_HOST", "0.0.0.0")
    with LocalCluster(1) as cluster:
        assert cluster.addresses[0].startswith("127.0.0.1:"), cluster.addresses


def test_local_shards_take_neither_a_read_only_token_nor_the_workers_metrics_port(monkeypatch, tmp_path):
    """PS_READ_TOKEN_FILE is the cluster's servers' (a shard without --auth-token-file refuses to start with it);
    PS_METRICS_PORT is the worker's own --metrics-port (a second shard would find it taken): both local shards
    start, on loopback, without a token."""
    from worker.cluster import LocalCluster, free_port

    (tmp_path / "read-token").write_text("look-only\n")
    monkeypatch.setenv("PS_READ_TOKEN_FILE", str(tmp_path / "read-token"))
    monkeypatch.setenv("PS_METRICS_PORT", str(free_port()))
    with LocalCluster(2) as cluster, Client(cluster.addresses, timeout_s=5, server_timeout_s=0) as client:
        assert [s.shard_id for s in client.stats()] == [0, 1]


def test_a_workers_client_security_variables_do_not_reach_its_local_shards(pki, tmp_path):
    """A worker container's PS_TLS_CA, PS_TLS_CERT, PS_TLS_KEY and PS_AUTH_TOKEN_FILE are its client's settings;
    to ps-server they would mean client certificates required and its own certificate. --local-shards trains on
    loopback shards with neither, whatever the worker's variables say."""
    env = {"PATH": "/usr/bin:/bin", "PS_TLS_CA": str(pki / "ca.pem"), "PS_TLS_CERT": str(pki / "client.pem"),
           "PS_TLS_KEY": str(pki / "client.key"), "PS_AUTH_TOKEN_FILE": str(pki / "token")}  # fmt: skip
    r = subprocess.run([sys.executable, "-m", "worker", "train", "--local-shards", "1", "--synthetic-rows", "3000",
                        "--synthetic-eval-rows", "1000", "--model", "lr", "--recipe", "large", "--no-progress"],
                       env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0 and "trained lr" in r.stdout, r.stderr[-3000:]
    r = subprocess.run([sys.executable, "-m", "worker", "launch", "--workers", "1", "--local-shards", "1",
                        "--synthetic-rows", "3000", "--synthetic-eval-rows", "1000", "--model", "lr", "--recipe",
                        "large", "--no-progress"], env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0 and "AUC" in r.stdout, r.stderr[-3000:]  # the workers' and launch's final evaluation


@pytest.fixture(scope="module")
def expired(pki, tmp_path_factory):
    """A server certificate (expired.pem, expired.key) the pki's CA signed for 2020 only, one of its key valid
    until 2060 (far.pem: dates past 2049 are written as GeneralizedTime, earlier ones as UTCTime), one valid from
    2099 only (future.pem); a CA valid from 2099 only (future-ca.pem) and a certificate of expired.key, valid now,
    that it signed (early.pem)."""
    d = tmp_path_factory.mktemp("expired")
    (d / "index.txt").write_text("")
    (d / "serial").write_text("01\n")
    (d / "ca.cnf").write_text("[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\nnew_certs_dir = .\nserial = serial\n"
                              "default_md = sha256\nunique_subject = no\npolicy = p\n[p]\ncommonName = supplied\n")  # fmt: skip
    _openssl("req", *EC, "-keyout", "expired.key", "-out", "expired.csr", "-subj", "/CN=expired", cwd=d)
    _openssl("ca", "-batch", "-config", "ca.cnf", "-cert", str(pki / "ca.pem"), "-keyfile", str(pki / "ca.key"),
             "-in", "expired.csr", "-out", "expired.pem", "-notext", "-startdate", "20200101000000Z",
             "-enddate", "20210101000000Z", "-extfile", str(pki / "server.ext"), cwd=d)  # fmt: skip
    _openssl("ca", "-batch", "-config", "ca.cnf", "-cert", str(pki / "ca.pem"), "-keyfile", str(pki / "ca.key"),
             "-in", "expired.csr", "-out", "far.pem", "-notext", "-startdate", "20200101000000Z",
             "-enddate", "20600101000000Z", "-extfile", str(pki / "server.ext"), cwd=d)  # fmt: skip
    _openssl("ca", "-batch", "-config", "ca.cnf", "-cert", str(pki / "ca.pem"), "-keyfile", str(pki / "ca.key"),
             "-in", "expired.csr", "-out", "future.pem", "-notext", "-startdate", "20990101000000Z",
             "-enddate", "21000101000000Z", "-extfile", str(pki / "server.ext"), cwd=d)  # fmt: skip
    (d / "ca.ext").write_text("basicConstraints=critical,CA:TRUE\nkeyUsage=keyCertSign\n")
    _openssl("req", *EC, "-keyout", "future-ca.key", "-out", "future-ca.csr", "-subj", "/CN=future-ca", cwd=d)
    _openssl("ca", "-batch", "-config", "ca.cnf", "-selfsign", "-keyfile", "future-ca.key", "-in", "future-ca.csr",
             "-out", "future-ca.pem", "-notext", "-startdate", "20990101000000Z", "-enddate", "21000101000000Z",
             "-extfile", "ca.ext", cwd=d)  # fmt: skip
    _openssl("ca", "-batch", "-config", "ca.cnf", "-cert", "future-ca.pem", "-keyfile", "future-ca.key",
             "-in", "expired.csr", "-out", "early.pem", "-notext", "-startdate", "20200101000000Z",
             "-enddate", "20600101000000Z", "-extfile", str(pki / "server.ext"), cwd=d)  # fmt: skip
    return d


def test_an_expired_certificate_is_refused_at_start_naming_the_flag_and_the_date(pki, expired, tmp_path):
    """gRPC serves an expired certificate, and every client's handshake then fails ("Socket closed", "Ssl handshake
    failed"): the server, the client and the probe refuse it at start instead. A CA file is refused only when all
    its certificates expired (a bundle may hold old roots beside the one that matters)."""
    said = r"expired on 2021-01-01 00:00:00 UTC \(this machine's clock says .*\): the other side of every connection"
    with pytest.raises(ValueError, match=rf"TLS certificate \(--tls-cert\) .*expired.pem {said}"):
        Server(ServerConfig(data_dir=str(tmp_path / "s"), tls_cert=str(expired / "expired.pem"),
                            tls_key=str(expired / "expired.key")))  # fmt: skip
    assert not (tmp_path / "s").exists()  # refused before the data dir was made
    with pytest.raises(ValueError, match=rf"TLS CA \(--tls-ca\) .*expired.pem {said}"):
        Client(["127.0.0.1:1"], tls_ca=str(expired / "expired.pem"))
    with pytest.raises(ValueError, match=rf"TLS certificate \(--tls-cert\) .*expired.pem {said}"):
        check_health("127.0.0.1:1", tls_ca=str(pki / "ca.pem"), tls_cert=str(expired / "expired.pem"),
                     tls_key=str(expired / "expired.key"))  # fmt: skip
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes((expired / "expired.pem").read_bytes() + (pki / "ca.pem").read_bytes())
    assert check_health("127.0.0.1:1", timeout_s=0.5, tls_ca=str(bundle)).text.startswith("UNAVAILABLE")


def test_a_certificates_start_and_end_are_read_as_ssl_reads_them(pki, expired):
    for path in (expired / "expired.pem", expired / "far.pem", expired / "future.pem", pki / "ca.pem",
                 pki / "server.pem"):  # fmt: skip
        (body,) = PEM_CERTIFICATE.findall(path.read_bytes())
        decoded = ssl._ssl._test_decode_cert(str(path))
        assert pem_validity(body) == tuple(ssl.cert_time_to_seconds(decoded[k]) for k in ("notBefore", "notAfter"))
    assert pem_validity(b"bm90IGEgY2VydGlmaWNhdGU=") is None  # "not a certificate": left to ssl to judge


def test_a_certificate_not_yet_valid_is_served_with_a_warning_and_its_clients_told_its_date_and_the_clocks(
    pki, expired, start, caplog
):
    """The clock that puts a certificate's start in the future may be the wrong one, so the server serves it, and
    warns at start naming the file and the date; a client that cannot connect is told the date and to check the
    clocks, and is not told to give another CA ("give --tls-ca the CA that signed the shard's certificate")."""
    future, key, ca = expired / "future.pem", str(expired / "expired.key"), str(pki / "ca.pem")
    now = r"\(this machine's clock says \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)"
    with caplog.at_level("WARNING", logger="ps.server"):
        address = start(tls_cert=str(future), tls_key=key)
    warnings = [r.getMessage() for r in caplog.records if "not valid until" in r.getMessage()]
    assert len(warnings) == 1 and re.fullmatch(
        rf"TLS certificate \(--tls-cert\) {re.escape(str(future))} is not valid until 2099-01-01 00:00:00 UTC {now}: "
        "until then clients refuse it; check the clocks of this machine and of the one that made it", warnings[0]
    ), warnings  # fmt: skip
    hint = (rf"; the shard's TLS certificate is not valid until 2099-01-01 00:00:00 UTC {now}: check the clocks of "
            "both machines, the shard's and this one, or wait until then")  # fmt: skip
    serving, starting, text = check_health(address, 5, tls_ca=ca)
    assert not serving and re.fullmatch(rf"UNAVAILABLE: .*{hint}", text, re.DOTALL), text
    with (
        Client([address], timeout_s=2, server_timeout_s=1, tls_ca=ca) as client,
        pytest.raises(ServerUnavailableError) as raised,
    ):
        client.wait_ready()
    assert re.search(rf"{hint}$", str(raised.value)), str(raised.value)


def test_a_ca_not_yet_valid_is_warned_of_at_start_and_named_to_its_clients(pki, expired, start, caplog):
    """A certificate valid now but signed by a CA not yet valid: the server warns of its --tls-ca, not of its
    certificate; a client verifying against that CA is told that a certificate signing the shard's is not yet
    valid, and to check the clocks."""
    future_ca, key = str(expired / "future-ca.pem"), str(expired / "expired.key")
    with caplog.at_level("WARNING", logger="ps.server"):
        address = start(tls_cert=str(expired / "early.pem"), tls_key=key, tls_ca=future_ca)
    warnings = [r.getMessage() for r in caplog.records if "not valid until" in r.getMessage()]
    assert [w.split(" is not valid until ")[0] for w in warnings] == [f"TLS CA (--tls-ca) {future_ca}"], warnings
    serving, starting, text = check_health(address, 5, tls_ca=future_ca)
    assert not serving and text.startswith("UNAVAILABLE: ") and (
        f"; a certificate that signs the shard's (the CA of --tls-ca {future_ca}, or an intermediate) is not yet "
        "valid (this machine's clock says ") in text and text.endswith(
        "check the clocks of both machines, the shard's and this one, or wait until then"), text  # fmt: skip


@pytest.fixture(scope="module")
def early_client(pki, expired):
    """A client certificate valid now (early-client.pem, its key early-client.key) that future-ca signed, and
    now-ca.pem: future-ca's name and key, valid now, so that either CA verifies that certificate."""
    d = expired
    _openssl("req", *EC, "-keyout", "early-client.key", "-out", "early-client.csr", "-subj", "/CN=early-client", cwd=d)
    _openssl("ca", "-batch", "-config", "ca.cnf", "-cert", "future-ca.pem", "-keyfile", "future-ca.key",
             "-in", "early-client.csr", "-out", "early-client.pem", "-notext", "-startdate", "20200101000000Z",
             "-enddate", "20600101000000Z", "-extfile", str(pki / "client.ext"), cwd=d)  # fmt: skip
    _openssl("ca", "-batch", "-config", "ca.cnf", "-selfsign", "-keyfile", "future-ca.key", "-in", "future-ca.csr",
             "-out", "now-ca.pem", "-notext", "-startdate", "20200101000000Z", "-enddate", "20600101000000Z",
             "-extfile", "ca.ext", cwd=d)  # fmt: skip
    return d


def test_a_servers_own_ca_not_yet_valid_is_warned_of_as_what_refuses_its_clients_certificates(
    pki, early_client, start, caplog
):
    """Under mutual TLS the server checks its clients' certificates against its --tls-ca; its clients check the
    server's against their own. So a server CA not yet valid has the server refuse a client certificate it signed,
    and the warning says so: a client whose own files are all valid is refused by that server, and served by one
    whose CA, of the same name and key, is valid now."""
    d = early_client
    client = dict(tls_ca=str(pki / "ca.pem"), tls_cert=str(d / "early-client.pem"), tls_key=str(d / "early-client.key"))
    server = dict(tls_cert=str(pki / "server.pem"), tls_key=str(pki / "server.key"))
    assert works(start(**server, tls_ca=str(d / "now-ca.pem")), **client)
    with caplog.at_level("WARNING", logger="ps.server"):
        address = start(**server, tls_ca=str(d / "future-ca.pem"))
    with pytest.raises(ServerUnavailableError):
        works(address, **client)
    warnings = [r.getMessage() for r in caplog.records if "not valid until" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith(f"TLS CA (--tls-ca) {d / 'future-ca.pem'} is not valid until "
                                                         "2099-01-01 00:00:00 UTC"), warnings  # fmt: skip
    assert ": until then this server refuses the client certificates it signed (mutual TLS); check the clocks" in (
        warnings[0]), warnings  # fmt: skip


def test_the_probe_of_a_certificates_start_asks_for_the_server_name_as_the_verified_handshake_does(pki, expired):
    """An ingress that routes by SNI, here a TLS server presenting future.pem to "shard.example" and server.pem to
    any other name or none: speaks_tls has the certificate (its start read here) for the name the client gives
    (--tls-server-name), else for the address's host, as verified_handshake asks."""
    from ps.secretfiles import utc, validity
    from ps.tlsprobe import speaks_tls

    def context(cert: str) -> ssl.SSLContext:
        c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        c.load_cert_chain(cert, str(expired / "expired.key") if "future" in cert else str(pki / "server.key"))
        return c

    other, routed = context(str(pki / "server.pem")), context(str(expired / "future.pem"))
    asked = []

    def route(tls: ssl.SSLObject, name: str | None, _: ssl.SSLContext) -> None:
        asked.append(name)
        if name == "shard.example":
            tls.context = routed

    other.sni_callback = route
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        for _ in range(3):
            conn, _ = listener.accept()
            with contextlib.suppress(OSError), other.wrap_socket(conn, server_side=True):
                pass

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    try:
        starts = [validity(speaks_tls(address, name, 5)[1])[0] for name in ("shard.example", None, "localhost")]
    finally:
        server.join(10)
        listener.close()
    assert asked == ["shard.example", None, "localhost"]  # no SNI for an address: 127.0.0.1 sends none
    assert starts[0] is not None and utc(starts[0]) == "2099-01-01 00:00:00 UTC", starts
    assert starts[1] is not None and starts[1] == starts[2] < starts[0], starts


def test_the_probe_of_what_listens_asks_for_the_server_name_as_the_verified_handshake_does(pki):
    """An ingress that routes by SNI, here one that closes a handshake not asking for "shard.example" and serves
    server.pem (which does not name it) to one that does: speaks_tls, asking for the name given, finds TLS there,
    and without it finds it plain; tls_hint, given that name, says the certificate does not name it, rather than
    to drop the TLS flags."""
    from ps.tlsprobe import speaks_tls, tls_hint

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pki / "server.pem"), str(pki / "server.key"))
    context.set_alpn_protocols(["h2"])
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(30)

    def route(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            hello = conn.recv(16384, socket.MSG_PEEK)  # the ClientHello, left for the handshake to read
            if b"shard.example" not in hello:
                return
            with contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"\0")  # as gRPC's HTTP/2 settings, sent at once to a client it took

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                route(listener.accept()[0])

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    try:
        found = [speaks_tls(address, name, timeout_s=5) for name in ("shard.example", None)]
        assert found[0][1] == ssl.PEM_cert_to_DER_cert((pki / "server.pem").read_text()) and found[1][1] is None
        found = [kind for kind, _ in found]
        hint = tls_hint(address, ca=str(pki / "ca.pem"), server_name="shard.example", timeout_s=5)
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept, where close alone does not
        listener.close()
        server.join(10)
    assert not server.is_alive()
    assert found == ["tls", "plain"], found
    assert hint.startswith(f"; the shard's TLS certificate does not verify against --tls-ca {pki / 'ca.pem'}: "), hint
    assert "'shard.example'" in hint, hint


def test_a_certificate_valid_now_is_served_without_a_warning_of_its_start(pki, start, caplog):
    with caplog.at_level("WARNING", logger="ps.server"):
        start(tls_cert=str(pki / "server.pem"), tls_key=str(pki / "server.key"), tls_ca=str(pki / "ca.pem"))
    assert not [r for r in caplog.records if "not valid until" in r.getMessage()]


def test_callers_without_the_token_take_no_call_slot_from_those_with_it(tmp_path):
    """With the server's one thread held by a caller of the token, a flood of calls without it (more than the call
    slots) is refused UNAUTHENTICATED at once, taking no slot: a caller of the token still gets the free one, and
    is served once the thread is let go."""
    (tmp_path / "token").write_text("s3cret-token\n")
    server = Server(ServerConfig(data_dir=str(tmp_path / "data"), port=0, threads=1, max_queued_calls=1,
                                 auth_token_file=str(tmp_path / "token")))  # fmt: skip
    server.start()
    real_stats, release, entered = server.shard.stats, threading.Event(), threading.Event()

    def held_stats():
        entered.set()
        assert release.wait(30)
        return real_stats()

    server.shard.stats = held_stats
    address, token = f"127.0.0.1:{server.port}", [("authorization", "Bearer s3cret-token")]
    try:
        with grpc.insecure_channel(address) as channel:
            stats = channel.unary_unary("/sparseps.ParameterServer/Stats", request_serializer=None,
                                        response_deserializer=ps_pb2.StatsResponse.FromString)  # fmt: skip
            request = ps_pb2.StatsRequest().SerializeToString()
            holder = stats.future(request, metadata=token, timeout=30)
            assert entered.wait(30), "the first call never reached the shard"
            flood = [stats.future(request, timeout=10) for _ in range(8)]  # 4 x the slots (threads + queued)
            served = stats.future(request, metadata=token, timeout=30)
            codes = Counter(call.code() for call in flood)  # answered while the only thread is held
            assert codes == {grpc.StatusCode.UNAUTHENTICATED: 8}
            assert not served.done()  # queued for the thread, in the one free slot
            release.set()
            assert served.result().tables is not None
            assert holder.result().tables is not None
    finally:
        release.set()
        server.shard.stats = real_stats
        server.stop(grace_s=1)


def test_one_read_of_each_certificate_file_refuses_it_expired_and_warns_of_it_not_yet_valid(
    pki, expired, tmp_path, monkeypatch
):
    """check_tls_files reads each file once for both dates: its warnings are of certificates not yet valid, and a
    bundle is judged by its first certificate as --tls-cert (the server's own), by all of them as --tls-ca."""
    from ps import secretfiles

    future, future_ca, key = str(expired / "future.pem"), str(expired / "future-ca.pem"), str(expired / "expired.key")
    reads, read = [], secretfiles.read_file
    monkeypatch.setattr(
        secretfiles, "read_file", lambda path, what, pipe_ok=False: reads.append(path) or read(path, what)
    )
    warnings = secretfiles.check_tls_files(future, key, future_ca)
    assert sorted(reads) == sorted([future, key, future_ca])  # once each
    assert [w.split(" is not valid until 2099-01-01 00:00:00 UTC (this machine's clock says ")[0] for w in warnings] == [
        f"TLS certificate (--tls-cert) {future}", f"TLS CA (--tls-ca) {future_ca}"], warnings  # fmt: skip
    ca = (pki / "ca.pem").read_bytes()
    late, old = tmp_path / "late.pem", tmp_path / "old.pem"
    late.write_bytes((expired / "future.pem").read_bytes() + ca)
    old.write_bytes((expired / "expired.pem").read_bytes() + ca)
    assert (
        len(secretfiles.check_tls_files(str(late), None)) == 1
        and secretfiles.check_tls_files(None, None, str(late)) == []
    )
    assert secretfiles.check_tls_files(None, None, str(old)) == []  # a CA bundle not all expired
    with pytest.raises(ValueError, match=rf"^TLS certificate \(--tls-cert\) {re.escape(str(old))} expired on "):
        secretfiles.check_tls_files(str(old), None)


def test_the_hint_for_a_certificate_not_yet_valid_reads_its_start_from_the_first_probes_handshake(pki, expired):
    """tls_hint makes two connections for a shard serving a certificate not yet valid: speaks_tls's, which keeps the
    certificate the shard presented, and verified_handshake's, which finds it early; the date comes from the first."""
    from ps.tlsprobe import tls_hint

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(expired / "future.pem"), str(expired / "expired.key"))
    context.set_alpn_protocols(["h2"])
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn = listener.accept()[0]
                accepted.append(conn)
                with conn, contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"\0")  # as gRPC's HTTP/2 settings, sent at once to a client it took

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        hint = tls_hint(f"127.0.0.1:{listener.getsockname()[1]}", ca=str(pki / "ca.pem"), timeout_s=5)
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept, where close alone does not
        listener.close()
        server.join(10)
    assert not server.is_alive() and len(accepted) == 2, accepted
    assert hint.startswith("; the shard's TLS certificate is not valid until 2099-01-01 00:00:00 UTC "), hint


def _early_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "not valid until" in r.getMessage()]


def test_a_client_given_its_own_certificate_not_yet_valid_warns_once_naming_it_and_its_start(pki, expired, caplog):
    """A worker of three shards warns once (not once a channel) of its --tls-cert not yet valid, naming the file and
    the date its validity starts, as a server warns of its own; the shards refuse it until then (mutual TLS)."""
    future, key, ca = str(expired / "future.pem"), str(expired / "expired.key"), str(pki / "ca.pem")
    with caplog.at_level("WARNING", logger="worker.client"):
        client = Client(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], tls_ca=ca, tls_cert=future, tls_key=key)
    client.close()
    warnings = _early_warnings(caplog)
    assert len(warnings) == 1 and warnings[0].startswith(
        f"TLS certificate (--tls-cert) {future} is not valid until 2099-01-01 00:00:00 UTC (this machine's clock says "
    ), warnings  # fmt: skip
    assert "shards that require a client certificate (mutual TLS) refuse it" in warnings[0], warnings
    caplog.clear()
    with caplog.at_level("WARNING", logger="worker.client"):
        Client(["127.0.0.1:1"], tls_ca=ca, tls_cert=str(pki / "client.pem"), tls_key=str(pki / "client.key")).close()
    assert _early_warnings(caplog) == []


def test_a_probe_given_its_own_certificate_not_yet_valid_warns_once_naming_it_and_its_start(pki, expired, caplog):
    future, key, ca = str(expired / "future.pem"), str(expired / "expired.key"), str(pki / "ca.pem")
    with caplog.at_level("WARNING", logger="ps.health"):
        health = check_health("127.0.0.1:1", timeout_s=0.5, tls_ca=ca, tls_cert=future, tls_key=key)
    assert not health.serving
    warnings = _early_warnings(caplog)
    assert len(warnings) == 1 and warnings[0].startswith(
        f"TLS certificate (--tls-cert) {future} is not valid until 2099-01-01 00:00:00 UTC "), warnings  # fmt: skip


def test_ps_server_health_prints_the_warning_of_its_certificate_not_yet_valid_on_stderr(pki, expired):
    future, key, ca = str(expired / "future.pem"), str(expired / "expired.key"), str(pki / "ca.pem")
    done = subprocess.run([sys.executable, "-m", "ps", "health", "127.0.0.1:1", "--timeout-s", "0.5", "--tls-ca", ca,
                           "--tls-cert", future, "--tls-key", key], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1, done.stderr
    said = [line for line in done.stderr.splitlines() if "not valid until" in line]
    assert len(said) == 1 and f"WARNING ps.health: TLS certificate (--tls-cert) {future} is not valid until" in said[0], (
        done.stderr)  # fmt: skip
