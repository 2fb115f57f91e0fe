"""deploy/: the compose files and the Kubernetes manifests parse, have the parts an operator needs, run every
server with TLS and a token and every client with the CA and the token, and every command in them is accepted by
the CLI (no PS_* variable among them that no flag reads); the manifests agree with each other (shards, server
lists, ports, workers, memory, the stop's grace), and they and the Secret deploy/gen-secrets.sh makes pass the
Kubernetes schemas (offline, with kubernetes-validate's bundled schemas); the host-network override puts every
server on its own 127.0.0.1 ports; the exact-sum pusher deploy/smoke.sh runs finds a lost or doubled push; and the
compose services, run as local processes (127.0.0.1, ports remapped, small data, secrets made by
deploy/gen-secrets.sh), train to completion over TLS with health checks SERVING and metrics served only with the
token. deploy/smoke.sh itself (images built, the cluster run in containers, a server killed) runs only where a
Docker engine answers: skipped otherwise."""

from __future__ import annotations

import base64
import copy
import importlib.util
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request

import pytest
import yaml

from ps.cli_server_flags import build_parser as server_parser
from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.settings import apply_defaults, unknown_environment
from tests.inprocess import InProcessTables
from tests.waiting import PipeReader
from worker.__main__ import build_parser as worker_parser

DEPLOY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deploy")


def compose(name: str = "docker-compose.yml") -> dict:
    with open(os.path.join(DEPLOY, name)) as f:
        return yaml.safe_load(f)


def merged(base: dict, override: dict) -> dict:
    """base with override laid over it as compose merges files, for the keys these tests read: mappings merge
    key by key, anything else (a command, a list) is replaced."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def host_network_services() -> dict:
    """docker-compose.yml's services with docker-compose.host.yml over them."""
    return merged(compose(), compose("docker-compose.host.yml"))["services"]


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
    """Parses a command line as the CLI would, with env as its environment; raises SystemExit if refused, and
    fails on a PS_* variable that sets nothing (one of a flag renamed or removed: the CLI only warns of it, and
    runs with the default)."""
    assert not unknown_environment(env), f"{argv[:2]}: PS_* variables no flag reads: {unknown_environment(env)}"
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
    # the setup job makes the tables the workers' settings train: it runs in their environment (a worker's
    # PS_DATA, PS_SCHEMA, recipe or optimizer there only would pick tables the setup job did not make)
    for name in ("worker-0", "worker-1", "worker-gpu"):
        assert services["create-tables"]["environment"] == services[name]["environment"], name
    for name, s in host_network_services().items():
        if name.startswith("worker"):
            assert host_network_services()["create-tables"]["environment"] == s["environment"], name
    for name in ("worker-0", "worker-1", "worker-gpu"):
        assert services[name]["depends_on"]["create-tables"]["condition"] == "service_completed_successfully"
        assert services[name]["init"] is True and services[name]["stop_grace_period"] == "60s"  # a stop is heard
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
                assert (args.shard_id, args.num_shards, args.memory_bytes) == (1, 2, 8 << 30)
            elif not args.create_tables_only:
                assert (args.worker_id, args.num_workers, args.model) == (3, 4, "deepfm")
                assert args.resume_file == "/resume/position.json"  # on an emptyDir: a container's restart resumes
                assert {"name": "resume", "mountPath": "/resume"} in c["volumeMounts"]
    assert svc["spec"]["publishNotReadyAddresses"] is True  # a starting shard resolves: clients wait for it
    config = str(tmp_path / "sparseps.toml")  # the other commands an operator runs in a pod read the file too
    for command in (["eval"], ["predict", "--data", config, "--out", str(tmp_path / "p")], ["stats"],
                    ["checkpoint", "save", str(tmp_path / "c")], ["export", str(tmp_path / "e")],
                    ["shrink"]):  # fmt: skip
        args = accepted(["ps-worker", *command, "--config", config], {})
        assert args.servers == "sparseps-0.sparseps:5000,sparseps-1.sparseps:5000" and has(args, CLIENT_SECRETS)
        assert getattr(args, "model", "deepfm") == "deepfm", command


def kubernetes_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity with a binary suffix (10Gi) in bytes."""
    number, suffix = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)", quantity).groups()
    return int(number) << {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40}[suffix]


PROCESS_ROOM_BYTES = 512 << 20  # a server's memory outside --memory-bytes: the idle process (about 230 MiB
# resident), the messages waiting for a thread, replies being sent


def test_the_kubernetes_manifests_agree_on_shards_workers_ports_memory_and_the_stop(tmp_path):
    """What one manifest says, the others must match: as many server pods as shards; every command's server list
    names pod i of the StatefulSet, through its headless Service, at the gRPC port, in shard order; the Job
    completes and runs at once as many workers as they are told there are; each port the same in the server's
    flags, its container, the Service, the scrape annotation and the NetworkPolicy; the memory limit holds
    --memory-bytes and the process, and is requested whole; the grace period lasts as long as compose's for the
    stop's flush."""
    docs = {d["kind"]: d for d in k8s()}
    sts, svc, job, cm, policy = (docs[k] for k in ("StatefulSet", "Service", "Job", "ConfigMap", "NetworkPolicy"))
    for name, text in cm["data"].items():
        (tmp_path / name).write_text(text.replace("/etc/sparseps", str(tmp_path)))

    def parsed(container: dict) -> object:
        return accepted([a.replace("/etc/sparseps", str(tmp_path)).replace("$(POD_INDEX)", "0").replace(
            "$(JOB_COMPLETION_INDEX)", "0") for a in container["command"] + container["args"]], {})  # fmt: skip

    pod = sts["spec"]["template"]
    (server,) = pod["spec"]["containers"]
    args = parsed(server)
    assert sts["spec"]["replicas"] == args.num_shards
    addresses = [f"{sts['metadata']['name']}-{i}.{svc['metadata']['name']}:{args.port}" for i in range(args.num_shards)]
    config = tomllib.loads((tmp_path / "sparseps.toml").read_text())
    lists = {name: s["servers"] for name, s in config.items() if isinstance(s, dict) and "servers" in s}
    assert len(lists) >= 7 and all(servers.split(",") == addresses for servers in lists.values()), lists
    ports = {"grpc": args.port, "metrics": args.metrics_port}
    assert {p["name"]: p["containerPort"] for p in server["ports"]} == ports
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == ports
    assert svc["spec"]["selector"] == pod["metadata"]["labels"]
    assert int(pod["metadata"]["annotations"]["prometheus.io/port"]) == args.metrics_port
    assert sorted(p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]) == sorted(ports.values())
    memory = {k: kubernetes_bytes(v["memory"]) for k, v in server["resources"].items()}
    assert args.memory_bytes + PROCESS_ROOM_BYTES <= memory["limits"] == memory["requests"], memory
    compose_grace = int(compose()["services"]["ps-0"]["stop_grace_period"].removesuffix("s"))
    assert pod["spec"]["terminationGracePeriodSeconds"] >= compose_grace
    (worker,) = job["spec"]["template"]["spec"]["containers"]
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == parsed(worker).num_workers


SERVER_SECRETS = {
    "tls_cert": "/secrets/server.pem",
    "tls_key": "/secrets/server.key",
    "auth_token_file": "/secrets/token",
}
CLIENT_SECRETS = {"tls_ca": "/secrets/ca.pem", "auth_token_file": "/secrets/token"}


def has(args, settings: dict) -> bool:
    return all(getattr(args, k) == v for k, v in settings.items())


def test_compose_runs_every_server_with_tls_and_a_token_and_publishes_no_port():
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
        # a published port would stay under docker-compose.host.yml (compose merges port lists), where host
        # networking refuses it
        assert "ports" not in s, name
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
    probe = ["ps-server", "health", "127.0.0.1:5000", "--tls-ca", "/secrets/ca.pem"]  # kubelet's gRPC probe cannot
    # speak TLS; a starting shard is alive (not restarted) but not ready (no traffic)
    assert server["readinessProbe"]["exec"]["command"] == probe
    for alive in (server["startupProbe"], server["livenessProbe"]):
        assert alive["exec"]["command"] == [*probe, "--starting-ok"]
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


def test_the_dockerfile_builds_from_a_base_argument_and_installs_torch_only_when_asked():
    with open(os.path.join(DEPLOY, "Dockerfile")) as f:
        text = f.read()
    assert "ARG BASE=python:3.11-slim\nFROM ${BASE}\n" in text  # deploy/base-image.sh's image stands in for it
    assert 'ARG TORCH=""' in text and 'sh deploy/install-torch.sh "$TORCH"' in text
    with open(os.path.join(DEPLOY, "install-torch.sh")) as f:
        script = f.read()
    assert '"") exit 0 ;;' in script  # no torch by default
    assert 'cpu) set -- "torch==$version" --index-url "$index/cpu" ;;' in script  # the CPU wheel index
    # any other choice but cuda/cuNNN is refused if pip's plan holds an nvidia-* wheel, before downloading it
    assert "--dry-run" in script and 'startswith("nvidia-")' in script


def test_the_host_network_override_runs_every_service_on_the_host_network_with_its_own_loopback_ports():
    services = host_network_services()
    servers = {name: s for name, s in services.items() if s["command"][0] == "ps-server"}
    assert set(servers) == {"ps-0", "ps-1"}
    addresses, metrics_ports = [], []
    for name, s in services.items():
        assert s["network_mode"] == "host" and s["build"]["network"] == "host", name
        env = {k: substitute(v) for k, v in (s.get("environment") or {}).items()}
        if name == "secrets":
            continue
        args = accepted([substitute(a) for a in s["command"]], env)
        if name in servers:
            assert args.host == "127.0.0.1" and has(args, SERVER_SECRETS), name  # nothing on another interface
            assert args.shard_id == int(name[-1]) and args.num_shards == 2
            addresses.append(f"127.0.0.1:{args.port}")
            metrics_ports.append(args.metrics_port)
            assert s["healthcheck"]["test"][1:4] == ["ps-server", "health", addresses[-1]], name
        else:
            assert has(args, CLIENT_SECRETS), name
        if args.metrics_port is not None and name not in servers:
            metrics_ports.append(args.metrics_port)
    for name, s in services.items():
        if s["command"][0] == "ps-worker":
            env = {k: substitute(v) for k, v in (s.get("environment") or {}).items()}
            args = accepted([substitute(a) for a in s["command"]], env)
            assert args.servers == ",".join(addresses), name  # in shard order
    ports = [int(a.split(":")[1]) for a in addresses] + metrics_ports
    assert len(ports) == len(set(ports)) == 2 + 2 + 3, ports  # gRPC, server metrics, 3 workers' metrics


def kubernetes_validate():
    """The kubernetes-validate package (the dev extra): Kubernetes' JSON schemas of every release, offline."""
    import kubernetes_validate

    return kubernetes_validate


# 1.28: the oldest release with the pod-index label the StatefulSet reads; and the newest the validator knows
KUBERNETES_VERSIONS = ("1.28.0", "latest")


def validate(doc: dict, version: str) -> None:
    kv = kubernetes_validate()
    kv.validate(doc, kv.latest_version() if version == "latest" else version, strict=True)


def secret_as_kubectl_makes_it(directory: str) -> dict:
    """What `kubectl create secret generic sparseps-secrets --from-file=DIR` sends: a key per file, base64."""
    data = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            data[name] = base64.b64encode(f.read()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "sparseps-secrets"},
        "type": "Opaque",
        "data": data,
    }


def test_the_kubernetes_manifests_pass_the_kubernetes_schemas_offline():
    docs = k8s()
    assert {d["kind"] for d in docs} == {"ConfigMap", "NetworkPolicy", "Service", "StatefulSet", "Job"}
    for version in KUBERNETES_VERSIONS:
        for doc in docs:
            validate(doc, version)  # strict: an unknown field fails too


def test_the_schema_validation_catches_a_misspelled_field_and_a_wrong_type():
    kv = kubernetes_validate()
    sts = next(d for d in k8s() if d["kind"] == "StatefulSet")
    misspelled = copy.deepcopy(sts)
    misspelled["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = misspelled["spec"]["template"]["spec"][
        "containers"
    ][0].pop("readinessProbe")
    wrong_type = copy.deepcopy(sts)
    wrong_type["spec"]["replicas"] = "two"
    for bad in (misspelled, wrong_type):
        with pytest.raises(kv.ValidationError):
            validate(bad, "latest")


def test_the_secret_gen_secrets_makes_passes_the_schema_and_holds_every_key_the_pods_mount(tmp_path):
    assert shutil.which("openssl"), "deploy/gen-secrets.sh needs the openssl command (Debian: apt install openssl)"
    argv = ["sh", os.path.join(DEPLOY, "gen-secrets.sh"), str(tmp_path / "secrets"), "sparseps-0.sparseps"]
    made = subprocess.run([*argv, "sparseps-1.sparseps"], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    secret = secret_as_kubectl_makes_it(str(tmp_path / "secrets"))
    for version in KUBERNETES_VERSIONS:
        validate(secret, version)
    mounted = set()
    for doc in k8s():
        if doc["kind"] in ("StatefulSet", "Job"):
            for volume in doc["spec"]["template"]["spec"]["volumes"]:
                if "secret" in volume:
                    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
                    mounted |= {item["key"] for item in volume["secret"]["items"]}
    assert mounted == {"server.pem", "server.key", "ca.pem", "token"} and mounted <= set(secret["data"])


def test_gen_secrets_names_each_server_once_in_the_certificate(tmp_path):
    """localhost, always named, given again (as `gen-secrets.sh DIR localhost` is run for one host), and a name
    given twice: the server certificate's subjectAltName lists each once."""
    made = subprocess.run(["sh", os.path.join(DEPLOY, "gen-secrets.sh"), str(tmp_path / "s"), "localhost", "ps-0",
                           "ps-0"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert made.returncode == 0, made.stderr
    san = subprocess.run(["openssl", "x509", "-in", str(tmp_path / "s" / "server.pem"), "-noout", "-ext",
                          "subjectAltName"], capture_output=True, text=True, check=True).stdout  # fmt: skip
    names = [n.strip() for n in san.splitlines()[-1].split(",")]
    assert sorted(names) == ["DNS:localhost", "DNS:ps-0", "IP Address:127.0.0.1"], san


def test_gen_secrets_names_an_ip_address_as_one_so_that_any_tls_client_may_dial_it(tmp_path):
    """An address among the NAMEs (a server dialed at 127.0.0.2, 10.1.2.3, ::1 given again) is written as an IP
    subjectAltName: TLS clients other than gRPC (Prometheus, curl, Python's ssl) match an address against IP names
    only. The metrics endpoint of a server on 127.0.0.2, scraped at that address over HTTPS, answers."""
    from ps.server import Server
    from ps.server_config import ServerConfig

    made = subprocess.run(["sh", os.path.join(DEPLOY, "gen-secrets.sh"), str(tmp_path / "s"), "127.0.0.2", "10.1.2.3",
                           "127.0.0.1", "ps-0"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert made.returncode == 0, made.stderr
    s = tmp_path / "s"
    san = subprocess.run(["openssl", "x509", "-in", str(s / "server.pem"), "-noout", "-ext", "subjectAltName"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    names = [n.strip() for n in san.splitlines()[-1].split(",")]
    assert sorted(names) == ["DNS:localhost", "DNS:ps-0", "IP Address:10.1.2.3", "IP Address:127.0.0.1",
                             "IP Address:127.0.0.2"], san  # fmt: skip
    again = subprocess.run(["sh", os.path.join(DEPLOY, "gen-secrets.sh"), str(s), "127.0.0.2", "ps-0"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert again.returncode == 0 and "kept" in again.stdout and again.stderr == "", again.stderr
    server = Server(ServerConfig(data_dir=str(tmp_path / "shard"), host="127.0.0.2", port=0, metrics_port=0,
                                 tls_cert=str(s / "server.pem"), tls_key=str(s / "server.key"),
                                 auth_token_file=str(s / "token")))  # fmt: skip
    server.start()
    try:
        token = (s / "token").read_text().strip()
        request = urllib.request.Request(
            f"https://127.0.0.2:{server.metrics_port}/metrics", headers={"Authorization": f"Bearer {token}"}
        )
        context = ssl.create_default_context(cafile=str(s / "ca.pem"))
        with urllib.request.urlopen(request, timeout=15, context=context) as reply:
            assert reply.status == 200 and b"sparseps_" in reply.read()
    finally:
        server.stop(grace_s=1)


def test_gen_secrets_run_again_over_an_expired_certificate_says_so_and_fails(tmp_path):
    """Secrets kept from an earlier run are kept only while they serve: a server certificate past its end (825
    days) makes the servers refuse to start ("make new certificates (deploy/gen-secrets.sh)"), so a run over it
    fails naming the file and its end, and keeps the files as they were; unexpired, it keeps them."""
    script, secrets = os.path.join(DEPLOY, "gen-secrets.sh"), tmp_path / "s"
    made = subprocess.run(["sh", script, str(secrets), "ps-0"], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    kept = subprocess.run(["sh", script, str(secrets), "ps-0"], capture_output=True, text=True, timeout=60)
    assert kept.returncode == 0 and "kept" in kept.stdout and kept.stderr == "", kept.stderr
    ca = tmp_path / "ca"  # a server certificate for 2020 only (openssl ca takes a start and an end date)
    ca.mkdir()
    (ca / "index.txt").write_text("")
    (ca / "serial").write_text("01\n")
    (ca / "ca.cnf").write_text(
        "[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\nnew_certs_dir = .\nserial = serial\n"
        "default_md = sha256\nunique_subject = no\npolicy = p\n[p]\ncommonName = supplied\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    sign = ["ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key", "-in", "old.csr"]
    for argv in (
        ["req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=ca"],
        ["req", *ec, "-keyout", "old.key", "-out", "old.csr", "-subj", "/CN=old"],
        [*sign, "-out", "old.pem", "-notext", "-startdate", "20200101000000Z", "-enddate", "20210101000000Z"],
    ):
        subprocess.run(["openssl", *argv], cwd=ca, check=True, capture_output=True)
    shutil.copy(ca / "old.pem", secrets / "server.pem")
    before = {f.name: f.read_bytes() for f in secrets.iterdir()}
    again = subprocess.run(["sh", script, str(secrets), "ps-0"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "kept" not in again.stdout, (again.stdout, again.stderr)
    assert f"{secrets}/server.pem expired (Jan  1 00:00:00 2021 GMT)" in again.stderr, again.stderr
    assert f"remove {secrets}, run this again and restart every server and worker" in again.stderr, again.stderr
    assert {f.name: f.read_bytes() for f in secrets.iterdir()} == before


@pytest.mark.parametrize("missing", [["client.pem"], ["client.key"], ["client.pem", "client.key"]])
def test_gen_secrets_run_again_over_secrets_without_the_client_certificate_refuses_and_changes_nothing(
    tmp_path, missing
):
    """The CA's key is not kept, so a client certificate or key removed from kept secrets cannot be made again: a
    run over them fails naming the file missing, changes none of the rest, and does not say "kept"."""
    script, secrets = os.path.join(DEPLOY, "gen-secrets.sh"), tmp_path / "s"
    made = subprocess.run(["sh", script, str(secrets), "ps-0"], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    for name in missing:
        (secrets / name).unlink()
    before = {f.name: f.read_bytes() for f in secrets.iterdir()}
    again = subprocess.run(["sh", script, str(secrets), "ps-0"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "kept" not in again.stdout, (again.stdout, again.stderr)
    assert f"error: {secrets} holds the servers' secrets (token, ca.pem, server.pem, server.key) but no {missing[0]}:" in (
        again.stderr), again.stderr  # fmt: skip
    assert f"nothing was changed; to make a new set, remove {secrets}," in again.stderr, again.stderr
    assert {f.name: f.read_bytes() for f in secrets.iterdir()} == before


def test_gen_secrets_refuses_a_client_certificate_alone_as_part_of_a_set(tmp_path):
    """A DIR holding only a client certificate is part of a set: refused, not written over."""
    secrets = tmp_path / "s"
    secrets.mkdir()
    (secrets / "client.pem").write_text("kept\n")
    made = subprocess.run(["sh", os.path.join(DEPLOY, "gen-secrets.sh"), str(secrets), "ps-0"], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert made.returncode == 1 and "holds part of a set of secrets (client.pem," in made.stderr, made.stderr
    assert [f.name for f in secrets.iterdir()] == ["client.pem"] and (secrets / "client.pem").read_text() == "kept\n"


def san_entries(names: list[str]) -> list[str]:
    """What gen-secrets.sh's san_of says of each name, in one shell: its entry (DNS:... or IP:...) or "error"."""
    with open(os.path.join(DEPLOY, "gen-secrets.sh")) as f:
        script = f.read()
    functions = script[: script.index("[ $# -ge 1 ]")]  # the script up to its argument check: its functions
    loop = 'for n; do san_of "$n" 2>/dev/null || echo error; done'
    out = subprocess.run(["sh", "-c", f"{functions}\n{loop}", "sh", *names], capture_output=True, text=True,
                         timeout=60, check=True).stdout  # fmt: skip
    return out.splitlines()


HOST_LABEL = r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)"  # RFC 1123's, and '_' (Docker Compose service names)


def san_oracle(name: str) -> str:
    """The entry a NAME should get: Python's ipaddress judges addresses (a zone, %eth0, is refused: openssl
    takes none); a host name, with some character not a digit or dot, is HOST_LABELs joined by single dots, '*.'
    before them for a wildcard, 253 characters at most."""
    import ipaddress

    if ":" in name or re.fullmatch(r"[0-9.]*", name):
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return "error"
        return "error" if "%" in name else f"IP:{name}"
    host = re.fullmatch(rf"(\*\.)?{HOST_LABEL}(\.{HOST_LABEL})*", name) and len(name) <= 253
    return f"DNS:{name}" if host else "error"


def test_gen_secrets_judges_each_name_as_pythons_ipaddress_does():
    """san_of against an oracle: chosen names (addresses out of range, a port left on, leading zeros, each IPv6
    form) and 3000 random strings over the characters addresses are made of."""
    import random

    chosen = ["300.1.1.1", "ps-0:50051", "1.2.3", "1.2.3.4.5", "01.2.3.4", "255.255.255.255", "256.0.0.0", "0.0.0.0",
              "1.2.3.4.", ".1.2.3.4", "1..2.3", "", "a,b", "a b", "ps-0", "*.sparseps", "ps_0", "::", "::1", "1::",
              "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8", "1::2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8:9",
              ":1:2:3:4:5:6:7", "1:2:3:4:5:6:7:", "1:::2", "1::2::3", "12345::", "fe80::1%eth0", "::ffff:10.1.2.3",
              "::ffff:01.1.2.3", "1:2:3:4:5:6:1.2.3.4", "1:2:3:4:5:6:7:1.2.3.4", "::1.2.3.4:5", "1.2.3.4::", "g::1",
              "ABCD:ef01::", "-ps", "ps-", "a..b", "ps-0.", ".ps-0", "a.-b", "a-.b", "*", "*.", "a.*.b", "*.*.b",
              "a*b", "*a.b", "x" * 63, "x" * 64, "a." + "x" * 64, ".".join(["x" * 63] * 4),
              ".".join(["x" * 63] * 3 + ["x" * 61]), "1.2.3.a", "p--s"]  # fmt: skip
    rng = random.Random(0)
    fuzz = ["".join(rng.choice("0123459af:.") for _ in range(rng.randint(1, 16))) for _ in range(3000)]
    pieces = ["a", "b0", "-", "_", ".", "*", "*.", "x" * 60]  # host names: long labels and wildcards among them
    fuzz += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 8))) for _ in range(3000)]
    names = chosen + fuzz
    got = san_entries(names)
    assert len(got) == len(names)
    wrong = [(n, g, san_oracle(n)) for n, g in zip(names, got, strict=True) if g != san_oracle(n)]
    assert wrong == [], wrong[:10]
    addresses, hosts = got[len(chosen) : len(chosen) + 3000], got[len(chosen) + 3000 :]
    assert sum(g != "error" for g in addresses) > 100  # the fuzz reaches valid addresses too
    assert sum(g.startswith("DNS:") for g in hosts) > 100 and "error" in hosts  # and host names, either way


def test_gen_secrets_writes_every_address_it_accepts_into_the_certificate(tmp_path):
    """Random IPv6 addresses in compressed, exploded and IPv4-mapped forms, which san_of accepts, are ones openssl
    takes as well: one run names them all in the server certificate."""
    import ipaddress
    import random

    rng = random.Random(1)
    addresses = [ipaddress.IPv6Address(rng.getrandbits(128) >> rng.choice([0, 32, 64, 96])) for _ in range(10)]
    names = [a.compressed for a in addresses] + [addresses[0].exploded, f"::ffff:{ipaddress.IPv4Address(7 << 24)}"]
    assert set(san_entries(names)) == {f"IP:{n}" for n in names}
    made = subprocess.run(["sh", os.path.join(DEPLOY, "gen-secrets.sh"), str(tmp_path / "s"), *names],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert made.returncode == 0, made.stderr
    san = subprocess.run(["openssl", "x509", "-in", str(tmp_path / "s" / "server.pem"), "-noout", "-ext",
                          "subjectAltName"], capture_output=True, text=True, check=True).stdout  # fmt: skip
    named = {ipaddress.ip_address(n.strip().removeprefix("IP Address:")) for n in san.splitlines()[-1].split(",")
             if n.strip().startswith("IP Address:")}  # fmt: skip
    assert {ipaddress.ip_address(n) for n in names} <= named, san


@pytest.mark.parametrize("bad", ["300.1.1.1", "ps-0:50051", "a,IP:10.9.9.9", "-foo", "a..b", "ps-0-"])
def test_gen_secrets_refuses_a_name_that_is_no_address_nor_host_name_and_writes_nothing(tmp_path, bad):
    """A NAME openssl would refuse (300.1.1.1; a port left on), that would smuggle in an entry (a comma) or that is
    no host name by RFC 1123 (a label starting or ending with '-', an empty one) fails, naming it, before DIR is
    made."""
    secrets = tmp_path / "s"
    made = subprocess.run(["sh", os.path.join(DEPLOY, "gen-secrets.sh"), str(secrets), "ps-0", bad],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert made.returncode == 1 and f"NAME '{bad}' is neither a host name" in made.stderr, made.stderr
    assert not secrets.exists()


def test_gen_secrets_shows_what_openssl_said_when_it_fails_and_leaves_no_part_of_a_set(tmp_path):
    """openssl failing part way (here its client certificate, after the CA and the server's were made) is shown
    with openssl's own words, and DIR holds none of the files: a run after it makes the whole set."""
    shim = tmp_path / "bin"
    shim.mkdir()
    real = shutil.which("openssl")
    (shim / "openssl").write_text('#!/bin/sh\ncase "$*" in *sparseps-client*) echo "shim: no entropy" >&2; exit 1 ;;'
                                  f' esac\nexec {real} "$@"\n')  # fmt: skip
    (shim / "openssl").chmod(0o755)
    secrets, script = tmp_path / "s", os.path.join(DEPLOY, "gen-secrets.sh")
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}
    failed = subprocess.run(["sh", script, str(secrets), "ps-0"], capture_output=True, text=True, timeout=60, env=env)
    assert failed.returncode == 1, failed.stderr
    assert "error: openssl req failed" in failed.stderr and "shim: no entropy" in failed.stderr, failed.stderr
    assert list(secrets.iterdir()) == []
    again = subprocess.run(["sh", script, str(secrets), "ps-0"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "written" in again.stdout, again.stderr
    assert {f.name for f in secrets.iterdir()} == {"token", "ca.pem", "server.pem", "server.key", "client.pem",
                                                   "client.key"}  # fmt: skip


# `docker-compose help` of Compose v1 (1.29), the only Compose in Debian bookworm: the commands an operator can
# run there. v2 (`docker compose`) has these and more (cp, ls, ...), which v1 answers with "No such command".
COMPOSE_V1_COMMANDS = {"build", "config", "create", "down", "events", "exec", "help", "images", "kill", "logs",
                       "pause", "port", "ps", "pull", "push", "restart", "rm", "run", "scale", "start", "stop", "top",
                       "unpause", "up", "version"}  # fmt: skip


def compose_commands(text: str) -> list[str]:
    """The Compose subcommands the commands in text run: `docker compose` or `docker-compose` where a command
    starts (a line, a code span, after `$(`, `;`, `&&`, `|`, or VAR=value settings), its options (-f FILE, -p NAME,
    --profile NAME, or "..." standing for them), then the subcommand."""
    start = r"(?:^|[`#(;&|])\s*(?:[A-Z_]+=\S*\s+)*"
    options = r"(?:\s+(?:(?:-f|-p|--profile)\s+\S+|\.\.\.))*"
    return re.findall(rf"{start}(?:docker compose|docker-compose){options}\s+([a-z][a-z-]*)", text, re.M)


def test_every_compose_command_in_the_docs_runs_under_compose_v1():
    """The docs, README and the compose files' comments give Compose commands the operator runs by hand; Debian
    bookworm has only Compose v1 (docs/docker.md), so each must be one v1 has."""
    assert compose_commands("x=$(docker compose -f a.yml -p x ps -q ps-0); `A=1 docker-compose ... up -d`") == [
        "ps",
        "up",
    ]
    assert compose_commands("installs docker.io, docker-compose and debootstrap") == []  # a log line, no command
    root = os.path.dirname(DEPLOY)
    files = ["README.md", "docs/docker.md", "deploy/docker-compose.yml", "deploy/docker-compose.host.yml"]
    seen = []
    for name in files:
        with open(os.path.join(root, name)) as f:
            text = f.read()
        # prose names the tools too ("`docker-compose` (v1)"): only code spans and blocks, and the compose files'
        # comments, hold commands
        code = re.findall(r"```.*?```|`[^`]+`", text, re.S) if name.endswith(".md") else re.findall(r"#.*", text)
        for command in compose_commands("\n".join(code)):
            seen.append(command)
            assert command in COMPOSE_V1_COMMANDS, f"{name}: `compose {command}` is not a Compose v1 command"
    assert {"up", "run", "exec", "ps"} <= set(seen), seen  # the scan finds the commands the docs do give


def exact_sum_pusher():
    """deploy/exact_sum_pusher.py, the check deploy/smoke.sh runs against the cluster in containers."""
    spec = importlib.util.spec_from_file_location("exact_sum_pusher", os.path.join(DEPLOY, "exact_sum_pusher.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_exact_sum_pusher_finds_a_lost_and_a_doubled_push():
    pusher = exact_sum_pusher()
    tables = InProcessTables()
    try:
        tables.create_table(TableConfig("s", pusher.DIM, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0)))
        for k in range(1, 6):
            pusher.push(tables, "s", k)
        assert pusher.check(tables, "s", 5) == []
        assert tables.pull("s", pusher.SHARED[:1]).tolist() == [[-5.0, -10.0, -15.0, -20.0]]
        lost = pusher.check(tables, "s", 6)  # as if push 6 had been acknowledged and then lost
        assert any("push 6 " in w for w in lost) and any("shared rows differ" in w for w in lost)
        pusher.push(tables, "s", 3)  # push 3 applied twice
        doubled = pusher.check(tables, "s", 5)
        assert any("push 3 " in w and "-2.0" in w for w in doubled), doubled
    finally:
        tables.close()


def docker_engine_answers() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0
    except subprocess.TimeoutExpired:  # a daemon that does not answer within a minute is not one to test against
        return False


@pytest.mark.skipif(
    not docker_engine_answers(), reason="no Docker engine answers `docker info` (deploy/smoke.sh starts one as root)"
)
def test_the_smoke_script_builds_and_runs_the_cluster_in_containers():
    """deploy/smoke.sh against the running engine: images built, the host-network cluster trained, ps-1 killed
    and restarted, no acknowledged push lost (several minutes)."""
    done = subprocess.run(["bash", os.path.join(DEPLOY, "smoke.sh")], capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "no acknowledged push lost or doubled" in done.stdout and "PASSED" in done.stdout
    assert done.stdout.count("within 0.02") == 2


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
               .replace("/home/sparseps/", f"{tmp_path}/{name}-")  # each container's own file
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
        create = local(services["create-tables"]["command"], "create-tables")
        setup = subprocess.run(create, env=env_of("create-tables"), capture_output=True, text=True, timeout=120)
        assert setup.returncode == 0 and "created tables deepfm" in setup.stdout, setup.stderr
        workers = [subprocess.Popen(local(services[n]["command"], n), env=env_of(n), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for n in ("worker-0", "worker-1")]  # fmt: skip
        for i, w in enumerate(workers):
            out, err = w.communicate(timeout=300)
            assert w.returncode == 0, err
            assert f"worker {i}/2" in out and "on 10,000 examples" in out and "eval   AUC" in out
            assert json.loads((tmp_path / f"worker-{i}-position.json").read_text())["finished"] is True
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
