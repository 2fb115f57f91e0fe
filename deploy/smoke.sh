#!/bin/bash
# The Docker deployment, built and run end to end on one machine (docs/docker.md):
#   1. a Docker engine: the one running, else (as root) Debian's docker.io installed and started with no bridge and
#      no firewall, routing or sysctl changes; stopped again at the end, by pid
#   2. the base image: python:3.11-slim from Docker Hub, else deploy/base-image.sh builds local/python:3.11 from the
#      host's Debian mirror (the air-gapped path)
#   3. the project's image (deploy/Dockerfile), with host networking
#   4. the compose cluster with host networking (docker-compose.yml + docker-compose.host.yml): the secrets job,
#      2 servers on 127.0.0.1:5000 and :5001, create-tables, 2 CPU workers on synthetic data with a planted model
#   5. from the host: the servers healthy, their metrics over HTTPS with the token (401 without), no network but
#      host and none
#   6. mid-training, an exact-sum pusher (deploy/exact_sum_pusher.py) runs beside the workers and ps-1's main
#      process is killed with SIGKILL from the host; the restart policy brings ps-1 back, healthy
#   7. the workers finish (exit 0, not restarted) with eval AUC within 0.02 of the planted model's, and the pusher
#      finds the exact sum of every push the servers acknowledged
#   8. everything torn down (containers, volumes, what the script started); exit 0 only if every check passed
# Every failure prints "smoke: FAILED: <what>" and exits 1.
#   deploy/smoke.sh                  (as root; `sudo deploy/smoke.sh` where you are not)
# Environment:
#   SMOKE_ROWS=600000 SMOKE_EVAL_ROWS=50000   synthetic training rows (shared by the 2 workers), eval rows
#   SMOKE_TORCH=""         TORCH build argument (deploy/Dockerfile); cpu: the workers train with --backend torch
#   SMOKE_TORCH_WHEELS=DIR a directory holding a torch CPU wheel, served on 127.0.0.1 to the build (where
#                          download.pytorch.org cannot be reached); with SMOKE_TORCH=cpu
#   SMOKE_KILL=1           0: no kill and no pusher (a clean run, for the examples/s figure)
#   SMOKE_BASE=IMAGE       the base image, skipping step 2's choice
#   SMOKE_KEEP_ENGINE=0    1: leave an engine this script started running (its pids are printed)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
rows=${SMOKE_ROWS:-600000}
eval_rows=${SMOKE_EVAL_ROWS:-50000}
torch=${SMOKE_TORCH:-}
wheels=${SMOKE_TORCH_WHEELS:-}
kill_server=${SMOKE_KILL:-1}
project=sparsepssmoke
image=sparseps:smoke
work=$(mktemp -d /tmp/sparseps-smoke.XXXXXX)
started_containerd="" started_dockerd="" wheel_server="" compose_up=""
t_start=$(date +%s)

say() { echo "smoke: [$(($(date +%s) - t_start))s] $*"; }
fail() {
    echo "smoke: FAILED: $*" >&2
    exit 1
}
elapsed_since() { echo $(($(date +%s) - $1)); }

compose() {
    "${compose_cmd[@]}" -p "$project" -f "$here/docker-compose.yml" -f "$here/docker-compose.host.yml" \
        -f "$work/smoke.yml" "$@"
}
declare -A ids  # service -> container id (the same across restarts), once the cluster is up
remember_ids() {
    local service
    for service in "$@"; do
        ids[$service]=$(compose ps -a -q "$service")
        [ -n "${ids[$service]}" ] || fail "no container for $service"
    done
}
cid() { echo "${ids[$1]}"; }
state() { docker inspect -f "{{$2}}" "$(cid "$1")"; }
now() { date +%s.%N; }
seconds_between() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
seconds_since() { seconds_between "$1" "$(now)"; }
logs_have() { [[ $(docker logs "$1" 2>&1) == *"$2"* ]]; }
# a server's ps-server process, as the host sees it: the child of the container's PID 1, docker-init (init: true)
server_pid() {
    local pid
    pid=$(pgrep -P "$(state "$1" .State.Pid)" -f ps-server) || fail "no ps-server process in $1"
    [[ $pid =~ ^[0-9]+$ ]] || fail "more than one ps-server process in $1: $pid"
    echo "$pid"
}

cleanup() {
    local rc=$?
    set +e
    if [ -n "$compose_up" ]; then
        if [ "$rc" != 0 ]; then
            say "logs of the failed run (last 30 lines of each service):"
            compose logs --no-color --tail 30 2>&1 | sed 's/^/  /'
            docker logs --tail 30 "$project-pusher" 2>&1 | sed 's/^/  pusher | /'
        fi
        docker rm -f -v "$project-pusher" >/dev/null 2>&1
        compose down -v --remove-orphans >/dev/null 2>&1 && say "cluster torn down (containers and volumes)"
    fi
    [ -n "$wheel_server" ] && kill "$wheel_server" 2>/dev/null
    if [ -n "$started_dockerd" ] && [ "${SMOKE_KEEP_ENGINE:-0}" = 1 ]; then
        say "engine left running: dockerd pid $started_dockerd, containerd pid $started_containerd"
    elif [ -n "$started_dockerd" ]; then
        kill "$started_dockerd" 2>/dev/null
        for _ in $(seq 60); do kill -0 "$started_dockerd" 2>/dev/null || break; sleep 1; done
        if [ -n "$started_containerd" ]; then
            kill "$started_containerd" 2>/dev/null
            for _ in $(seq 30); do kill -0 "$started_containerd" 2>/dev/null || break; sleep 1; done
        fi
        mountpoint -q /run/docker/netns/default 2>/dev/null && umount /run/docker/netns/default
        say "engine stopped (dockerd pid $started_dockerd, containerd pid ${started_containerd:-none})"
    fi
    rm -rf "$work"
    if [ "$rc" = 0 ]; then say "PASSED in $(elapsed_since "$t_start") s"; else echo "smoke: FAILED (exit $rc)" >&2; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- 1. the engine -------------------------------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || fail "no Docker engine answers and this is not root: start one, or run as root"
    if ! command -v dockerd >/dev/null || ! command -v containerd >/dev/null; then
        say "installing Debian's docker.io, docker-compose and debootstrap"
        apt-get update -q >"$work/apt.log" 2>&1 || { tail -n 20 "$work/apt.log"; fail "apt-get update"; }
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io docker-compose \
            debootstrap >>"$work/apt.log" 2>&1 || { tail -n 20 "$work/apt.log"; fail "apt-get install docker.io"; }
    fi
    mkdir -p /var/log/sparseps-smoke
    if [ ! -S /run/containerd/containerd.sock ]; then
        containerd >/var/log/sparseps-smoke/containerd.log 2>&1 &
        started_containerd=$!
        for _ in $(seq 30); do [ -S /run/containerd/containerd.sock ] && break; sleep 1; done
    fi
    # no bridge, no iptables rules, no forwarding or masquerading: the host's network is left as it is
    dockerd --containerd=/run/containerd/containerd.sock --iptables=false --ip6tables=false --bridge=none \
        --ip-forward=false --ip-masq=false --userland-proxy=false >/var/log/sparseps-smoke/dockerd.log 2>&1 &
    started_dockerd=$!
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { tail -n 20 /var/log/sparseps-smoke/dockerd.log; fail "dockerd did not start"; }
    say "started containerd (pid ${started_containerd:-already running}) and dockerd (pid $started_dockerd)"
fi
if docker compose version >/dev/null 2>&1; then
    compose_cmd=(docker compose)
elif command -v docker-compose >/dev/null; then
    compose_cmd=(docker-compose)
else
    [ "$(id -u)" = 0 ] || fail "neither 'docker compose' nor docker-compose is installed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker-compose >/dev/null 2>&1 ||
        fail "apt-get install docker-compose"
    compose_cmd=(docker-compose)
fi
for tool in curl awk pgrep; do
    package=${tool/pgrep/procps}
    command -v $tool >/dev/null || { [ "$(id -u)" = 0 ] && apt-get install -y -q "$package" >/dev/null 2>&1; } ||
        fail "needs $tool"
done
say "engine $(docker version -f '{{.Server.Version}}'), $("${compose_cmd[@]}" version --short 2>/dev/null || echo compose)"
for port in 5000 5001 9100 9101 9200 9201; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        fail "127.0.0.1:$port is in use; the host-network cluster needs ports 5000-5001, 9100-9101, 9200-9201"
    fi
done

# --- 2. the base image ---------------------------------------------------------------------------------------
base=${SMOKE_BASE:-}
if [ -z "$base" ]; then
    if timeout 60 docker pull -q python:3.11-slim >/dev/null 2>&1; then
        base=python:3.11-slim
    elif docker image inspect local/python:3.11 >/dev/null 2>&1; then
        base=local/python:3.11
        say "Docker Hub unreachable; using the base image built before from the Debian mirror ($base)"
    else
        say "Docker Hub unreachable; building the base image from the host's Debian mirror (deploy/base-image.sh)"
        t=$(date +%s)
        sh "$here/base-image.sh" local/python:3.11 | sed 's/^/  /' || fail "deploy/base-image.sh"
        base=local/python:3.11
        say "base image built in $(elapsed_since "$t") s"
    fi
fi

# --- 3. the project's image ----------------------------------------------------------------------------------
torch_arg=$torch
if [ -n "$wheels" ]; then
    [ "$torch" = cpu ] || fail "SMOKE_TORCH_WHEELS goes with SMOKE_TORCH=cpu"
    wheel=""
    for f in "$wheels"/torch-*+cpu-*.whl; do [ -e "$f" ] && wheel=$(basename "$f") && break; done
    [ -n "$wheel" ] || fail "no torch-*+cpu-*.whl in $wheels"
    python3 -m http.server --bind 127.0.0.1 --directory "$wheels" 8765 >"$work/wheels.log" 2>&1 &
    wheel_server=$!
    sleep 1
    version=${wheel#torch-}
    torch_arg="torch==${version%%-*} --find-links http://127.0.0.1:8765/"
fi
say "building $image from $base${torch_arg:+ with TORCH=$torch_arg}"
t=$(date +%s)
(cd "$root" && tar -c --exclude=__pycache__ pyproject.toml README.md protos ps worker deploy) |
    docker build --network host --build-arg "BASE=$base" --build-arg "TORCH=$torch_arg" -f deploy/Dockerfile \
        -t "$image" - >"$work/build.log" 2>&1 || { tail -n 30 "$work/build.log"; fail "docker build"; }
build_s=$(elapsed_since "$t")
if [ -n "$wheel_server" ]; then kill "$wheel_server" && wheel_server=""; fi
size_mb=$(($(docker image inspect -f '{{.Size}}' "$image") / 1000000))
say "image $image built in $build_s s: $size_mb MB"
[ -z "$torch" ] || docker run --rm --network host "$image" python3 -c 'import torch; assert not torch.version.cuda' ||
    fail "the image's torch is not a CPU build"

# --- 4. the cluster ------------------------------------------------------------------------------------------
mkdir -p "$work/out" && chmod 0777 "$work/out"  # the workers (uid 1000) write their figures here
backend=numpy
[ -z "$torch" ] || backend=torch
worker_env="{PS_SYNTHETIC_ROWS: \"$rows\", PS_SYNTHETIC_EVAL_ROWS: \"$eval_rows\", PS_RECIPE: large, PS_BACKEND: $backend}"
cat >"$work/smoke.yml" <<EOF
# smoke.sh's own settings over docker-compose.yml + docker-compose.host.yml
x-image: &image {image: "$image"}
services:
  secrets: *image
  ps-0: *image
  ps-1: *image
  create-tables:
    <<: *image
    environment: $worker_env
  worker-0:
    <<: *image
    environment: $worker_env
    volumes: ["$work/out:/out"]
    command: ["ps-worker", "train", "--worker-id", "0", "--metrics-port", "9200", "--metrics-out", "/out/worker-0.json"]
  worker-1:
    <<: *image
    environment: $worker_env
    volumes: ["$work/out:/out"]
    command: ["ps-worker", "train", "--worker-id", "1", "--metrics-port", "9201", "--metrics-out", "/out/worker-1.json"]
EOF
compose config -q || fail "the compose files do not validate"
compose down -v --remove-orphans >/dev/null 2>&1 || true  # what a run killed hard left behind
say "compose up: secrets, ps-0, ps-1, create-tables, worker-0, worker-1 (host networking; $rows rows, $backend)"
compose_up=1
t_up=$(now)
compose up -d --no-build >"$work/up.log" 2>&1 || { cat "$work/up.log"; fail "compose up"; }
remember_ids secrets ps-0 ps-1 create-tables worker-0 worker-1
first_step=""
for _ in $(seq 1200); do
    # grep reads all of its input (no -q): an early exit would fail the pipe under pipefail
    if curl -sf http://127.0.0.1:9200/metrics 2>/dev/null | grep -E '^sparseps_worker_steps_total [1-9]' >/dev/null; then
        first_step=$(seconds_since "$t_up")
        break
    fi
    [ "$(state worker-0 .State.Status)" = exited ] && break
    sleep 0.25
done
[ -n "$first_step" ] || fail "worker-0 made no training step"
say "first training step ${first_step} s after 'compose up'"

# --- 5. health, metrics and networks, from the host ---------------------------------------------------------
networks=$(docker network ls --format '{{.Name}}' | sort | tr '\n' ' ')
[ "$networks" = "host none " ] || fail "networks other than host and none exist: $networks"
secrets_cid=$(cid secrets)
for f in ca.pem token; do
    docker cp "$secrets_cid:/secrets/$f" "$work/$f" || fail "the secrets job wrote no $f"
done
token=$(cat "$work/token")
for i in 0 1; do
    [ "$(state "ps-$i" .State.Health.Status)" = healthy ] || fail "ps-$i is not healthy"
    docker run --rm --network host -v "${project}_secrets:/secrets:ro" "$image" \
        ps-server health "127.0.0.1:500$i" --tls-ca /secrets/ca.pem >/dev/null || fail "ps-server health 127.0.0.1:500$i"
    url=https://127.0.0.1:910$i/metrics
    code=$(curl -s -o /dev/null -w '%{http_code}' --cacert "$work/ca.pem" "$url")
    [ "$code" = 401 ] || fail "$url answered $code without the token, not 401"
    curl -sf --cacert "$work/ca.pem" -H "Authorization: Bearer $token" "$url" >"$work/metrics-$i.txt" ||
        fail "$url did not answer with the token"
    grep -q 'sparseps_requests_total{code="OK",method="PushBatch"}' "$work/metrics-$i.txt" ||
        fail "$url shows no PushBatch served"
done
say "ps-0 and ps-1 healthy (docker and 'ps-server health' from the host network); metrics over HTTPS: 401" \
    "without the token, PushBatch counts with it; networks: $networks"

# --- 6. the pusher and kill -9 of ps-1, mid-training ---------------------------------------------------------
if [ "$kill_server" = 1 ]; then
    docker run -d --name "$project-pusher" --network host -e PS_TLS_CA=/secrets/ca.pem \
        -e PS_AUTH_TOKEN_FILE=/secrets/token -v "${project}_secrets:/secrets:ro" -v "$work/out:/out" \
        -v "$here/exact_sum_pusher.py:/app/exact_sum_pusher.py:ro" "$image" \
        python3 /app/exact_sum_pusher.py 127.0.0.1:5000,127.0.0.1:5001 smoke_sum /out/stop-pusher 0.02 >/dev/null
    for _ in $(seq 240); do
        logs_have "$project-pusher" 'pushes acknowledged' && break
        sleep 0.5
    done
    logs_have "$project-pusher" 'pushes acknowledged' || fail "the pusher acknowledged no pushes"
    for w in worker-0 worker-1; do
        [ "$(state $w .State.Status)" = running ] || fail "$w ended before the kill: raise SMOKE_ROWS"
    done
    restarts=$(state ps-1 .RestartCount)
    # the server process itself, as the kernel's OOM killer or a crash would end it; docker-init, the
    # container's PID 1, then exits with its status
    pid=$(server_pid ps-1)
    kill -9 "$pid"
    t_kill=$(now)
    say "kill -9 $pid (ps-1's ps-server process, from the host) while both workers train and the pusher pushes"
    back=""
    for _ in $(seq 240); do
        if [ "$(state ps-1 .RestartCount)" -gt "$restarts" ] && [ "$(state ps-1 .State.Health.Status)" = healthy ]; then
            back=$(seconds_since "$t_kill")
            break
        fi
        sleep 0.5
    done
    [ -n "$back" ] || fail "ps-1 was not restarted healthy within 120 s of the kill"
    # awk reads to the end: a reader that stops at the first match (grep -m 1) leaves docker logs writing into a
    # closed pipe, and its SIGPIPE (exit 141) fails the pipeline under pipefail
    listening=$(docker logs -t --since "$t_kill" "$(cid ps-1)" 2>&1 | awk '/listening on/ && !seen {print $1; seen = 1}')
    [ -n "$listening" ] || fail "ps-1 did not say it was listening again"
    started=$(date -d "$(state ps-1 .State.StartedAt)" +%s.%N)
    new_pid=$(server_pid ps-1)
    say "ps-1 restarted by its restart policy (restart count $(state ps-1 .RestartCount), new pid" \
        "$new_pid): started $(seconds_between "$t_kill" "$started") s, listening" \
        "$(seconds_between "$t_kill" "$(date -d "$listening" +%s.%N)") s, healthy $back s after the kill"
    sleep 5  # more pushes after the restart
    touch "$work/out/stop-pusher"
    pusher_rc=$(docker wait "$project-pusher")
    pusher_out=$(docker logs "$project-pusher" 2>&1)
    echo "$pusher_out" | grep -E 'exact sum|is back after|is unavailable' | sed 's/^/  pusher | /'
    if [ "$pusher_rc" != 0 ] || [[ $pusher_out != *"exact sum OK"* ]]; then
        fail "the pusher's exact sum check failed (exit $pusher_rc)"
    fi
fi

# --- 7. the workers finish, and what they learned ------------------------------------------------------------
for w in worker-0 worker-1; do
    rc=$(timeout 1800 docker wait "$(cid $w)") || fail "$w did not finish within 30 minutes"
    [ "$rc" = 0 ] || fail "$w exited with $rc"
    [ "$(state $w .RestartCount)" = 0 ] || fail "$w was restarted $(state $w .RestartCount) times"
done
compose logs --no-color worker-0 worker-1 2>&1 | grep -E 'trained|eval   AUC|oracle AUC|is back after' |
    sed 's/^/  /'
docker run --rm -i --network none -v "$work/out:/out:ro" "$image" python3 - <<'EOF' || fail "the workers' eval AUC is not within 0.02 of the oracle's"
import json, sys
ok = True
for i in (0, 1):
    m = json.load(open(f"/out/worker-{i}.json"))
    gap = m["oracle_auc"] - m["eval_auc"]
    ok &= abs(gap) <= 0.02
    print(f"smoke: worker-{i}: eval AUC {m['eval_auc']:.4f}, oracle AUC {m['oracle_auc']:.4f}, gap {gap:+.4f} "
          f"({'within' if abs(gap) <= 0.02 else 'NOT within'} 0.02); {m['train_examples']:,} examples at "
          f"{m['examples_per_s']:,.0f} examples/s")
sys.exit(0 if ok else 1)
EOF
# a checkpoint of the trained model, written by the servers into their `checkpoints` volume (owned by the image's
# user: a volume Docker creates on a path the image lacks would be root's, and the save refused)
docker run --rm --network host -e PS_TLS_CA=/secrets/ca.pem -e PS_AUTH_TOKEN_FILE=/secrets/token \
    -v "${project}_secrets:/secrets:ro" -v "${project}_checkpoints:/checkpoints" "$image" \
    ps-worker checkpoint save /checkpoints/smoke \
    --servers 127.0.0.1:5000,127.0.0.1:5001 | sed 's/^/  /' || fail "ps-worker checkpoint save failed"
for i in 0 1; do
    docker exec "$(cid ps-$i)" test -f /checkpoints/smoke/manifest.json || fail "ps-$i sees no checkpoint manifest"
done
say "checkpoint saved into the servers' checkpoints volume"
if [ "$kill_server" = 1 ]; then
    say "training finished in containers, ps-1 back after kill -9, no acknowledged push lost or doubled"
else
    say "training finished in containers (no kill)"
fi
say "figures: image $size_mb MB, built in $build_s s (base $base), first step ${first_step} s after 'compose up'"
