"""The health service: Check and Watch as the gRPC health protocol says, and a stop that Watch streams being
cancelled at the same moment cannot hang (grpc_health's own servicer sends under the lock their close takes)."""

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ps.health import MAX_WATCHES, check_health
from ps.server import Server
from ps.server_config import ServerConfig
from tests.conftest import call_slots_taken
from tests.waiting import wait_until

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def start(tmp_path, name: str) -> Server:
    server = Server(ServerConfig(data_dir=str(tmp_path / name), port=0, threads=4))
    server.start()
    return server


def test_watch_hears_serving_then_not_serving_at_stop(tmp_path):
    server = start(tmp_path, "a")
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert next(stream).status == SERVING
        stopping = threading.Thread(target=server.stop, kwargs={"grace_s": 1})
        stopping.start()
        assert next(stream).status == NOT_SERVING
        stopping.join(30)
        assert not stopping.is_alive()
        server.health.set("", SERVING)  # ignored after the shutdown began
        assert server.health._server_status[""] == NOT_SERVING


def test_a_stop_while_watch_streams_are_cancelled_does_not_hang(tmp_path):
    for trial in range(6):
        server = start(tmp_path, f"s{trial}")
        channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        health = health_pb2_grpc.HealthStub(channel)
        streams = [health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60) for _ in range(32)]
        for stream in streams:
            assert next(stream).status == SERVING
        stopping = threading.Thread(target=server.stop, kwargs={"grace_s": 1}, daemon=True)
        if trial % 2:
            stopping.start()
        for stream in streams:
            stream.cancel()
        if not trial % 2:
            stopping.start()
        stopping.join(30)
        channel.close()
        assert not stopping.is_alive(), f"trial {trial}: Server.stop hung with Watch streams being cancelled"


def test_watch_streams_past_max_watches_are_refused_and_their_room_comes_back_as_streams_close(tmp_path):
    """A Watch stream holds no thread, so gRPC's bound on concurrent calls (threads + queued calls, here 2) does
    not count it: MAX_WATCHES of them are open at once, the next is RESOURCE_EXHAUSTED, Check still answers, and a
    stream that closes (or a refused one) leaves room for one more."""
    server = Server(ServerConfig(data_dir=str(tmp_path / "w"), port=0, threads=1, max_queued_calls=1))
    server.start()
    request = health_pb2.HealthCheckRequest(service="")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            streams = open_watches(health, MAX_WATCHES)
            for _ in range(3):
                with pytest.raises(grpc.RpcError) as refused:
                    next(health.Watch(request, timeout=30))
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert refused.value.details() == (f"{MAX_WATCHES} health Watch streams are open on this server, the "
                                                   "most it keeps open at once: close one, or poll with Check")  # fmt: skip
            assert health.Check(request, timeout=30).status == SERVING
            streams.pop().cancel()
            streams.append(wait_until(lambda: admitted(health.Watch(request, timeout=120)), 30, "a Watch admitted"))
            with pytest.raises(grpc.RpcError, match="RESOURCE_EXHAUSTED"):
                next(health.Watch(request, timeout=30))
            for stream in streams:
                stream.cancel()
            wait_until(lambda: server.health._watches == 0, 30, "the cancelled streams' close")
            for stream in open_watches(health, MAX_WATCHES):
                stream.cancel()
    finally:
        server.stop(grace_s=1)


def open_watches(health, n: int) -> list:
    """n Watch streams of "", each SERVING; opened one at a time, as gRPC's bound on calls counts each until its
    handler returns."""
    streams = []
    for _ in range(n):
        streams.append(health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=120))
        assert next(streams[-1]).status == SERVING
    return streams


def admitted(stream):
    """stream, if its first response came (SERVING); None if it was refused RESOURCE_EXHAUSTED (no room yet)."""
    try:
        return stream if next(stream).status == SERVING else None
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise
        return None


class FakeContext:
    def __init__(self):
        self.callbacks = []

    def add_callback(self, callback) -> bool:
        self.callbacks.append(callback)
        return True


def test_no_response_is_sent_while_the_servicers_lock_is_held():
    """Every send (a Watch's first response, a status change, the shutdown's NOT_SERVING) happens with the lock
    free: another thread (gRPC's event thread, closing a cancelled Watch, takes the lock) can take it meanwhile.
    grpc_health's own Watch sends its first response under the lock: a stop could hang on it (1 in ~150 trials
    of the test above on a loaded machine)."""
    from ps.health import HealthServicer

    servicer = HealthServicer()
    sent = []

    def try_the_lock(taken: list) -> None:
        taken.append(servicer._lock.acquire(timeout=2))
        if taken[0]:
            servicer._lock.release()

    def send(response):
        taken = []
        probe = threading.Thread(target=try_the_lock, args=(taken,))
        probe.start()
        probe.join()
        sent.append((None if response is None else response.status, taken[0]))

    context = FakeContext()
    servicer.Watch(health_pb2.HealthCheckRequest(service=""), context, send)
    servicer.set("", NOT_SERVING)
    servicer.set("", SERVING)
    servicer.enter_graceful_shutdown()
    context.callbacks[0]()  # the stream closes
    assert sent == [(SERVING, True), (NOT_SERVING, True), (SERVING, True), (NOT_SERVING, True), (None, True)]
    assert servicer._send_response_callbacks[""] == set()


def test_a_health_probe_of_a_port_that_does_not_speak_grpc_says_so():
    """An HTTP listener (a metrics port, say) given as the shard's address: the probe's UNAVAILABLE says what
    answered there; with --tls-ca, that it does not serve TLS."""
    from ps.health import check_health

    listener = socket.create_server(("127.0.0.1", 0))

    def answer_http() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=answer_http, daemon=True).start()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    try:
        serving, starting, text = check_health(address, 5)
        assert not serving and not starting and text.startswith("UNAVAILABLE: ") and text.endswith(
            "; something listens there, but it did not answer as a sparseps shard (gRPC): it may be another "
            "service's port (HTTP, a metrics endpoint), or a shard too busy to answer"), text  # fmt: skip
    finally:
        listener.close()


def test_a_health_request_that_does_not_decode_is_an_invalid_argument(servers):
    """Health calls need no token: garbage there is the caller's fault, not INTERNAL."""
    addresses, _ = servers(1)
    with grpc.insecure_channel(addresses[0]) as channel:
        for method, call in (("Check", channel.unary_unary), ("Watch", channel.unary_stream)):
            raw = call(f"/grpc.health.v1.Health/{method}", request_serializer=None, response_deserializer=None)
            with pytest.raises(grpc.RpcError) as info:
                reply = raw(b"\xff", timeout=10)
                if method == "Watch":
                    next(reply)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
            assert "a health request that does not decode" in info.value.details()
        check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert check.status == health_pb2.HealthCheckResponse.SERVING


def test_a_health_probe_of_another_grpc_servers_health_service_is_not_serving():
    """A gRPC server of another service with the standard health service (SERVING for "") is no shard: the probe
    asks for sparseps.ParameterServer, which it does not know."""
    from concurrent import futures

    from grpc_health.v1 import health, health_pb2_grpc

    from ps.health import check_health

    other = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), other)  # "" is SERVING by default
    port = other.add_insecure_port("127.0.0.1:0")
    other.start()
    try:
        serving, starting, text = check_health(f"127.0.0.1:{port}", 5)
        assert not serving and not starting and text.startswith("NOT_FOUND: ") and text.endswith(
            "its health service knows no sparseps.ParameterServer: it is not a sparseps shard (another service's "
            "port?)"), text  # fmt: skip
    finally:
        other.stop(0)


def test_a_probe_of_an_overloaded_shard_asks_again_within_its_timeout(tmp_path):
    """An overloaded shard refuses every call past its queue, health checks too: it is alive, only busy. The probe
    asks again until its timeout, and says the shard was overloaded if every attempt was refused."""
    server = Server(ServerConfig(data_dir=str(tmp_path / "busy"), port=0, threads=1, max_queued_calls=1))
    server.start()
    address = f"127.0.0.1:{server.port}"
    try:
        with call_slots_taken(server):
            busy = check_health(address, timeout_s=1.0)
            assert not busy.serving and busy.text.startswith("RESOURCE_EXHAUSTED: Concurrent RPC limit exceeded!: "
                                                             "the shard's threads stayed busy"), busy.text  # fmt: skip
            probe = ThreadPoolExecutor(1).submit(check_health, address, 30.0)
            time.sleep(0.3)  # its first attempts are refused (a probe answered before the release still passes)
        assert probe.result(timeout=30).serving
    finally:
        server.stop(grace_s=1)


def test_the_health_command_checks_its_token_file_and_never_sends_the_token(tmp_path, capsys):
    """A shard answers health checks without its token, so `ps-server health --auth-token-file` (accepted so that a
    probe can share its clients' flags) reads and checks the file but puts nothing of it on the wire: over a plain
    channel anyone on the path would read it."""
    from concurrent import futures

    from ps.cli_commands import health_main
    from ps.health import SERVICE_NAME, HealthServicer, add_to_server

    class Recording(grpc.ServerInterceptor):
        def __init__(self):
            self.metadata = []

        def intercept_service(self, continuation, details):
            self.metadata += list(details.invocation_metadata or ())
            return continuation(details)

    secret = "s3cret-token-4f1d"
    (tmp_path / "token").write_text(secret + "\n")
    recording = Recording()
    shard = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=(recording,))
    servicer = HealthServicer()
    servicer.set(SERVICE_NAME, SERVING)
    add_to_server(servicer, shard)
    port = shard.add_insecure_port("127.0.0.1:0")
    shard.start()
    try:
        assert health_main([f"127.0.0.1:{port}", "--auth-token-file", str(tmp_path / "token")]) == 0
        assert capsys.readouterr().out.strip() == f"127.0.0.1:{port}: SERVING"
        assert recording.metadata, "the probe's call was not seen"
        sent = [(k, v) for k, v in recording.metadata if k == "authorization" or secret in str(v)]
        assert not sent, sent
    finally:
        shard.stop(0)
