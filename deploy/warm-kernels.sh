#!/bin/sh
# Compiles the numba kernels of a server's and a worker's common paths once, at image build time (deploy/Dockerfile),
# into NUMBA_CACHE_DIR, so that containers do not compile them when they start or recover (a minute or more on a
# busy host). Each step runs what a deployment runs first:
#   1. a server on 127.0.0.1 (a free port, no TLS) and a short training run against it: deepfm with the
#      large-data recipe (adagrad rows, adam MLP), the compose file's and manifests' default, and its eval;
#   2. kill -9 of that server and a restart on its data dir: the journal replay a crashed server runs;
#   3. a clean stop (SIGTERM): the flush of every dirty row.
# Kernels of other paths (ftrl, other models) are compiled on first use, as are all of them on a CPU other than
# the build host's (numba's cache is specific to the CPU).
#   sh deploy/warm-kernels.sh            needs ps-server and ps-worker on PATH; uses a temporary directory
set -eu
work=$(mktemp -d)
pid=""
trap 'if [ -n "$pid" ]; then kill -9 "$pid" 2>/dev/null || true; fi; rm -rf "$work"' EXIT

start_server() {  # sets pid and port; waits for "listening on 127.0.0.1:PORT"
    ps-server --data-dir "$work/data" --port 0 >"$work/server.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        port=$(sed -n 's/.* listening on 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$work/server.log")
        [ -n "$port" ] && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    cat "$work/server.log" >&2
    echo "warm-kernels.sh: the server did not start" >&2
    exit 1
}

start_server
(cd "$work" && ps-worker train --servers "127.0.0.1:$port" --model deepfm --recipe large --synthetic-rows 8192 \
    --synthetic-eval-rows 2048 --batch-size 512 --no-progress >"$work/train.log" 2>&1) ||
    { cat "$work/train.log" >&2; echo "warm-kernels.sh: training failed" >&2; exit 1; }
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
start_server  # replays the journal the killed server left
grep -q 'replayed' "$work/server.log" || { cat "$work/server.log" >&2; echo "warm-kernels.sh: no journal replay" >&2; exit 1; }
kill -TERM "$pid"
wait "$pid" || { cat "$work/server.log" >&2; echo "warm-kernels.sh: the server did not stop cleanly" >&2; exit 1; }
pid=""
echo "warm-kernels.sh: kernels cached in ${NUMBA_CACHE_DIR:-the default cache}"
