"""deploy/: the compose file and the Kubernetes manifests parse, have the parts an operator needs, run every
server with TLS and a token and every client with the CA and the token, and every command in them is accepted by
the CLI; and the compose services, run as local processes (127.0.0.1, ports remapped, small data, secrets made by
deploy/gen-secrets.sh), train to completion over TLS with health checks SERVING and metrics served only with the
token. No Docker engine runs on this project's machine: no image is built or run here."""

from __future__ import annotations

import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request

import yaml

from ps.__main__ import build_parser as server_parser
from ps.settings import apply_defaults
from tests.waiting import PipeReader
from worker.__main__ import build_parser as worker_parser

DEPLOY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deploy")


def compose() -> dict:
    with open(os.path.join(DEPLOY, "docker-compose.yml")) as f:
        return yaml.safe_load(f)


def k8s() -> list[dict]:
    docs = []
    for name in sorted(os.listdir(os.path.join(DEPLOY, "k8s"))):
        with open(os.path.join(DEPLOY, "k8s", name)) as f:
            docs += [d for d in yaml.safe_load_all(f) if d]
    return docs


def substitute(value: str) -> str:
    """${VAR:-default} as compose expands it, with the defaults."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: os.environ.get(m.group(1), m.group(2)), str(value))


def accepted(argv: list[str], env: dict) -> object:
    """Parses a command line as the CLI would, with env as its environment; raises SystemExit if refused."""
    program, args = argv[0], argv[1:]
    parser = server_parser() if program == "ps-server" else worker_parser()
    apply_defaults(parser, args, env, section="server" if program == "ps-server" else None)
    return parser.parse_args(args)


def test_compose_has_servers_with_volumes_health_checks_a_setup_job_and_cpu_and_gpu_workers():
    services = compose()["services"]
    assert {"secrets", "ps-0", "ps-1", "create-tables", "worker-0", "worker-1", "worker-gpu"} <= set(services)
    for name in ("ps-0", "ps-1"):
        s = services[name]
        assert s["volumes"][0].split(":")[0] in compose()["volumes"]
        assert s["healthcheck"]["test"][1:3] == ["ps-server", "health"] and s["restart"] == "unless-stopped"
        assert s["depends_on"]["secrets"]["condition"] == "service_completed_successfully"
    assert services["create-tables"]["depends_on"]["ps-0"]["condition"] == "service_healthy"
    for name in ("worker-0", "worker-1", "worker-gpu"):
        assert services[name]["depends_on"]["create-tables"]["condition"] == "service_completed_successfully"
    gpu = services["worker-gpu"]
    assert gpu["profiles"] == ["gpu"] and gpu["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert "--device" in gpu["command"] and "cuda" in gpu["command"]


def test_every_compose_command_is_accepted_by_the_cli(tmp_path):
    for name, s in compose()["services"].items():
        if name == "secrets":  # a shell script, run in test_the_compose_services_run_as_local_processes
            assert s["command"][:2] == ["sh", "/app/deploy/gen-secrets.sh"]
            continue
        env = {k: substitute(v) for k, v in (s.get("environment") or {}).items()}
        args = accepted([substitute(a) for a in s["command"]], env)
        if name.startswith("worker"):
            assert args.servers == "ps-0:5000,ps-1:5000" and args.model == "deepfm" and args.num_workers == 2


def test_kubernetes_manifests_have_a_statefulset_a_headless_service_a_job_and_a_configmap(tmp_path):
    docs = {d["kind"]: d for d in k8s()}
    assert {"StatefulSet", "Service", "Job", "ConfigMap"} <= set(docs)
    sts, svc, job, cm = docs["StatefulSet"], docs["Service"], docs["Job"], docs["ConfigMap"]
    assert svc["spec"]["clusterIP"] == "None" and sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    assert job["spec"]["completionMode"] == "Indexed"
    for name, text in cm["data"].items():  # the mounted config files, as the pods see them
        (tmp_path / name).write_text(text.replace("/etc/sparseps", str(tmp_path)))
    env = {}
    for pod in (sts["spec"]["template"]["spec"], job["spec"]["template"]["spec"]):
        for c in pod.get("initContainers", []) + pod["containers"]:
            argv = [a.replace("/etc/sparseps", str(tmp_path)).replace("$(POD_INDEX)", "1").replace(
                "$(JOB_COMPLETION_INDEX)", "3") for a in c["command"] + c["args"]]  # fmt: skip
            args = accepted(argv, env)
            if argv[0] == "ps-server":
                assert (args.shard_id, args.num_shards, args.cache_bytes) == (1, 2, 8 << 30)
            elif not args.create_tables_only:
                assert (args.worker_id, args.num_workers, args.model) == (3, 4, "deepfm")


SERVER_SECRETS = {
    "tls_cert": "/secrets/server.pem",
    "tls_key": "/secrets/server.key",
    "auth_token_file": "/secrets/token",
}
CLIENT_SECRETS = {"tls_ca": "/secrets/ca.pem", "auth_token_file": "/secrets/token"}


def has(args, settings: dict) -> bool:
    return all(getattr(args, k) == v for k, v in settings.items())


def test_compose_runs_every_server_with_tls_and_a_token_and_publishes_only_on_loopback():
    services = compose()["services"]
    secrets = services["secrets"]
    names = secrets["command"][3:]  # gen-secrets.sh DIR NAME...: the names the servers' certificate holds
    for name, s in services.items():
        if name == "secrets":
            continue
        env = {k: substitute(v) for k, v in (s.get("environment") or {}).items()}
        args = accepted([substitute(a) for a in s["command"]], env)
        assert "secrets:/secrets:ro" in s["volumes"], name
        if s["command"][0] == "ps-server":
            assert has(args, SERVER_SECRETS) and args.tls_ca is None, name
            assert name in names and s["healthcheck"]["test"][-2:] == ["--tls-ca", "/secrets/ca.pem"]
        else:
            assert has(args, CLIENT_SECRETS), name
            assert all(a.split(":")[0] in names for a in args.servers.split(",")), args.servers
        for port in s.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)  # metrics on the host's loopback only
    assert secrets["volumes"] == ["secrets:/secrets"] and "secrets" in compose()["volumes"]


def test_kubernetes_runs_every_server_with_tls_and_a_token_and_limits_who_reaches_it(tmp_path):
    docs = {d["kind"]: d for d in k8s()}
    sts, job, cm, policy = docs["StatefulSet"], docs["Job"], docs["ConfigMap"], docs["NetworkPolicy"]
    (tmp_path / "sparseps.toml").write_text(cm["data"]["sparseps.toml"].replace("/etc/sparseps", str(tmp_path)))
    (tmp_path / "tables.toml").write_text(cm["data"]["tables.toml"])
    server_pod, worker_pod = sts["spec"]["template"]["spec"], job["spec"]["template"]["spec"]
    for pod, wanted, files in ((server_pod, SERVER_SECRETS, {"server.pem", "server.key", "ca.pem", "token"}),
                               (worker_pod, CLIENT_SECRETS, {"ca.pem", "token"})):  # fmt: skip
        (volume,) = [v for v in pod["volumes"] if "secret" in v]
        assert volume["secret"]["secretName"] == "sparseps-secrets"
        assert {i["path"] for i in volume["secret"]["items"]} == files  # workers never see the server's key
        for c in pod.get("initContainers", []) + pod["containers"]:
            argv = [a.replace("/etc/sparseps", str(tmp_path)).replace("$(POD_INDEX)", "0").replace(
                "$(JOB_COMPLETION_INDEX)", "0") for a in c["command"] + c["args"]]  # fmt: skip
            assert has(accepted(argv, {}), wanted), c["name"]
            assert {"name": volume["name"], "mountPath": "/secrets", "readOnly": True} in c["volumeMounts"]
    server = server_pod["containers"][0]
    for probe in (server["readinessProbe"], server["livenessProbe"]):  # kubelet's gRPC probe cannot speak TLS
        assert probe["exec"]["command"] == ["ps-server", "health", "127.0.0.1:5000", "--tls-ca", "/secrets/ca.pem"]
    assert policy["spec"]["podSelector"] == sts["spec"]["selector"]
    grpc_rule = [r for r in policy["spec"]["ingress"] if r["ports"] == [{"port": 5000, "protocol": "TCP"}]]
    assert grpc_rule[0]["from"] == [{"podSelector": {"matchLabels": job["spec"]["template"]["metadata"]["labels"]}}]


def test_the_dockerfile_copies_the_package_and_checks_health():
    with open(os.path.join(DEPLOY, "Dockerfile")) as f:
        text = f.read()
    root = os.path.dirname(DEPLOY)
    for line in text.splitlines():
        if line.startswith("COPY "):
            for path in line.split()[1:-1]:
                assert os.path.exists(os.path.join(root, path)), path
    assert "HEALTHCHECK" in text and "ps-server health" in text and "ARG TORCH" in text
    assert "COPY deploy/gen-secrets.sh" in text and "/secrets" in text
    assert "0.0.0.0" not in text.split("ENV ", 1)[1]  # the image alone listens on the container's loopback


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_compose_services_run_as_local_processes(tmp_path):
    """The compose file's commands on 127.0.0.1 with ports, data dirs and the secrets dir remapped: the secrets
    job, servers, the setup job, then both CPU workers (on 20,000 synthetic rows) to completion, all over TLS
    with the token; the metrics answer only with the token, over HTTPS."""
    services = compose()["services"]
    secrets = tmp_path / "secrets"
    assert shutil.which("openssl"), "deploy/gen-secrets.sh needs the openssl command (Debian: apt install openssl)"
    script, _, *names = services["secrets"]["command"][1:]  # /app/deploy/gen-secrets.sh /secrets ps-0 ps-1
    made = subprocess.run(["sh", os.path.join(DEPLOY, os.path.basename(script)), str(secrets), *names],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert made.returncode == 0, made.stderr
    grpc_ports = {name: free_port() for name in ("ps-0", "ps-1")}
    metrics_ports = {name: free_port() for name in ("ps-0", "ps-1")}
    servers_arg = ",".join(f"127.0.0.1:{grpc_ports[n]}" for n in ("ps-0", "ps-1"))

    def local(argv: list[str], name: str) -> list[str]:
        out = []
        for a in argv:
            a = substitute(a).replace("ps-0:5000,ps-1:5000", servers_arg).replace("/secrets/", f"{secrets}/")
            out.append({"0.0.0.0": "127.0.0.1", "/data": str(tmp_path / name)}.get(a, a))
        if name in grpc_ports:
            out[out.index("--port") + 1] = str(grpc_ports[name])
            out[out.index("--metrics-port") + 1] = str(metrics_ports[name])
        if out[0] == "ps-worker" and "--metrics-port" in out:
            out[out.index("--metrics-port") + 1] = "0"
        return [sys.executable, "-m", "ps" if out[0] == "ps-server" else "worker", *out[1:]]

    def env_of(name: str) -> dict:
        env = {k: substitute(v).replace("ps-0:5000,ps-1:5000", servers_arg).replace("/secrets/", f"{secrets}/")
               for k, v in (services[name].get("environment") or {}).items()}  # fmt: skip
        return {
            **os.environ,
            **env,
            "PS_SYNTHETIC_ROWS": "20000",
            "PS_SYNTHETIC_EVAL_ROWS": "5000",
            "PS_RECIPE": "large",
        }

    procs = [subprocess.Popen(local(services[n]["command"], n), env=env_of(n), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for n in ("ps-0", "ps-1")]  # fmt: skip
    try:
        for n, p in zip(("ps-0", "ps-1"), procs):
            PipeReader(p.stdout).wait_for(re.escape(f"listening on 127.0.0.1:{grpc_ports[n]}"), 60, f"{n} to listen")
            probe = local(services[n]["healthcheck"]["test"][1:], "probe")  # ps-server health 127.0.0.1:5000 ...
            probe[probe.index("127.0.0.1:5000")] = f"127.0.0.1:{grpc_ports[n]}"
            health = subprocess.run(probe, capture_output=True, text=True, timeout=30)
            assert health.returncode == 0 and "SERVING" in health.stdout, health.stderr
        setup = subprocess.run(local(services["create-tables"]["command"], "create-tables"), env=env_of("create-tables"),
                               capture_output=True, text=True, timeout=120)  # fmt: skip
        assert setup.returncode == 0 and "created tables deepfm" in setup.stdout, setup.stderr
        workers = [subprocess.Popen(local(services[n]["command"], n), env=env_of(n), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for n in ("worker-0", "worker-1")]  # fmt: skip
        for i, w in enumerate(workers):
            out, err = w.communicate(timeout=300)
            assert w.returncode == 0, err
            assert f"worker {i}/2" in out and "on 10,000 examples" in out and "eval   AUC" in out
        url = f"https://127.0.0.1:{metrics_ports['ps-0']}/metrics"
        context = ssl.create_default_context(cafile=str(secrets / "ca.pem"))
        token = (secrets / "token").read_text().strip()
        try:
            urllib.request.urlopen(urllib.request.Request(url), timeout=10, context=context)
            raise AssertionError("the metrics answered a scrape without the token")
        except urllib.error.HTTPError as e:
            assert e.code == 401
        scrape = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        text = urllib.request.urlopen(scrape, timeout=10, context=context).read().decode()
        for metric in (
            "sparseps_requests_total",
            "sparseps_request_seconds_bucket",
            "sparseps_table_rows_in_ram",
            "sparseps_table_rows_on_disk",
            "sparseps_table_evictions_total",
            "sparseps_request_bytes_total",
        ):
            assert metric in text, metric
        assert 'sparseps_requests_total{code="OK",method="PushBatch"}' in text
    finally:
        for p in procs:
            p.terminate()
        assert [p.wait(timeout=120) for p in procs] == [0, 0]
