#!/usr/bin/env bash
# The CUDA checks, on a machine with an NVIDIA GPU and a CUDA build of torch; run from the repository root:
#     bash tests/gpu_check.sh
# python3 must have the project's dependencies; wheels of the missing ones in .whl/ are installed into /tmp/site
# first (a machine with no package index). Logs and figures go to $OUT (default /tmp/gpu_check).
#   1. the tests marked gpu: every model's CUDA forward and backward against numpy, dropout replayed by seed, and a
#      numpy worker then a torch:cuda worker leaving on the servers the model two numpy workers leave
#   2. a mixed job: a numpy worker and a CUDA worker training one DeepFM at once (ps-worker launch)
#   3. examples/s of one torch worker on the CPU and on the GPU, on the same data and model
set -u -o pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
status=0
nvidia-smi -L
python3 -c "import torch, numpy, numba, grpc, google.protobuf, rocksdict; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '-', 'numpy', numpy.__version__, 'numba', numba.__version__, 'grpc', grpc.__version__, 'protobuf', google.protobuf.__version__)" || exit 1
echo "== 1. tests marked gpu"
timeout 300 python3 -m pytest -p no:cacheprovider -m gpu -v -rs tests/test_models.py tests/integration/test_mixed.py 2>&1 | tee "$OUT/pytest.log" || status=1
echo "== 2. a numpy worker and a CUDA worker at once"
timeout 240 python3 -m worker launch --workers 2 --backends numpy,torch:cuda --local-shards 2 --model deepfm --synthetic-rows 400000 \
    --no-progress --metrics-out "$OUT/mixed.json" 2>&1 | tee "$OUT/mixed.log" || status=1
echo "== 3. one torch worker: cpu, then cuda"
for device in cpu cuda; do
    timeout 200 python3 -m worker train --local-shards 2 --backend torch --device "$device" --model deepfm --hidden 400,400,400 \
        --synthetic-rows 400000 --batch-size 4096 --no-progress --metrics-out "$OUT/speed-$device.json" 2>&1 | tee "$OUT/speed-$device.log" || status=1
done
echo "== gpu_check exit $status"
exit $status
