#!/usr/bin/env bash
# The CUDA checks, on a machine with an NVIDIA GPU and a CUDA build of torch; run from the repository root:
#     bash tests/gpu_check.sh [STEP ...]        (the steps below by number; default: all)
# The Python is $PYTHON, else the checkout's venv (.venv/bin/python, made by `python3 dev.py env`, with a CUDA
# build of torch installed into it), else python3; it must have the project's dependencies: wheels of the missing
# ones in .whl/ are installed into /tmp/site first (a machine with no package index). It stops (exit 1) before
# any step when that Python cannot import the project or torch sees no GPU. Logs and figures go to $OUT
# (default /tmp/gpu_check).
#   1. the tests marked gpu: every model's CUDA forward and backward against numpy (bags over two tables; one table
#      and one id per field), dropout replayed by seed, a group of one on nccl (--dense allreduce's collectives),
#      and a numpy worker then a torch:cuda worker leaving on the servers the model two numpy workers leave
#   2. a mixed job: a numpy worker and a CUDA worker training one DeepFM at once (ps-worker launch)
#   3. examples/s of one torch worker on the CPU and on the GPU, on the same data and model
#   4. --dense allreduce on CUDA: one worker (a group of one, on nccl); on a one-GPU machine, a launch of two cuda
#      allreduce workers is refused before anything starts
set -u -o pipefail
OUT=${OUT:-/tmp/gpu_check}
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
PY=${PYTHON:-$PY}
steps=" ${*:-1 2 3 4} "
for step in $steps; do
    case $step in 1|2|3|4) ;; *) echo "gpu_check: no step $step (the steps are 1 2 3 4)" >&2; exit 2 ;; esac
done
want() { [[ "$steps" == *" $1 "* ]]; }
mkdir -p "$OUT"
if [ -d .whl ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
status=0
nvidia-smi -L
# every module the steps run imported first (a missing package, or one older than the generated code needs, is
# named here and not inside a step's log), and a GPU torch sees: without one every gpu test would skip and pass
"$PY" - "$PY" <<'EOF' || exit 1
import sys

try:
    import google.protobuf, grpc, numba, numpy, pytest, torch
    import protos.ps_pb2_grpc, ps.server, worker.launch, worker.train  # noqa: F401
except Exception as e:  # ImportError, or the generated code's version check
    sys.exit(f"gpu_check: {sys.argv[1]} cannot run the project: {type(e).__name__}: {e} (wheels of what it lacks "
             "in .whl/ are installed first)")
print("torch", torch.__version__, "numpy", numpy.__version__, "numba", numba.__version__, "grpc", grpc.__version__,
      "protobuf", google.protobuf.__version__, "pytest", pytest.__version__)
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device here: nothing to check")
print("cuda", torch.version.cuda, torch.cuda.device_count(), "GPU(s):", torch.cuda.get_device_name())
EOF
if want 1; then
echo "== 1. tests marked gpu"
timeout 300 "$PY" -m pytest -p no:cacheprovider -m gpu -v -rs tests/test_models.py tests/test_allreduce.py \
    tests/integration/test_mixed.py 2>&1 | tee "$OUT/pytest.log" || status=1
fi
if want 2; then
echo "== 2. a numpy worker and a CUDA worker at once"
timeout 240 "$PY" -m worker launch --workers 2 --backends numpy,torch:cuda --local-shards 2 --model deepfm --synthetic-rows 1000000 \
    --no-progress --metrics-out "$OUT/mixed.json" 2>&1 | tee "$OUT/mixed.log" || status=1
fi
if want 3; then
echo "== 3. one torch worker: cpu, then cuda"
for device in cpu cuda; do
    timeout 200 "$PY" -m worker train --local-shards 2 --backend torch --device "$device" --model deepfm --hidden 400,400,400 \
        --synthetic-rows 400000 --batch-size 4096 --no-progress --metrics-out "$OUT/speed-$device.json" 2>&1 | tee "$OUT/speed-$device.log" || status=1
done
fi
if want 4; then
echo "== 4. --dense allreduce on cuda"
timeout 200 "$PY" -m worker train --local-shards 1 --backend torch --device cuda --dense allreduce --model deepfm \
    --synthetic-rows 100000 --no-progress 2>&1 | tee "$OUT/allreduce.log" || status=1
if [ "$("$PY" -c 'import torch; print(torch.cuda.device_count())')" = 1 ]; then
    timeout 100 "$PY" -m worker launch --workers 2 --backends torch:cuda --dense allreduce --local-shards 1 \
        --model deepfm --synthetic-rows 100000 --no-progress > "$OUT/allreduce-2.log" 2>&1
    code=$?
    cat "$OUT/allreduce-2.log"
    if [ $code = 2 ] && grep -q "torch sees 1 GPU here" "$OUT/allreduce-2.log"; then
        echo "refused as expected (exit 2)"
    else
        echo "expected exit 2 and a refusal naming 1 GPU, got exit $code"; status=1
    fi
fi
fi
echo "== gpu_check exit $status"
exit $status
