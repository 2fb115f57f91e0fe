#!/bin/bash
# The smoke test's cluster as bare processes on this host, for comparing examples/s with the containers
# (docs/docker.md): the same commands as docker-compose.yml + docker-compose.host.yml (2 servers on
# 127.0.0.1:5000 and :5001 with TLS and the token, create-tables, 2 numpy workers on the same synthetic data),
# secrets from deploy/gen-secrets.sh, data in a temporary directory; no kill. Prints each worker's figures and
# stops the servers it started, by pid.
#   deploy/bare-run.sh              (PYTHON: an interpreter with sparseps installed, default ./.venv/bin/python)
# Environment: SMOKE_ROWS=600000 SMOKE_EVAL_ROWS=50000, as deploy/smoke.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-$(dirname "$here")/.venv/bin/python}
work=$(mktemp -d /tmp/sparseps-bare.XXXXXX)
servers=()
cleanup() {
    local pid
    for pid in "${servers[@]}"; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
t_up=$(date +%s.%N)  # as deploy/smoke.sh's 'compose up': secrets, servers, create-tables, workers
sh "$here/gen-secrets.sh" "$work/secrets" ps-0 ps-1 >/dev/null
for i in 0 1; do
    "$python" -m ps --shard-id "$i" --num-shards 2 --data-dir "$work/data-$i" --host 127.0.0.1 --port "500$i" \
        --metrics-port "910$i" --tls-cert "$work/secrets/server.pem" --tls-key "$work/secrets/server.key" \
        --auth-token-file "$work/secrets/token" --checkpoint-root "$work/checkpoints" >"$work/ps-$i.log" 2>&1 &
    servers+=($!)
done
export PS_TLS_CA=$work/secrets/ca.pem PS_AUTH_TOKEN_FILE=$work/secrets/token PS_SERVERS=127.0.0.1:5000,127.0.0.1:5001
for i in 0 1; do
    for _ in $(seq 240); do grep -q 'listening on' "$work/ps-$i.log" && break; sleep 0.25; done
    "$python" -m ps health "127.0.0.1:500$i" --tls-ca "$PS_TLS_CA" >/dev/null || { cat "$work/ps-$i.log"; exit 1; }
done
"$python" -m worker train --model deepfm --create-tables-only >/dev/null
export PS_MODEL=deepfm PS_NUM_WORKERS=2 PS_JOB_ID="bare-run-$$" PS_NO_PROGRESS=true PS_SERVER_TIMEOUT=600 PS_RECIPE=large \
    PS_SYNTHETIC_ROWS=${SMOKE_ROWS:-600000} PS_SYNTHETIC_EVAL_ROWS=${SMOKE_EVAL_ROWS:-50000}
workers=()
for i in 0 1; do
    "$python" -m worker train --worker-id "$i" --metrics-port "920$i" --metrics-out "$work/worker-$i.json" \
        >"$work/worker-$i.log" 2>&1 &
    workers+=($!)
done
until curl -sf http://127.0.0.1:9200/metrics 2>/dev/null | grep -E '^sparseps_worker_steps_total [1-9]' >/dev/null; do
    kill -0 "${workers[0]}" 2>/dev/null || break
    sleep 0.25
done
echo "bare: first training step $(awk -v a="$t_up" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s after the start (secrets, servers, create-tables, workers)"
for i in 0 1; do
    wait "${workers[$i]}" || { cat "$work/worker-$i.log"; echo "bare: worker-$i failed" >&2; exit 1; }
    grep -E 'trained|eval   AUC|oracle AUC' "$work/worker-$i.log" | sed "s/^/bare: worker-$i: /"
done
